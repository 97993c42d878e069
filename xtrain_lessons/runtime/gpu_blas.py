"""Matrix products on the GPU (cuBLAS through CuPy), whatever the storage dtype (phases T03, T12).

    matmul(a, b, out=None)        a @ b for CuPy arrays (stacked and transposed views too)
    array_matmul(a, b, out=None)  np.matmul for NumPy arrays, `matmul` for CuPy ones

float32 and float16 go straight to `cupy.matmul` (cuBLAS; float16 with float32 accumulation).
bfloat16 cannot: CuPy 14.2 stores, casts and runs elementwise kernels on `ml_dtypes.bfloat16`
arrays but has no bfloat16 product — its matmul takes the dtype for an integer one and fails
(`TypeError: data type 'E' not understood`, seen on an H100). So a bf16 product is computed as a
bf16 GEMM with float32 accumulation computes it: the operands widened to float32 (exact: every
bf16 value is a float32), one float32 cuBLAS product, the result rounded to bf16 once. The values
are a bf16 GEMM's up to the order of the float32 sums; the speed is float32's, not the tensor
cores' (cublasGemmEx with CUDA_R_16BF operands is the way to those, not taken here).
"""

from __future__ import annotations

import numpy as np

__all__ = ["matmul", "array_matmul", "is_bf16"]


def is_bf16(a) -> bool:
    return np.dtype(a.dtype).char == "E"  # ml_dtypes.bfloat16


def matmul(a, b, out=None):
    """a @ b on the GPU (see the module doc); `out` receives the result in its own dtype."""
    import cupy  # noqa: PLC0415 - only ever called with CuPy arrays

    if not (is_bf16(a) or is_bf16(b) or (out is not None and is_bf16(out))):
        return cupy.matmul(a, b) if out is None else cupy.matmul(a, b, out=out)
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


def array_matmul(a, b, out=None):
    """np.matmul(a, b, out) for NumPy arrays, `matmul` for CuPy ones (code that serves both)."""
    if isinstance(a, np.ndarray):
        return np.matmul(a, b) if out is None else np.matmul(a, b, out=out)
    return matmul(a, b, out)
