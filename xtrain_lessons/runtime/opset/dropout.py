"""Dropout's random numbers: Philox-4x32-10 uniforms, a pure function of (seed, offset, index)
(phase T18).

    u = uniforms(n, seed, offset, xp)       # n float32 uniforms in [0, 1) on the device of `xp`

A GPU draws them with the CUDA kernel kernels/philox.cu, the CPU with the NumPy Philox of
runtime/rng.py: bit-identical, so a mask drawn on either device is the same mask.
"""

from __future__ import annotations

from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.runtime.kernels.philox import philox_uniform
from xtrain_lessons.runtime.opset.dispatch import on_gpu
from xtrain_lessons.runtime.opset.table import op
from xtrain_lessons.runtime.rng import uniform

__all__ = ["uniforms"]


@op("dropout", cpu="rng.py: uniform", gpu="kernels/philox.cu: philox_uniform", reference="rng.py: uniform",
    test="test_dropout.py")
def uniforms(n: int, seed: int, offset: int, xp):
    """n float32 uniforms of Philox stream (seed, offset) on the device of `xp` (an array module
    or an array)."""
    if on_gpu(xp):
        return philox_uniform(seed, offset, n, xp=array_module(xp))
    return uniform(seed, offset, n)
