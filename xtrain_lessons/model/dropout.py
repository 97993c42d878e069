"""Dropout whose mask comes from a counter-based RNG (phase T18).

    from xtrain_lessons.model.dropout import dropout
    y = dropout(x, p=0.1, seed=1234, offset=7, training=True)

In training, each element of x is zeroed with probability p and the survivors are scaled by
1/(1-p) ("inverted" dropout), so E[y] = x and evaluation needs no rescaling: with
`training=False` (or p = 0) dropout is the identity and returns x itself.

The mask is never stored. Element k (x in C order) is kept when u_k >= p, with
u = xtrain_lessons.runtime.rng.uniform(seed, offset, x.size) — Philox-4x32-10, a pure function of
(seed, offset, k). The backward regenerates exactly the same mask from the same integers, so
the graph keeps nothing but (seed, offset, p, shape), and a recomputed forward (T13's
`checkpoint`) draws the same mask again: gradients stay bit-identical under recompute.

Public API
----------
dropout(x, p, seed, offset, training=True) -> Tensor
    x a Tensor (or array), 0 <= p < 1, seed and offset integers in [0, 2**64).
    Use a different (seed, offset) for every call site and every step (see the scheme in
    `xtrain_lessons.model.qwen3`): the same pair gives the same mask.
dropout_scale(shape, p, seed, offset, dtype) -> array
    The multiplier: 1/(1-p) where kept, 0 where dropped (x's dtype). The forward is
    x * dropout_scale(...), the backward g * dropout_scale(...).
keep_mask(shape, p, seed, offset) -> bool array, True where kept.

Device: the uniforms come from the op set (`opset.uniforms`): the NumPy Philox on the CPU, the CUDA
kernel `kernels/philox.cu` on a GPU (bit-identical to NumPy's).

A step captured as a CUDA graph (training/loop/cuda_graph.py) replays its launches with the arguments
they had at the capture: an offset passed by value would draw the same masks at every replay. There
the offset is a `DeviceKey` (runtime/opset/dropout.py): the stream is read from device memory that the
host rewrites before each replay, `DeviceKey(key) + s` naming stream (key[0], key[1] + s) of a uint64
array key of 2 (the seed and the offset then both come from the key; the `seed` argument is not used).
"""

from __future__ import annotations

import math

import numpy as np

from xtrain_lessons.autograd.tensor import Tensor, as_tensor, make_node
from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.runtime.opset.dropout import DeviceKey

__all__ = ["dropout", "dropout_scale", "keep_mask", "DeviceKey"]


def keep_mask(shape, p: float, seed: int, offset: int, xp=np):
    """True where an element of an array of `shape` survives dropout(p) with (seed, offset)."""
    n = math.prod(shape)
    return (opset.uniforms(n, seed, offset, xp) >= np.float32(p)).reshape(shape)


def dropout_scale(shape, p: float, seed: int, offset: int, dtype=np.float32, xp=np):
    """1/(1-p) where kept, 0 where dropped, as an array of `shape` and `dtype`."""
    scale = np.dtype(dtype).type(1.0 / (1.0 - p))
    return xp.where(keep_mask(shape, p, seed, offset, xp), scale, np.dtype(dtype).type(0))


def dropout(x, p: float, seed: int, offset: int, training: bool = True) -> Tensor:
    """Inverted dropout with a mask regenerated from (seed, offset) (see module doc)."""
    x = as_tensor(x)
    if not 0.0 <= p < 1.0:
        raise ValueError(f"dropout: p must be in [0, 1), got {p}")
    for v, what in ((seed, "seed"), (offset, "offset")):
        if not isinstance(v, DeviceKey) and not 0 <= int(v) < 2 ** 64:
            raise ValueError(f"dropout: {what} must be an integer in [0, 2**64), got {v}")
    if not training or p == 0.0:
        return x  # the identity: bit for bit, and no graph node
    xp = array_module(x.data)
    shape, dtype = x.shape, x.dtype
    out = x.data * dropout_scale(shape, p, seed, offset, dtype, xp)

    def backward(g):  # the mask again, from the same integers: nothing was stored
        return (g * dropout_scale(shape, p, seed, offset, dtype, xp),)

    return make_node(out, (x,), backward, "dropout")
