"""Philox-4x32-10 on the device: launchers for kernels/philox.cu and their NumPy references.

One thread per counter block of 4 outputs. The references are `xtrain_lessons.runtime.rng`'s
`random_bits` and `uniform`: the kernel's output equals them bit for bit (tests/test_rng.py),
on the CPU emulator here and on a GPU through CuPy.

    from xtrain_lessons.runtime.kernels.philox import philox_uniform
    u = philox_uniform(seed=1234, offset=7, n=10_000)          # NumPy: the CPU emulator
    u = philox_uniform(1234, 7, 10_000, xp=cupy)               # a CuPy array, on the GPU

A step captured as a CUDA graph replays its launches' arguments as they were at the capture, so
its streams are named in device memory instead (training/loop/cuda_graph.py):

    key = cupy.asarray(np.array([1234, 7], np.uint64))       # [seed, offset], rewritten before each replay
    u = philox_uniform_keyed(key, 3, 10_000, xp=cupy)        # == philox_uniform(1234, 7 + 3, 10_000)
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.cuda import load_kernel
from xtrain_lessons.runtime.device import kernel_backend
from xtrain_lessons.runtime.rng import random_bits, uniform

__all__ = ["philox_bits", "philox_uniform", "philox_uniform_keyed", "philox_bits_reference", "philox_uniform_reference"]

BLOCK = 128  # threads per block; each thread writes 4 values


def _launch(name: str, dtype, seed: int, offset: int, n: int, xp):
    for v, what in ((seed, "seed"), (offset, "offset")):
        if not 0 <= int(v) < 2 ** 64:
            raise ValueError(f"{name}: {what} must be in [0, 2**64), got {v}")
    n = int(n)
    if n < 0:
        raise ValueError(f"{name}: n must be >= 0, got {n}")
    out = xp.empty(n, dtype=dtype)
    if n == 0:
        return out
    kernel = load_kernel("philox.cu", name, backend=kernel_backend(xp))
    blocks = (n + 3) // 4  # counter blocks, one per thread
    grid = (blocks + BLOCK - 1) // BLOCK
    kernel((grid,), (BLOCK,), (out, np.uint64(seed), np.uint64(offset), np.uint64(n)))
    return out


def philox_bits(seed: int, offset: int, n: int, xp=np):
    """The first n uint32 of stream (seed, offset), computed by the CUDA kernel."""
    return _launch("philox_bits", np.uint32, seed, offset, n, xp)


def philox_uniform(seed: int, offset: int, n: int, xp=np):
    """n float32 uniforms on [0, 1) of stream (seed, offset), computed by the CUDA kernel."""
    return _launch("philox_uniform", np.float32, seed, offset, n, xp)


def philox_uniform_keyed(key, add: int, n: int, xp=np):
    """n float32 uniforms of stream (key[0], key[1] + add), the key a uint64 array of 2 on the device
    that the kernel reads there (see the module doc). Bit for bit philox_uniform(key[0], key[1] + add, n)."""
    if not isinstance(key, xp.ndarray) or key.dtype != np.uint64 or key.shape != (2,):
        raise ValueError(f"philox_uniform_keyed: key must be a uint64 array of 2 on the device, got "
                         f"{type(key).__name__} {getattr(key, 'dtype', '')} {getattr(key, 'shape', '')}")
    if not 0 <= int(add) < 2 ** 64:
        raise ValueError(f"philox_uniform_keyed: add must be in [0, 2**64), got {add}")
    n = int(n)
    if n < 0:
        raise ValueError(f"philox_uniform_keyed: n must be >= 0, got {n}")
    out = xp.empty(n, dtype=np.float32)
    if n == 0:
        return out
    kernel = load_kernel("philox.cu", "philox_uniform_keyed", backend=kernel_backend(xp))
    grid = ((n + 3) // 4 + BLOCK - 1) // BLOCK
    kernel((grid,), (BLOCK,), (out, key, np.uint64(add), np.uint64(n)))
    return out


def philox_bits_reference(seed: int, offset: int, n: int):
    """The NumPy reference: `xtrain_lessons.runtime.rng.random_bits`."""
    return random_bits(seed, offset, n)


def philox_uniform_reference(seed: int, offset: int, n: int):
    """The NumPy reference: `xtrain_lessons.runtime.rng.uniform`."""
    return uniform(seed, offset, n)
