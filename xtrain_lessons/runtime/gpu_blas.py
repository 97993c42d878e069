"""Matrix products on the GPU (cuBLAS through CuPy), whatever the storage dtype (phases T03, T12).

    matmul(a, b, out=None)        a @ b for CuPy arrays (stacked and transposed views too)
    array_matmul(a, b, out=None)  np.matmul for NumPy arrays, `matmul` for CuPy ones

float32 and float16 go straight to `cupy.matmul` (cuBLAS; float16 with float32 accumulation), and
so does a 2-D bfloat16 product: CuPy 14.2 hands it to cublasGemmEx with bf16 operands and float32
accumulation, on the tensor cores (an 8192^3 one ran at 774 TFLOP/s on an H100). A *stacked*
bfloat16 product (ndim > 2: attention's) CuPy cannot do: its batched path takes bf16 for an integer
type and fails (`TypeError: data type 'E' not understood`, seen on the H100). This module makes that
one itself, as CuPy makes its float32 ones: one cublasGemmStridedBatchedEx call (CuPy's binding in
cupy_backends.cuda.libs.cublas), bf16 operands, float32 accumulation, a bf16 or float32 result.

cuBLAS is column-major: the row-major product C = A @ B is, read column-major, C^T = B^T A^T, so
cuBLAS gets B as its first operand and A as its second; a row-major matrix is its own transpose
read column-major (op N, leading dimension = its row stride), a transposed view is op T. The stack's
batch dimensions must fold into one stride; where they do not (a transposed view of the heads), the
operand is first copied contiguous. Anything else mixing bf16 with another dtype is widened to
float32 (exact), multiplied there and rounded once.
"""

from __future__ import annotations

import numpy as np

__all__ = ["matmul", "array_matmul", "is_bf16"]

# cuBLAS's enums (library_types.h, cublas_api.h); CuPy's binding takes them as plain ints
CUDA_R_32F, CUDA_R_16BF = 0, 14
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
_ALPHA, _BETA = np.ones(1, np.float32), np.zeros(1, np.float32)  # host scalars (cuBLAS's default pointer mode)


def is_bf16(a) -> bool:
    return np.dtype(a.dtype).char == "E"  # ml_dtypes.bfloat16


def _cupy_does_it(a, b, out) -> bool:
    """cupy.matmul can make this product itself (see the module doc)."""
    if not (is_bf16(a) or is_bf16(b) or (out is not None and is_bf16(out))):
        return True
    return a.ndim == 2 and b.ndim == 2 and is_bf16(a) and is_bf16(b) and (out is None or is_bf16(out))


def matmul(a, b, out=None):
    """a @ b on the GPU (see the module doc); `out` receives the result in its own dtype."""
    import cupy  # noqa: PLC0415 - only ever called with CuPy arrays

    if _cupy_does_it(a, b, out):
        return cupy.matmul(a, b) if out is None else cupy.matmul(a, b, out=out)
    if _batched_bf16_fits(a, b, out):
        return _batched_bf16(cupy, a, b, out)
    want = np.result_type(a.dtype, b.dtype)  # bf16 @ bf16 -> bf16, bf16 @ float32 -> float32
    a32 = a if a.dtype == np.float32 else a.astype(np.float32)
    b32 = b if b.dtype == np.float32 else b.astype(np.float32)
    if out is not None and out.dtype == np.float32:
        return cupy.matmul(a32, b32, out=out)
    res = cupy.matmul(a32, b32)
    if out is None:
        return res if want == np.float32 else res.astype(want)
    out[...] = res
    return out


def _batched_bf16_fits(a, b, out) -> bool:
    return (is_bf16(a) and is_bf16(b) and a.ndim == b.ndim > 2 and a.shape[:-2] == b.shape[:-2]
            and a.shape[-1] == b.shape[-2] and 0 not in a.shape and b.shape[-1] > 0
            and (out is None or out.dtype == np.float32 or is_bf16(out)))


def _column_major(x):
    """(op, leading dimension, batch stride) in elements: how cuBLAS reads the transpose of each
    row-major matrix stacked in x (..., r, c); None where it cannot (then x is copied contiguous)."""
    if any(s % x.itemsize for s in x.strides):
        return None
    *batch, rs, cs = (s // x.itemsize for s in x.strides)
    r, c = x.shape[-2:]
    cs = 1 if c == 1 else cs  # a stride along a length-1 axis is never used
    rs = c if r == 1 and cs == 1 else rs
    if cs == 1 and rs >= c:
        op, ld = CUBLAS_OP_N, rs  # row-major rows are column-major columns
    elif rs == 1 and cs >= r:
        op, ld = CUBLAS_OP_T, cs  # a transposed view
    else:
        return None
    dims = [(n, s) for n, s in zip(x.shape[:-2], batch) if n > 1]
    if any(s_outer != s_inner * n_inner for (_, s_outer), (n_inner, s_inner) in zip(dims, dims[1:])):
        return None  # the batch does not fold into one stride
    stride = dims[-1][1] if dims else 0
    return (op, ld, stride) if stride >= 0 else None


def _batched_bf16(cupy, a, b, out):
    """a @ b for stacked bf16 a (..., m, k), b (..., k, n): one cublasGemmStridedBatchedEx."""
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415 - CuPy's own binding of cuBLAS

    la, lb = _column_major(a), _column_major(b)
    if la is None:
        a = cupy.ascontiguousarray(a)
        la = _column_major(a)
    if lb is None:
        b = cupy.ascontiguousarray(b)
        lb = _column_major(b)
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    shape = a.shape[:-2] + (m, n)
    c = out
    if c is None or c.shape != shape or not c.flags.c_contiguous:
        c = cupy.empty(shape, np.float32 if out is not None and out.dtype == np.float32 else a.dtype)
    c_type = CUDA_R_32F if c.dtype == np.float32 else CUDA_R_16BF
    cublas.gemmStridedBatchedEx(
        cupy.cuda.device.get_cublas_handle(), lb[0], la[0], n, m, k, _ALPHA.ctypes.data,
        b.data.ptr, CUDA_R_16BF, lb[1], lb[2], a.data.ptr, CUDA_R_16BF, la[1], la[2], _BETA.ctypes.data,
        c.data.ptr, c_type, n, m * n, int(np.prod(shape[:-2])), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
    if out is not None and c is not out:
        out[...] = c
        return out
    return c


def array_matmul(a, b, out=None):
    """np.matmul(a, b, out) for NumPy arrays, `matmul` for CuPy ones (code that serves both)."""
    if isinstance(a, np.ndarray):
        return np.matmul(a, b) if out is None else np.matmul(a, b, out=out)
    return matmul(a, b, out)
