"""Matrix products on the GPU (cuBLAS through CuPy), whatever the storage dtype (phases T03, T12).

    matmul(a, b, out=None)        a @ b for CuPy arrays (stacked and transposed views too)
    array_matmul(a, b, out=None)  np.matmul for NumPy arrays, `matmul` for CuPy ones

float32 and float16 go straight to `cupy.matmul` (cuBLAS; float16 with float32 accumulation), and
so does a 2-D bfloat16 product: CuPy 14.2 hands it to cublasGemmEx with bf16 operands and float32
accumulation, on the tensor cores (an 8192^3 one ran at 774 TFLOP/s on an H100). A *stacked*
bfloat16 product (ndim > 2: attention's) it cannot do: its batched path takes bf16 for an integer
type and fails (`TypeError: data type 'E' not understood`, seen on the H100). There the operands
are widened to float32 (exact: every bf16 value is a float32), multiplied by one batched float32
cuBLAS call and the result rounded to bf16 once: a bf16 GEMM's values up to the order of the
float32 sums, at float32's speed. A float32 `out` for bf16 operands also takes the widened path
(the product is then kept in float32, not rounded to bf16 first).
"""

from __future__ import annotations

import numpy as np

__all__ = ["matmul", "array_matmul", "is_bf16"]


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
