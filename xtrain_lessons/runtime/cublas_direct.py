"""cuBLAS's strided batched GEMM called directly (ctypes), so that a CUDA graph can record it (T07).

CuPy's binding of cuBLAS refuses every call while a stream captures a graph: its `setStream`
raises NotImplementedError("calling cuBLAS API during stream capture is currently unsupported";
CuPy 14's source says it waits for "a robust strategy to test the support conditions"). cuBLAS
itself records into graphs (NVIDIA's cuBLAS guide, "CUDA Graphs Support") when alpha and beta are
host values (captured by value) and the workspace is the user's, so that cuBLAS allocates nothing
during the capture. This module calls the library CuPy already loaded (found in /proc/self/maps)
through a handle of its own, with a workspace it owns:

    blas = direct_cublas()          # None where the library cannot be found (then use CuPy's binding)
    blas.gemm_strided_batched_ex(stream_ptr, transa, transb, m, n, k, alpha_ptr, A, a_type, lda, stride_a,
                                 B, b_type, ldb, stride_b, beta_ptr, C, c_type, ldc, stride_c, batch,
                                 compute_type, algo)

The arguments are cublasGemmStridedBatchedEx's (column-major; runtime/gpu_blas.py maps row-major
products onto it), with the stream instead of the handle.
"""

from __future__ import annotations

import ctypes
import threading

__all__ = ["direct_cublas", "DirectCublas", "WORKSPACE_BYTES"]

WORKSPACE_BYTES = 32 * 2**20  # what NVIDIA suggests for Hopper (32 MiB); smaller GPUs need less
_STATUS = {1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH", 11: "MAPPING_ERROR",
           13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED", 16: "LICENSE_ERROR"}
_lock = threading.Lock()
_instance: list = []


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what}: CUBLAS_STATUS_{_STATUS.get(status, status)}")


def _loaded_library() -> str | None:
    """The path of the libcublas CuPy loaded into this process (not libcublasLt), if any."""
    try:
        with open("/proc/self/maps") as f:
            paths = {line.split()[-1] for line in f if "libcublas.so" in line}
    except OSError:
        return None
    return next((p for p in sorted(paths) if "/libcublas.so" in p), None)


class DirectCublas:
    """A cuBLAS handle of our own on the library at `path`, with a workspace of WORKSPACE_BYTES."""

    def __init__(self, path: str, cupy):
        lib = ctypes.CDLL(path)
        v, i, ll, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_size_t
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(v)]
        lib.cublasSetStream_v2.argtypes = [v, v]
        lib.cublasSetWorkspace_v2.argtypes = [v, v, sz]
        lib.cublasGemmStridedBatchedEx.argtypes = [v, i, i, i, i, i, v, v, i, i, ll, v, i, i, ll, v, v, i, i, ll, i, i, i]
        for f in (lib.cublasCreate_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2,
                  lib.cublasGemmStridedBatchedEx):
            f.restype = i
        self.lib, self.handle = lib, v()
        _check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        self._workspace = cupy.empty(WORKSPACE_BYTES, dtype=cupy.uint8)  # kept: the graphs record its address
        self._stream = None

    def _use_stream(self, stream_ptr: int) -> None:
        if stream_ptr != self._stream:  # setStream puts the default workspace back: ours again after it
            _check(self.lib.cublasSetStream_v2(self.handle, stream_ptr or None), "cublasSetStream")
            _check(self.lib.cublasSetWorkspace_v2(self.handle, self._workspace.data.ptr, WORKSPACE_BYTES),
                   "cublasSetWorkspace")
            self._stream = stream_ptr

    def gemm_strided_batched_ex(self, stream_ptr, transa, transb, m, n, k, alpha, A, a_type, lda, stride_a, B,
                                b_type, ldb, stride_b, beta, C, c_type, ldc, stride_c, batch, compute, algo) -> None:
        self._use_stream(stream_ptr)
        _check(self.lib.cublasGemmStridedBatchedEx(self.handle, transa, transb, m, n, k, alpha, A, a_type, lda,
                                                   stride_a, B, b_type, ldb, stride_b, beta, C, c_type, ldc,
                                                   stride_c, batch, compute, algo), "cublasGemmStridedBatchedEx")


def direct_cublas(cupy):
    """The process's DirectCublas (made on first use), or None where libcublas cannot be found or
    loaded: the caller then uses CuPy's binding, which works everywhere but inside a capture.
    The CPU stand-in for CuPy brings its own (cupy.direct_cublas)."""
    own = getattr(cupy, "direct_cublas", None)
    if own is not None:
        return own()
    with _lock:
        if not _instance:
            from cupy_backends.cuda.libs import cublas  # noqa: F401, PLC0415 - makes CuPy load the library
            path = _loaded_library()
            try:
                _instance.append(DirectCublas(path, cupy) if path else None)
            except (OSError, AttributeError, RuntimeError):
                _instance.append(None)
        return _instance[0]
