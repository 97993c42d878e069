"""Vector add: the launcher for kernels/vector_add.cu and its NumPy reference.

The pattern every kernel family follows: a `<family>.cu` file, and here one launcher per
kernel (allocate the output on the right device, pick grid and block, launch) beside a
NumPy reference that tests and notebooks compare against.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.cuda import load_kernel
from xtrain_lessons.runtime.device import array_module, kernel_backend

BLOCK = 256


def vector_add(a, b):
    """c = a + b for two float32 vectors of the same length, computed by the CUDA kernel.

    NumPy arrays run on the CPU emulator, CuPy arrays on the GPU."""
    xp = array_module(a)
    a = xp.ascontiguousarray(a, dtype=xp.float32)
    b = xp.ascontiguousarray(b, dtype=xp.float32)
    if a.shape != b.shape or a.ndim != 1:
        raise ValueError(f"vector_add needs two 1-D arrays of the same length, got {a.shape} and {b.shape}")
    n = a.size
    c = xp.empty_like(a)
    if n == 0:
        return c
    kernel = load_kernel("vector_add.cu", "vector_add", backend=kernel_backend(xp))
    grid = (n + BLOCK - 1) // BLOCK  # the last block is partial when BLOCK does not divide n
    kernel((grid,), (BLOCK,), (a, b, c, np.int32(n)))
    return c


def vector_add_reference(a, b):
    """The NumPy reference: float32 addition, element by element."""
    return np.asarray(a, dtype=np.float32) + np.asarray(b, dtype=np.float32)
