"""The global gradient norm and clipping, torch.nn.utils.clip_grad_norm_'s rule (phase T06).

    norm = clip_grad_norm(model.parameters(), 1.0)     # scales every gradient in place when norm > 1
    norm = global_grad_norm(params)                    # the norm alone

The optimizer's own `AdamW.clip_grad_norm` computes the same norm and clip factor over its flat
gradient buffer and folds the factor into its next step (no host synchronisation on a GPU).
"""

from __future__ import annotations

import math

import numpy as np

from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.training.optim.base import params_list

__all__ = ["clip_grad_norm", "global_grad_norm"]


def global_grad_norm(params, sync: bool = True):
    """‖(g₁, g₂, …)‖₂ over every parameter that has a gradient (accumulated in float64).

    A Python float (one host synchronisation), or with ``sync=False`` a 0-d float64 array
    left on the device (the same number)."""
    grads = [p.grad for p in params_list(params) if p.grad is not None]
    if not grads:
        return 0.0 if sync else np.zeros((), dtype=np.float64)
    norm = opset.grad_norm(grads)
    return float(norm) if sync else norm


def clip_grad_norm(params, max_norm: float, eps: float = 1e-6, sync: bool = True):
    """Scale all gradients in place so their global L2 norm is at most ``max_norm``.

    Returns the norm *before* clipping (``inf``/``nan`` if a gradient is not finite, in
    which case nothing is scaled — the caller should skip the step). Parameters without a
    gradient are skipped. Same rule as ``torch.nn.utils.clip_grad_norm_``: the scale is
    ``max_norm / (norm + 1e-6)``, applied only when it is below 1.
    ``sync=False``: no host synchronisation; the norm is returned as a 0-d array on the
    device and every gradient is multiplied by the coefficient, 1 when not clipping or when
    the norm is not finite (x · 1 = x: the same bits as the host path).
    """
    grads = [p.grad for p in params_list(params) if p.grad is not None]
    if not sync:  # the same rule as a device computation: scale by 1 when not clipping
        norm = global_grad_norm(params, sync=False)
        xp = array_module(norm)
        coef = float(max_norm) / (norm + eps)
        opset.scale_arrays(grads, xp.where(xp.isfinite(norm) & (coef < 1.0), coef, 1.0))
        return norm
    norm = global_grad_norm(params)
    if not math.isfinite(norm):
        return norm
    coef = float(max_norm) / (norm + eps)
    if coef < 1.0:
        opset.scale_arrays(grads, coef)
    return norm
