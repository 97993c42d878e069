"""fp16's loss scale on the device: the launcher for kernels/grad_scaler.cu and its reference (T12b).

    update_scale(state, found, growth_factor, backoff_factor, growth_interval, dynamic=True)
        state: float32 (3,) on the device, [scale, growth tracker, skipped steps], updated in place;
        found: grad_norm.global_norm_and_clip's out (its [2] is 1.0 when a gradient was not finite).
        torch.amp.GradScaler's update rule (training/optim/grad_scaler.py), one launch of one thread:
        nothing is read on the host.

Reference: update_scale_reference(state, found_inf, ...) -> the new state (NumPy, float32 arithmetic).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.kernels._common import F32, check, device_of, kernel

__all__ = ["update_scale", "update_scale_reference"]

_FILE, _NAMES = "grad_scaler.cu", ("update_scale",)


def update_scale(state, found, growth_factor: float, backoff_factor: float, growth_interval: int,
                 dynamic: bool = True) -> None:
    """See the module doc."""
    fn = "update_scale"
    xp = device_of(fn, "state", state)
    check(fn, "state", state, xp, (F32,), (3,))
    check(fn, "found", found, xp, (F32,), (3,))
    k = kernel(_FILE, "update_scale", _NAMES, xp)
    k((1,), (1,), (state, found, np.float32(growth_factor), np.float32(backoff_factor), np.int32(growth_interval),
                   np.int32(bool(dynamic))))


def update_scale_reference(state, found_inf: bool, growth_factor: float, backoff_factor: float,
                           growth_interval: int, dynamic: bool = True) -> np.ndarray:
    """The new [scale, tracker, skipped] by GradScaler.update's rule, in float32."""
    scale, tracker, skipped = (np.float32(v) for v in state)
    f = np.float32
    if found_inf:
        skipped = f(skipped + 1)
    if dynamic and found_inf:
        scale, tracker = f(scale * f(backoff_factor)), f(0)
    elif dynamic:
        tracker = f(tracker + 1)
        if int(tracker) == growth_interval:
            with np.errstate(over="ignore"):
                grown = f(scale * f(growth_factor))
            scale = grown if np.isfinite(grown) else scale
            tracker = f(0)
    return np.array([scale, tracker, skipped], np.float32)
