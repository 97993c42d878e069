"""Matrix products on the GPU: cuBLAS's strided batched GEMM, whatever the storage dtype (T03, T07b, T12).

    matmul(a, b, out=None)        a @ b for CuPy arrays (stacked and transposed views too)

Every product of two float32, float16 or bfloat16 arrays is one cublasGemmStridedBatchedEx call:
the operands in their storage dtype, float32 accumulation (CUBLAS_COMPUTE_32F; no TF32, as CuPy's
default), the result in the operands' dtype or in a float32 `out`. bf16 and fp16 run on the tensor
cores (an 8192^3 bf16 product ran at 774 TFLOP/s on an H100). Two reasons not to leave them to
`cupy.matmul`: CuPy 14.2 has no stacked bf16 product (its batched path takes bf16 for an integer
type: `TypeError: data type 'E' not understood`, seen on the H100), and CuPy's binding refuses any
cuBLAS call while a CUDA graph is being captured (training/loop/cuda_graph.py), so the call goes through
runtime/cublas_direct.py (cuBLAS's own entry point, which graphs can record), or through CuPy's
binding where that library cannot be found.

cuBLAS is column-major: the row-major product C = A @ B is, read column-major, C^T = B^T A^T, so
cuBLAS gets B as its first operand and A as its second; a row-major matrix is its own transpose
read column-major (op N, leading dimension = its row stride), a transposed view is op T. The stack's
batch dimensions must fold into one stride; where they do not (a transposed view of the heads), the
operand is first copied contiguous. A stack times one matrix ((..., m, k) @ (k, n): a linear layer)
is one product of all the stack's rows. Operands of two dtypes are widened to float32 (exact) and
the result rounded once; what one GEMM call cannot express (1-D operands, broadcast stacks) goes to
`cupy.matmul` (float32, float16; a bf16 one is widened first).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.cublas_direct import direct_cublas
from xtrain_lessons.runtime.device import cublas_binding, import_cupy

__all__ = ["matmul", "is_bf16"]

# cuBLAS's enums (library_types.h, cublas_api.h), passed as plain ints
CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF = 0, 2, 14
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
_ALPHA, _BETA = np.ones(1, np.float32), np.zeros(1, np.float32)  # host scalars (cuBLAS's default pointer mode)
_CUDA_TYPE = {"f": CUDA_R_32F, "e": CUDA_R_16F, "E": CUDA_R_16BF}  # by dtype char: float32, float16, bfloat16


def is_bf16(a) -> bool:
    return np.dtype(a.dtype).char == "E"  # ml_dtypes.bfloat16


def matmul(a, b, out=None):
    """a @ b on the GPU (see the module doc); `out` receives the result in its own dtype."""
    cupy = import_cupy()  # only ever called with CuPy arrays

    if a.dtype != b.dtype:  # widen both to float32 (exact), round the result once
        want = np.result_type(a.dtype, b.dtype)
        a32, b32 = (x if x.dtype == np.float32 else x.astype(np.float32) for x in (a, b))
        if out is not None and out.dtype == np.float32:
            return matmul(a32, b32, out)
        res = matmul(a32, b32)
        res = res if want == np.float32 else res.astype(want)
        if out is None:
            return res
        out[...] = res
        return out
    if _one_gemm(a, b, out):
        return _gemm(cupy, a, b, out)
    if is_bf16(a):  # CuPy has no bf16 here: widen, multiply, round once
        res = cupy.matmul(a.astype(np.float32), b.astype(np.float32)).astype(a.dtype)
        if out is None:
            return res
        out[...] = res
        return out
    return cupy.matmul(a, b) if out is None else cupy.matmul(a, b, out=out)


def _one_gemm(a, b, out) -> bool:
    """One cublasGemmStridedBatchedEx can make a @ b (same-dtype operands, see the module doc)."""
    return (a.dtype.char in _CUDA_TYPE and a.ndim >= 2 and b.ndim >= 2 and a.shape[-1] == b.shape[-2]
            and (b.ndim == 2 or a.shape[:-2] == b.shape[:-2]) and 0 not in a.shape and 0 not in b.shape
            and (out is None or out.dtype in (a.dtype, np.float32)))


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
    dims = list(zip(x.shape[:-2], batch))  # length-1 axes too: the same calls whatever the batch size
    if any(s_outer != s_inner * n_inner for (_, s_outer), (n_inner, s_inner) in zip(dims, dims[1:])):
        return None  # the batch does not fold into one stride
    stride = dims[-1][1] if dims else 0
    return (op, ld, stride) if stride >= 0 else None


def _gemm(cupy, a, b, out):
    """a @ b for a (..., m, k), b (..., k, n) or (k, n): one cublasGemmStridedBatchedEx."""
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    if b.ndim == 2 and a.ndim > 2:  # every row of the stack times b: one 2-D product
        flat_out = out.reshape(-1, n) if out is not None and out.flags.c_contiguous else None
        res = _gemm(cupy, cupy.ascontiguousarray(a).reshape(-1, k), b, flat_out)
        if out is None:
            return res.reshape(*a.shape[:-1], n)
        if flat_out is None:
            out[...] = res.reshape(out.shape)
        return out
    la, lb = _column_major(a), _column_major(b)
    if la is None:
        a = cupy.ascontiguousarray(a)
        la = _column_major(a)
    if lb is None:
        b = cupy.ascontiguousarray(b)
        lb = _column_major(b)
    shape = a.shape[:-2] + (m, n)
    c = out
    if c is None or c.shape != shape or not c.flags.c_contiguous:
        c = cupy.empty(shape, out.dtype if out is not None else a.dtype)
    args = (lb[0], la[0], n, m, k, _ALPHA.ctypes.data, b.data.ptr, _CUDA_TYPE[b.dtype.char], lb[1], lb[2],
            a.data.ptr, _CUDA_TYPE[a.dtype.char], la[1], la[2], _BETA.ctypes.data, c.data.ptr,
            _CUDA_TYPE[c.dtype.char], n, m * n, int(np.prod(shape[:-2])), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)
    blas = direct_cublas(cupy)
    if blas is not None:
        blas.gemm_strided_batched_ex(cupy.cuda.get_current_stream().ptr, *args)
    else:  # CuPy's binding: the same call, refused inside a graph capture
        cublas_binding().gemmStridedBatchedEx(cupy.cuda.device.get_cublas_handle(), *args)
    if out is not None and c is not out:
        out[...] = c
        return out
    return c
