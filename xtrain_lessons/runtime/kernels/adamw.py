"""Fused AdamW: the launcher for kernels/adamw.cu and its NumPy reference.

The optimizer built on it is `xtrain_lessons.training.optim.AdamW` (through runtime/opset/optim.py).

adamw_flat(p, g, m, v, step, lr, betas, eps, weight_decay, n_decay) updates flat buffers in
place (one launch); adamw_reference(...) is the same update in NumPy, with the engine AdamW's
arithmetic.

The GPU engine's step (T07b) reads grad_norm.global_norm_and_clip's result on the device:

    adamw_flat_scaled(p, g, m, v, factors, step, lr, betas, eps, weight_decay, n_decay)
        factors: float32 device array of 3 (grad_norm's `out`): the gradients are multiplied by
        factors[1] (unscale and clip) before the update, and when factors[2] != 0 (found_inf)
        the kernel leaves p, m, v untouched (the skipped fp16 step). One launch of
        `adamw_step_scaled`, no host synchronisation. The host's step count still advances
        for a skipped step (it cannot know without a sync). Reference:
        adamw_scaled_reference(...) = adamw_reference after g *= factors[1], nothing when
        factors[2] != 0.

A step captured in a CUDA graph (training/loop/cuda_graph.py) replays its kernels' arguments as they
were at the capture, so the scalars that change every step live in device memory instead:

    adamw_flat_graphed(p, g, m, v, factors, step_scalars, betas, eps, n_decay)
        step_scalars: float32 device array of 3, [decay, bc2_sqrt, neg_step] of this step (the
        host fills it before each replay: adamw_step_scalars(step, lr, betas, weight_decay)).
        The same update, the same bits, as adamw_flat_scaled with those scalars.
"""

from __future__ import annotations

import math

import numpy as np

from xtrain_lessons.runtime.cuda import load_kernel
from xtrain_lessons.runtime.device import array_module, kernel_backend
from xtrain_lessons.runtime.kernels._common import F32, check, device_of

__all__ = ["adamw_flat", "adamw_reference", "adamw_scalars", "adamw_flat_scaled", "adamw_scaled_reference",
           "adamw_flat_graphed", "adamw_step_scalars", "BLOCK"]

BLOCK = 256
MAX_GRID = 1024


def adamw_scalars(step: int, lr: float, betas, eps: float, weight_decay: float) -> tuple:
    """The float32 scalars of the kernel for step `step` (1-based), rounded as the engine's
    AdamW rounds them (a Python float meeting a float32 array becomes float32)."""
    b1, b2 = betas
    f = np.float32
    return (f(1.0 - lr * weight_decay), f(1.0 - b1), f(b2), f(1.0 - b2),
            f(math.sqrt(1.0 - b2 ** step)), f(eps), f(-(lr / (1.0 - b1 ** step))))


