"""cuBLAS's strided batched GEMM called directly (ctypes), so that a CUDA graph can record it (T07b).

CuPy's binding of cuBLAS refuses every call while a stream captures a graph: its `setStream`
raises NotImplementedError("calling cuBLAS API during stream capture is currently unsupported";
CuPy 14's source says it waits for "a robust strategy to test the support conditions"). cuBLAS
itself records into graphs (NVIDIA's cuBLAS guide, "CUDA Graphs Support") when alpha and beta are
host values (captured by value) and the workspace is the user's, so that cuBLAS allocates nothing
during the capture. This module calls the library CuPy already loaded, through handles of its own:

    blas = direct_cublas(cupy)      # None where the library cannot be found (then use CuPy's binding)
    blas.gemm_strided_batched_ex(stream_ptr, transa, transb, m, n, k, alpha_ptr, A, a_type, lda, stride_a,
                                 B, b_type, ldb, stride_b, beta_ptr, C, c_type, ldc, stride_c, batch,
                                 compute_type, algo)
    describe()                      # "cuBLAS 12.9.1 (/…/libcublas.so.12), CUDA runtime 12.9 …", or None

The arguments are cublasGemmStridedBatchedEx's (column-major; runtime/gpu_blas.py maps row-major
products onto it), with the stream instead of the handle.

Which library: the one CuPy uses. CuPy 14 loads libcublas when its binding is first imported
(cupy_backends/cuda/libs/__init__.py: cuda.pathfinder's load_nvidia_dynamic_lib("cublas"), then the
binding's own DT_NEEDED libcublas.so.<major>). This module imports that binding, then takes the
library pathfinder reports (its answer is cached: CuPy's own load) or else the one mapped into the
process (/proc/self/maps), provided it is libcublas.so.<major> for the major of the CUDA runtime CuPy
was built for (runtimeGetVersion() // 1000: cuBLAS 12.x ships with CUDA 12.x, 13.x with 13.x) and
cublasGetProperty says that major too. The path and the version are logged once (logger
"xtrain_lessons.runtime.cublas_direct"; `describe()` gives the line, which also notes a version other
than the one CuPy's own handle reports). No such library gives None, with the reason logged: CuPy's
binding then makes every product (graphs fall back to eager).

One handle per device, created with that device current (a handle belongs to the device current
at cublasCreate: cuBLAS guide, "cuBLAS context"). One workspace per stream, as PyTorch keeps one per
(handle, stream) (aten/src/ATen/cuda/CublasHandlePool.cpp) and as the cuBLAS guide advises for
concurrent streams ("Results reproducibility"): two streams never share one. Workspaces are plain
device allocations (cupy.cuda.Memory: no pool, so none is freed under a graph that recorded its
address) and are kept for the process's life. cuBLAS is thread-safe, but a handle's stream is shared
by every thread that uses it (cuBLAS guide, "Thread Safety"), so setting the stream and workspace and
enqueuing the GEMM happen under one lock per handle.

bf16 operands on a GPU below compute capability 8.0 (no bf16 tensor cores) are refused with one line
(UnsupportedOnThisGpu, a ValueError) before cuBLAS sees them.
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import threading

__all__ = ["direct_cublas", "DirectCublas", "WORKSPACE_BYTES", "UnsupportedOnThisGpu", "describe",
           "find_library", "bf16_refusal"]

WORKSPACE_BYTES = 32 * 2**20  # what NVIDIA suggests for Hopper (32 MiB); smaller GPUs need less
CUDA_R_16BF = 14
_STATUS = {1: "NOT_INITIALIZED", 3: "ALLOC_FAILED", 7: "INVALID_VALUE", 8: "ARCH_MISMATCH", 11: "MAPPING_ERROR",
           13: "EXECUTION_FAILED", 14: "INTERNAL_ERROR", 15: "NOT_SUPPORTED", 16: "LICENSE_ERROR"}
log = logging.getLogger(__name__)
_lock = threading.Lock()  # guards the two caches below
_library: list = []  # [(ctypes library or None, the logged line or the reason there is none)]
_handles: dict = {}  # device id -> DirectCublas or None
_MISSING = object()


class UnsupportedOnThisGpu(ValueError):
    """What this GPU cannot run (bf16 below sm_80), as one line naming the card and what to do."""


def _check(status: int, what: str) -> None:
    if status != 0:
        raise RuntimeError(f"{what}: CUBLAS_STATUS_{_STATUS.get(status, status)}")


def bf16_refusal(name: str, major: int, minor: int) -> str | None:
    """The one line refusing bf16 on a GPU of compute capability major.minor, or None (sm_80 and up)."""
    if major >= 8:
        return None
    return (f"bf16 needs bf16 tensor cores (compute capability 8.0 or newer: A100, A10, L4, RTX 30xx/40xx, H100, "
            f"...); this GPU, {name}, is sm_{major}{minor}: use --dtype fp16 or --dtype float32")


def find_library(major: int, maps: str | None = None) -> str | None:
    """The path of the libcublas.so.<major> mapped into this process (not libcublasLt), if any.
    `maps`: the text of /proc/self/maps (read when None)."""
    if maps is None:
        try:
            with open("/proc/self/maps") as f:
                maps = f.read()
        except OSError:
            return None
    paths = {line.split()[-1] for line in maps.splitlines() if "libcublas.so" in line and "/" in line}
    for path in sorted(paths):
        m = re.fullmatch(r"libcublas\.so\.(\d+)(\.[\d.]+)?", os.path.basename(path))
        if m and int(m.group(1)) == major:
            return path
    return None


def _library_version(lib) -> tuple[int, int, int]:
    """(major, minor, patch) from cublasGetProperty (no handle needed)."""
    lib.cublasGetProperty.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
    lib.cublasGetProperty.restype = ctypes.c_int
    parts = []
    for prop in (0, 1, 2):  # MAJOR_VERSION, MINOR_VERSION, PATCH_LEVEL (library_types.h)
        v = ctypes.c_int()
        _check(lib.cublasGetProperty(prop, ctypes.byref(v)), "cublasGetProperty")
        parts.append(v.value)
    return tuple(parts)


def _pathfinder_path(major: int) -> str | None:
    """Where cuda.pathfinder (CuPy 14's loader) found libcublas, if it is libcublas.so.<major>."""
    try:
        from cuda import pathfinder  # noqa: PLC0415 - CuPy 14's dependency; cached: CuPy's own load comes back
        path = pathfinder.load_nvidia_dynamic_lib("cublas").abs_path
    except Exception:  # noqa: BLE001 - no pathfinder (older CuPy), or it found nothing: look in the maps
        return None
    return path if path and find_library(major, f"0-0 r-xp 0 0:0 0 {path}") else None


def _load(cupy) -> tuple:
    """(the ctypes library or None, the line to log): CuPy's libcublas, checked (see the module doc)."""
    try:
        from cupy_backends.cuda.libs import cublas as cupy_cublas  # noqa: PLC0415 - CuPy loads its library
    except ImportError as e:
        return None, f"cuBLAS through CuPy's binding only: its cuBLAS binding does not import ({e})"
    runtime = cupy.cuda.runtime.runtimeGetVersion()
    major, cuda = runtime // 1000, f"CUDA runtime {runtime // 1000}.{runtime % 1000 // 10}"
    path = _pathfinder_path(major) or find_library(major)
    if path is None:
        return None, (f"cuBLAS through CuPy's binding only: no libcublas.so.{major} is loaded (CuPy "
                      f"{cupy.__version__}, {cuda})")
    try:
        lib = ctypes.CDLL(path)
        version = _library_version(lib)
    except (OSError, AttributeError, RuntimeError) as e:
        return None, f"cuBLAS through CuPy's binding only: {path} does not load as cuBLAS ({e})"
    text = ".".join(map(str, version))
    if version[0] != major:
        return None, f"cuBLAS through CuPy's binding only: {path} is cuBLAS {text}, CuPy uses the {cuda}"
    theirs = _cupy_cublas_version(cupy, cupy_cublas)
    ours = version[0] * 10000 + version[1] * 100 + version[2]  # CUBLAS_VERSION's encoding
    note = "" if theirs in (None, ours) else f"; CuPy's own handle reports version {theirs}"
    return lib, f"cuBLAS {text} ({path}), the library of CuPy {cupy.__version__} ({cuda}), called directly{note}"


def _cupy_cublas_version(cupy, cupy_cublas) -> int | None:
    """The version CuPy's own cuBLAS handle reports (cublasGetVersion), None if it cannot say."""
    try:
        return int(cupy_cublas.getVersion(cupy.cuda.device.get_cublas_handle()))
    except Exception:  # noqa: BLE001 - an older binding without getVersion: nothing to compare
        return None


class DirectCublas:
    """A cuBLAS handle of our own on `lib` for the current device (`device`), with a workspace of
    WORKSPACE_BYTES per stream; `cc` = (major, minor) compute capability, `name` the GPU's name."""

    def __init__(self, lib, cupy, device: int = 0, cc: tuple[int, int] = (8, 0), name: str = "this GPU"):
        v, i, ll, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_longlong, ctypes.c_size_t
        lib.cublasCreate_v2.argtypes = [ctypes.POINTER(v)]
        lib.cublasSetStream_v2.argtypes = [v, v]
        lib.cublasSetWorkspace_v2.argtypes = [v, v, sz]
        lib.cublasGemmStridedBatchedEx.argtypes = [v, i, i, i, i, i, v, v, i, i, ll, v, i, i, ll, v, v, i, i, ll, i, i, i]
        for f in (lib.cublasCreate_v2, lib.cublasSetStream_v2, lib.cublasSetWorkspace_v2,
                  lib.cublasGemmStridedBatchedEx):
            f.restype = i
        self.lib, self.cupy, self.handle = lib, cupy, v()
        self.device, self.cc, self.name = device, tuple(cc), name
        _check(lib.cublasCreate_v2(ctypes.byref(self.handle)), "cublasCreate")
        self._workspaces: dict = {}  # stream pointer -> device memory (kept: graphs record its address)
        self._stream = None  # the stream the handle is set to
        self._lock = threading.Lock()

    def _workspace(self, stream_ptr: int):
        if stream_ptr not in self._workspaces:
            self._workspaces[stream_ptr] = self.cupy.cuda.Memory(WORKSPACE_BYTES)
        return self._workspaces[stream_ptr]

    def _use_stream(self, stream_ptr: int) -> None:
        if stream_ptr != self._stream:  # setStream puts the default workspace back: this stream's again after it
            _check(self.lib.cublasSetStream_v2(self.handle, stream_ptr or None), "cublasSetStream")
            _check(self.lib.cublasSetWorkspace_v2(self.handle, self._workspace(stream_ptr).ptr, WORKSPACE_BYTES),
                   "cublasSetWorkspace")
            self._stream = stream_ptr

    def gemm_strided_batched_ex(self, stream_ptr, transa, transb, m, n, k, alpha, A, a_type, lda, stride_a, B,
                                b_type, ldb, stride_b, beta, C, c_type, ldc, stride_c, batch, compute, algo) -> None:
        if CUDA_R_16BF in (a_type, b_type):
            why = bf16_refusal(self.name, *self.cc)
            if why:
                raise UnsupportedOnThisGpu(why)
        with self._lock:  # the handle's stream is every thread's: set it and enqueue as one
            self._use_stream(stream_ptr)
            _check(self.lib.cublasGemmStridedBatchedEx(self.handle, transa, transb, m, n, k, alpha, A, a_type, lda,
                                                       stride_a, B, b_type, ldb, stride_b, beta, C, c_type, ldc,
                                                       stride_c, batch, compute, algo), "cublasGemmStridedBatchedEx")


def _device_facts(cupy, device: int) -> tuple[tuple[int, int], str]:
    props = cupy.cuda.runtime.getDeviceProperties(device)
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return (int(props["major"]), int(props["minor"])), name


def direct_cublas(cupy):
    """The current device's DirectCublas (made on first use), or None where CuPy's libcublas cannot
    be found, loaded or matched (see the module doc; the reason is logged once): the caller then uses
    CuPy's binding, which works everywhere but inside a capture. The CPU stand-in for CuPy brings its
    own (cupy.direct_cublas)."""
    own = getattr(cupy, "direct_cublas", None)
    if own is not None:
        return own()
    device = cupy.cuda.runtime.getDevice()
    found = _handles.get(device, _MISSING)  # every GEMM asks: no lock once the device has its handle
    if found is not _MISSING:
        return found
    with _lock:
        if not _library:
            _library.append(_load(cupy))
            log.info("%s", _library[0][1])
        if device not in _handles:
            lib = _library[0][0]
            try:
                cc, name = _device_facts(cupy, device)
                _handles[device] = DirectCublas(lib, cupy, device, cc, name) if lib is not None else None
            except (OSError, AttributeError, RuntimeError) as e:
                log.info("cuBLAS through CuPy's binding only on device %d: %s", device, e)
                _handles[device] = None
        return _handles[device]


def describe() -> str | None:
    """The line logged when the library was loaded (which cuBLAS, where, for which CUDA), or why
    CuPy's binding serves alone; None before the first GPU product."""
    return _library[0][1] if _library else None
