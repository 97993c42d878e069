"""bf16 conversion: the launchers for kernels/bf16.cu and their NumPy references (T12).

    bits = f32_to_bf16(x)        # float32 array -> uint16 bf16 bit patterns (CUDA kernel)
    y = bf16_to_f32(bits)        # uint16 bit patterns -> float32 (exact)

NumPy arrays run on the CPU emulator, CuPy arrays on the GPU. bf16 values travel as uint16
bit patterns (CuPy has no bfloat16 dtype); view them with `.view(ml_dtypes.bfloat16)` on
the host. The references use ml_dtypes, which rounds to nearest even like
`__float2bfloat16`: the two agree bit for bit on every non-NaN float32. A NaN converts to
a NaN, but the pattern differs (CUDA: 0x7FFF, ml_dtypes: sign | 0x7FC0).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from xtrain_lessons.runtime.cuda import load_kernel
from xtrain_lessons.runtime.device import array_module, kernel_backend

BLOCK = 256

__all__ = ["f32_to_bf16", "bf16_to_f32", "f32_to_bf16_reference", "bf16_to_f32_reference"]


def _launch(name: str, x, y, xp) -> None:
    n = x.size
    if n == 0:
        return
    if n >= 2 ** 31:
        raise ValueError(f"{name}: {n} elements do not fit the kernel's int index")
    kernel = load_kernel("bf16.cu", name, backend=kernel_backend(xp))
    kernel(((n + BLOCK - 1) // BLOCK,), (BLOCK,), (x, y, np.int32(n)))


def f32_to_bf16(x):
    """float32 array (any shape) -> uint16 array of bf16 bits, rounded to nearest even."""
    xp = array_module(x)
    x = xp.ascontiguousarray(x, dtype=xp.float32)
    y = xp.empty(x.shape, dtype=xp.uint16)
    _launch("f32_to_bf16", x.reshape(-1), y.reshape(-1), xp)
    return y


def bf16_to_f32(bits):
    """uint16 array of bf16 bits (or an ml_dtypes.bfloat16 array) -> float32, exact."""
    xp = array_module(bits)
    if bits.dtype.itemsize != 2 or bits.dtype.kind not in "uiV":
        raise TypeError(f"bf16_to_f32: expected uint16 bit patterns or bfloat16, got {bits.dtype}")
    bits = xp.ascontiguousarray(bits).view(xp.uint16)
    y = xp.empty(bits.shape, dtype=xp.float32)
    _launch("bf16_to_f32", bits.reshape(-1), y.reshape(-1), xp)
    return y


def f32_to_bf16_reference(x) -> np.ndarray:
    """NumPy reference: ml_dtypes' round-to-nearest-even cast, as uint16 bits."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(x, dtype=np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def bf16_to_f32_reference(bits) -> np.ndarray:
    """NumPy reference: the 16 bits placed in the top half of a float32."""
    return (np.asarray(bits).view(np.uint16).astype(np.uint32) << 16).view(np.float32)
