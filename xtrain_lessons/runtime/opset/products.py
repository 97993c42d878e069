"""Matrix products, the one route into a product on either device (phases T03, T07, T12).

    matmul(a, b, out=None)          a @ b: 2-D, stacked (..., M, K) @ (..., K, N), or a stack times
                                    one matrix (..., M, K) @ (K, N) (a linear layer)
    matmuls(*pairs, outs=None)      [a @ b for a, b in pairs] in one hand-over (a layer's dx and dW)

On a GPU every product is one cuBLAS strided batched GEMM in the storage dtype (gpu_blas.py). On
the CPU a 2-D product is cut into fixed chunks of rows that the engine's threads take one by one,
each chunk one `blas.gemm` call (MKL's sgemm when installed, else NumPy's BLAS; cpu_threads.py:
the same bits for any thread count); a stack times one matrix is one 2-D product of all its rows;
a stack of equal batch shapes is NumPy's batched matmul (BLAS per matrix). bf16 / fp16 operands on
the CPU: the float32 product of their values, rounded once (opset/lowp.py).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime import blas, cpu_threads, gpu_blas
from xtrain_lessons.runtime.device import on_gpu
from xtrain_lessons.runtime.opset import lowp
from xtrain_lessons.runtime.opset.casts import is_low
from xtrain_lessons.runtime.opset.table import op

__all__ = ["matmul", "matmuls"]


@op("products", cpu="cpu_threads.py: matmuls → blas.py: gemm", gpu="gpu_blas.py: matmul", reference="np.matmul",
    test="test_cpu_threads.py, test_blas.py, test_fake_cupy.py")
def matmul(a, b, out=None):
    """a @ b (see the module doc); `out` receives the result."""
    if on_gpu(a):
        return gpu_blas.matmul(a, b, out)
    if is_low(a) or is_low(b):  # bf16 / fp16 storage: float32 products of the values, rounded once
        return lowp.matmul(a, b, out)
    return _host_matmul(a, b, out)


@op("products", cpu="cpu_threads.py: matmuls", gpu="gpu_blas.py: matmul", reference="np.matmul",
    test="test_cpu_threads.py, test_fake_cupy.py")
def matmuls(*pairs, outs=None):
    """[a @ b for a, b in pairs] of 2-D products, in ONE hand-over to the CPU's threads (on a GPU,
    one GEMM each)."""
    if on_gpu(pairs[0][0]) or any(is_low(a) or is_low(b) for a, b in pairs):
        outs = list(outs) if outs is not None else [None] * len(pairs)
        return [matmul(a, b, o) for (a, b), o in zip(pairs, outs)]
    return cpu_threads.matmuls(*((a, right_operand(b)) for a, b in pairs), outs=outs)


def right_operand(b):
    """The right-hand matrix of a 2-D CPU product as BLAS reads it fastest. A transposed view (a
    linear layer's w.T): MKL reads the view as fast as a copy (175-194 GFLOP/s either way on the
    tiny model's products, one thread), so it gets the view; OpenBLAS multiplied by a C-contiguous
    copy faster (157-167 against 131-142), and the copy costs less than that (0.01-0.5 ms a
    weight)."""
    if b.ndim == 2 and b.strides[0] < b.strides[1] and b.shape[0] > 1 and not blas.mkl_loaded():
        return np.ascontiguousarray(b)
    return b


def _host_matmul(a, b, out=None):
    """a @ b for NumPy arrays, taking BLAS-friendly paths. NumPy's stacked matmul falls off BLAS
    when a batch dimension is broadcast (a 3-D activation times a 2-D weight: measured ~100x
    slower than one 2-D GEMM), and loops without BLAS over a transposed right operand (~3x slower
    than copying it)."""
    if a.ndim == 2 and b.ndim == 2:
        return cpu_threads.matmuls((a, right_operand(b)), outs=[out])[0]
    if b.ndim == 2 and a.ndim > 2:  # (..., M, K) @ (K, N): one GEMM of (prod(...) * M, K) @ (K, N)
        flat_out = out.reshape(-1, b.shape[-1]) if out is not None and out.flags.c_contiguous else None
        res = _host_matmul(a.reshape(-1, a.shape[-1]), b, flat_out).reshape(a.shape[:-1] + (b.shape[-1],))
        if out is not None and flat_out is None:
            out[...] = res
            return out
        return out if out is not None else res
    if a.ndim < 2 or b.ndim < 2:
        return np.matmul(a, b) if out is None else np.matmul(a, b, out=out)
    if a.shape[:-2] == b.shape[:-2]:
        if b.strides[-1] != b.itemsize:  # a transposed view on the right (k.swapaxes(-1, -2))
            b = np.ascontiguousarray(b)
        return np.matmul(a, b) if out is None else np.matmul(a, b, out=out)
    batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    ab = np.broadcast_to(a, batch + a.shape[-2:])  # views: no copy
    bb = np.broadcast_to(b, batch + b.shape[-2:])
    if out is None:
        out = np.empty(batch + (a.shape[-2], b.shape[-1]), dtype=np.result_type(a, b))
    for i in np.ndindex(*batch):
        np.matmul(ab[i], bb[i], out=out[i])
    return out
