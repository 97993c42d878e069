"""The global gradient norm and clip on the GPU: the launcher for kernels/grad_norm.cu and its
NumPy reference (T07b).

    global_norm_and_clip(flat_grad, partials, out, max_norm, eps=1e-6, inv_scale=1.0)
        flat_grad: the flat float32 buffer of every gradient (1-D); partials: a float64 scratch
        of NORM_GRID elements (or None: allocated); out: float32 (3,), written on the device:
          out[0] = the global L2 norm of flat_grad * inv_scale (inf/NaN when not finite),
          out[1] = the factor the optimizer multiplies the raw gradients by: coef * inv_scale,
                   coef = max_norm / (norm + eps) when the norm is finite and that is < 1, else 1
                   (max_norm None or <= 0: no clipping, coef 1),
          out[2] = 1.0 when the norm is not finite (found_inf: skip the fp16 step), else 0.0.
        inv_scale = 1 / loss_scale with fp16 loss scaling, else 1. Two launches (the squares
        summed in double over a fixed 256 x 256 grid into partials, then one block), no host
        synchronisation: adamw.adamw_flat_scaled reads `out` on the device. Deterministic.

The rule of training/optim/clip.py's clip_grad_norm (torch's clip_grad_norm_), with unscaling folded
into the same factor. Reference: global_norm_and_clip_reference(flat_grad, max_norm, eps,
inv_scale) -> float32 (3,), in float64 arithmetic.
"""

from __future__ import annotations

import math

import numpy as np

from xtrain_lessons.runtime.kernels._common import F32, check, device_of, kernel

__all__ = ["global_norm_and_clip", "global_norm_and_clip_reference", "grad_norm_partials_reference", "NORM_GRID",
           "NORM_BLOCK"]

NORM_GRID = 256    # blocks of the squares' pass: fixed, so the summation order is too
NORM_BLOCK = 256
_FILE = "grad_norm.cu"
_NAMES = ("grad_norm_partials", "grad_norm_finish", "grad_norm_finish_scaled")


def global_norm_and_clip(flat_grad, partials, out, max_norm, eps: float = 1e-6, inv_scale: float = 1.0,
                         scale_state=None):
    """See the module doc. `scale_state`: a device float32 array whose [0] is the fp16 loss scale
    (training/optim/grad_scaler.py on the device): inv_scale is then 1 / scale, read on the device.
    Returns `out`."""
    fn = "global_norm_and_clip"
    xp = device_of(fn, "flat_grad", flat_grad)
    check(fn, "flat_grad", flat_grad, xp, (F32,))
    if flat_grad.ndim != 1:
        raise ValueError(f"{fn}: flat_grad must be 1-D, got shape {tuple(flat_grad.shape)}")
    if partials is None:
        partials = xp.empty(NORM_GRID, dtype=xp.float64)
    check(fn, "partials", partials, xp, (np.float64,), (NORM_GRID,))
    check(fn, "out", out, xp, (F32,), (3,))
    clip = 0.0 if max_norm is None or max_norm <= 0 else float(max_norm)
    first = kernel(_FILE, "grad_norm_partials", _NAMES, xp)
    first((NORM_GRID,), (NORM_BLOCK,), (flat_grad, np.int64(flat_grad.size), partials))
    if scale_state is not None:
        check(fn, "scale_state", scale_state, xp, (F32,))
        finish = kernel(_FILE, "grad_norm_finish_scaled", _NAMES, xp)
        finish((1,), (NORM_BLOCK,), (partials, np.int32(NORM_GRID), out, np.float64(clip), np.float64(eps),
                                     scale_state))
        return out
    finish = kernel(_FILE, "grad_norm_finish", _NAMES, xp)
    finish((1,), (NORM_BLOCK,), (partials, np.int32(NORM_GRID), out, np.float64(clip), np.float64(eps),
                                 np.float64(inv_scale)))
    return out


def global_norm_and_clip_reference(flat_grad, max_norm, eps: float = 1e-6, inv_scale: float = 1.0) -> np.ndarray:
    """[norm, coef * inv_scale, found_inf] as float32, by clip_grad_norm's rule in float64."""
    g = np.asarray(flat_grad, np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        norm = math.sqrt(float(np.sum(g * g))) * inv_scale
    finite = math.isfinite(float(np.float32(norm)))
    coef = 1.0
    if max_norm is not None and max_norm > 0 and finite:
        c = max_norm / (norm + eps)
        coef = c if c < 1.0 else 1.0
    return np.array([norm, coef * inv_scale, 0.0 if finite else 1.0], np.float32)


def grad_norm_partials_reference(flat_grad, grid: int = NORM_GRID, block: int = NORM_BLOCK) -> np.ndarray:
    """What grad_norm_partials writes: partials[b] = the sum of g[i]^2 in float64 over the elements
    block b's threads take in the grid-stride loop (i mod grid*block in [b*block, (b+1)*block))."""
    g = np.asarray(flat_grad, np.float64).ravel()
    stride = grid * block
    padded = np.zeros(-(-g.size // stride) * stride)
    padded[:g.size] = g
    return np.sum(np.square(padded.reshape(-1, grid, block)), axis=(0, 2))
