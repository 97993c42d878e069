"""Dropout's random numbers: Philox-4x32-10 uniforms, a pure function of (seed, offset, index)
(phase T18).

    u = uniforms(n, seed, offset, xp)       # n float32 uniforms in [0, 1) on the device of `xp`

A GPU draws them with the CUDA kernel kernels/philox.cu, the CPU with the NumPy Philox of
runtime/rng.py: bit-identical, so a mask drawn on either device is the same mask.

A step captured as a CUDA graph names its streams in device memory instead (the offset a
`DeviceKey`: key[0] the seed, key[1] + add the offset, rewritten by the host before each replay):

    u = uniforms(n, 0, DeviceKey(key) + 3, xp)  # == uniforms(n, key[0], key[1] + 3, xp)
"""

from __future__ import annotations

from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.runtime.kernels.philox import philox_uniform, philox_uniform_keyed
from xtrain_lessons.runtime.opset.dispatch import on_gpu
from xtrain_lessons.runtime.opset.table import op
from xtrain_lessons.runtime.rng import uniform

__all__ = ["uniforms", "DeviceKey"]


class DeviceKey:
    """Philox streams named in device memory (see the module doc): `key` a uint64 array [seed, offset]
    on the device; DeviceKey(key, a) + s is stream (key[0], key[1] + a + s), read at launch."""

    __slots__ = ("key", "add")

    def __init__(self, key, add: int = 0):
        self.key, self.add = key, int(add)

    def __add__(self, k: int) -> "DeviceKey":
        return DeviceKey(self.key, self.add + int(k))

    __radd__ = __add__


@op("dropout", cpu="rng.py: uniform", gpu="kernels/philox.cu: philox_uniform", reference="rng.py: uniform",
    test="test_dropout.py")
def uniforms(n: int, seed: int, offset, xp):
    """n float32 uniforms of Philox stream (seed, offset) on the device of `xp` (an array module
    or an array); `offset` a DeviceKey: the stream its key names, read where the key lives."""
    if isinstance(offset, DeviceKey):
        if on_gpu(xp):
            return philox_uniform_keyed(offset.key, offset.add, n, xp=array_module(xp))
        return uniform(int(offset.key[0]), int(offset.key[1]) + offset.add, n)  # a host key (tests)
    if on_gpu(xp):
        return philox_uniform(seed, offset, n, xp=array_module(xp))
    return uniform(seed, offset, n)