def adamw_flat(p, g, m, v, step: int, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
               weight_decay: float = 0.0, n_decay: int | None = None, kernel=None) -> None:
    """One AdamW step over flat float32 buffers, in place, by one launch of `adamw_step`.
    Elements [0, n_decay) are decayed (all of them when n_decay is None). `kernel`: another
    compiled `adamw_step` (the T07b notebook passes the learner's)."""
    xp = array_module(p)
    n = int(p.size)
    for name, a in (("p", p), ("g", g), ("m", m), ("v", v)):
        if a.dtype != np.float32 or a.ndim != 1 or a.size != n or not a.flags.c_contiguous:
            raise ValueError(f"adamw_flat: {name} must be a contiguous 1-D float32 array of "
                             f"{n} elements, got {a.dtype} {a.shape}")
    if n == 0:
        return
    n_decay = n if n_decay is None else int(n_decay)
    if kernel is None:
        kernel = load_kernel("adamw.cu", "adamw_step", backend=kernel_backend(xp))
    grid = min((n + BLOCK - 1) // BLOCK, MAX_GRID)
    kernel((grid,), (BLOCK,), (p, g, m, v) + adamw_scalars(step, lr, betas, eps, weight_decay)
           + (np.int32(n), np.int32(n_decay)))


def _checked_flat(fn, p, g, m, v, **threes):
    """(array module, n): p, g, m, v contiguous float32 (n,) arrays on one device, each of `threes`
    a float32 (3,) array there (grad_norm's factors, the step's scalars); else one clear error."""
    xp = device_of(fn, "p", p)
    check(fn, "p", p, xp, (F32,))
    if p.ndim != 1:
        raise ValueError(f"{fn}: p must be 1-D, got shape {tuple(p.shape)}")
    n = int(p.size)
    for name, a in (("g", g), ("m", m), ("v", v)):
        check(fn, name, a, xp, (F32,), (n,))
    for name, a in threes.items():
        check(fn, name, a, xp, (F32,), (3,))
    return xp, n


def adamw_flat_scaled(p, g, m, v, factors, step: int, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
                      weight_decay: float = 0.0, n_decay: int | None = None) -> None:
    """adamw_flat with the gradients multiplied by factors[1] and the step skipped when
    factors[2] != 0, both read on the device (see the module doc). One launch."""
    xp, n = _checked_flat("adamw_flat_scaled", p, g, m, v, factors=factors)
    if n == 0:
        return
    n_decay = n if n_decay is None else int(n_decay)
    kernel = load_kernel("adamw.cu", "adamw_step_scaled", backend=kernel_backend(xp))
    grid = min((n + BLOCK - 1) // BLOCK, MAX_GRID)
    kernel((grid,), (BLOCK,), (p, g, m, v, factors) + adamw_scalars(step, lr, betas, eps, weight_decay)
           + (np.int32(n), np.int32(n_decay)))


def adamw_step_scalars(step: int, lr: float, betas, weight_decay: float) -> np.ndarray:
    """[decay, bc2_sqrt, neg_step] of step `step` as a float32 host array: what
    adamw_flat_graphed reads from the device (the same values adamw_scalars gives)."""
    decay, _, _, _, bc2_sqrt, _, neg_step = adamw_scalars(step, lr, betas, 0.0, weight_decay)
    return np.array([decay, bc2_sqrt, neg_step], dtype=np.float32)


def adamw_flat_graphed(p, g, m, v, factors, step_scalars, betas=(0.9, 0.999), eps: float = 1e-8,
                       n_decay: int | None = None) -> None:
    """adamw_flat_scaled with decay, bc2_sqrt and neg_step read from `step_scalars` on the device
    (see the module doc). One launch of `adamw_step_graphed`."""
    xp, n = _checked_flat("adamw_flat_graphed", p, g, m, v, factors=factors, step_scalars=step_scalars)
    if n == 0:
        return
    n_decay = n if n_decay is None else int(n_decay)
    _, omb1, b2, omb2, _, eps32, _ = adamw_scalars(1, 0.0, betas, eps, 0.0)
    kernel = load_kernel("adamw.cu", "adamw_step_graphed", backend=kernel_backend(xp))
    grid = min((n + BLOCK - 1) // BLOCK, MAX_GRID)
    kernel((grid,), (BLOCK,), (p, g, m, v, factors, step_scalars, omb1, b2, omb2, eps32, np.int32(n),
                               np.int32(n_decay)))


def adamw_reference(p, g, m, v, step: int, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
                    weight_decay: float = 0.0, n_decay: int | None = None) -> None:
    """The NumPy reference of adamw_flat (in place), with the engine AdamW's arithmetic."""
    n_decay = p.size if n_decay is None else int(n_decay)
    decay, omb1, b2, omb2, bc2_sqrt, eps32, neg_step = adamw_scalars(step, lr, betas, eps,
                                                                    weight_decay)
    p[:n_decay] *= decay
    m += omb1 * (g - m)
    v *= b2
    v += omb2 * (g * g)
    denom = np.sqrt(v)
    denom /= bc2_sqrt
    denom += eps32
    p += neg_step * (m / denom)


def adamw_scaled_reference(p, g, m, v, factors, step: int, lr: float, betas=(0.9, 0.999), eps: float = 1e-8,
                           weight_decay: float = 0.0, n_decay: int | None = None) -> None:
    """The NumPy reference of adamw_flat_scaled (in place; factors a NumPy array)."""
    factors = np.asarray(factors, np.float32)
    if factors[2] != 0:
        return
    adamw_reference(p, g * factors[1], m, v, step, lr, betas, eps, weight_decay, n_decay)
