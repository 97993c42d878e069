"""Dynamic loss scaling for fp16 mixed precision (phase T12b), with torch.amp.GradScaler's rules.

fp16 keeps 10 mantissa bits but only 5 exponent bits: its smallest normal is 2^-14 (6.1e-5),
its smallest subnormal 2^-24 (6.0e-8). Activation gradients are often smaller than that, so
in fp16 they round to zero. The fix: multiply the loss by a large scale S before backward
(every gradient is then S times larger and representable), and divide the float32 master
gradients by S before anything reads them (clipping, the optimizer).

    scaler = GradScaler()                      # S = 2^16, x2 every 2000 clean steps, x0.5 on inf
    (scaler.scale(loss)).backward()            # or scaler.scale(loss / accum_steps) per micro-batch
    found_inf = scaler.unscale_(params)        # grads /= S, once per optimizer step; all-reduced under DDP
    clip_grad_norm(params, 1.0)                # clipping sees the true gradients
    scaler.step(optimizer, lr)                 # skipped when found_inf
    scaler.update()                            # halve S on inf, double after growth_interval clean steps

A step whose scaled gradients overflowed (any inf/NaN) is skipped, not fatal: the scale was
too large, it is halved, and the next step tries again. The scale is a float32 value, the
reciprocal taken in float64 and rounded to float32, exactly as torch does; so on the same
gradient sequence the unscaled gradients, the skips and the scales are bit-identical
(tests/test_grad_scaler.py). On the CPU the inf check is read on the host (one synchronisation
per optimizer step, free there). The training loop keeps the scale, the growth count and the
skipped steps in an array on the parameters' device (`to_device(xp)`: `state`), as torch keeps its
scale tensor: AdamW.clip_grad_norm unscales the gradients inside its clip factor and finds the inf
(training/optim/adamw.py), the step is skipped there, and `update_from(factors)` runs the rule
(opset.loss_scale_update: one launch on a GPU): no host synchronisation in the step.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.parallel.ddp import agree_any
from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.device import array_module, to_host

__all__ = ["GradScaler"]


class GradScaler:
    """torch.amp.GradScaler's semantics and defaults, on this package's parameters."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True,
                 dynamic: bool = True):
        """`dynamic=False` (not in torch): a fixed scale; an inf/NaN step is still skipped.
        `GradScaler(init_scale=1.0, dynamic=False)` is fp16 without loss scaling (T12b)."""
        if not growth_factor > 1.0 or not 0.0 < backoff_factor < 1.0 or growth_interval < 1:
            raise ValueError("GradScaler: need growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1")
        self.enabled, self.dynamic = enabled, dynamic
        self._scale = np.float32(init_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self.found_inf: bool | None = None  # set by unscale_, cleared by update
        self.skipped_steps = 0
        self.state = None  # on the device (to_device): [scale, growth tracker, skipped steps]

    def to_device(self, xp) -> "GradScaler":
        """Keep the scaler's numbers on the device from now on (see the module doc)."""
        self.state = xp.asarray(np.array([self._scale, self._growth_tracker, self.skipped_steps], np.float32))
        return self

    def get_scale(self) -> float:
        """The current scale (on the device: read there, a synchronisation: for logging)."""
        if not self.enabled:
            return 1.0
        return float(self.state[0]) if self.state is not None else float(self._scale)

    def scale(self, loss):
        """The loss multiplied by the current scale (a Tensor stays a Tensor)."""
        if not self.enabled:
            return loss
        return loss * (Tensor(self.state[0]) if self.state is not None else self._scale)

    def update_from(self, factors) -> None:
        """The update on the device: `factors` is the optimizer's [norm, factor, found_inf]
        (AdamW.clip_grad_norm's), read there."""
        opset.loss_scale_update(self.state, factors, self.growth_factor, self.backoff_factor, self.growth_interval,
                                self.dynamic)

    def unscale_(self, params, dist=None) -> bool:
        """Divide every gradient by the scale in place (float32 multiply by 1/S) and return
        whether any gradient holds an inf or NaN. `dist`: the collectives module under DDP,
        so that an inf on one rank makes every rank skip. Once per optimizer step."""
        if not self.enabled:
            return False
        if self.found_inf is not None:
            raise RuntimeError("unscale_() was already called since the last update()")
        inv = np.float32(1.0 / np.float64(self._scale))  # torch: scale.double().reciprocal().float()
        bad = None
        for p in (params.values() if isinstance(params, dict) else params):
            g = p.grad
            if g is None:
                continue
            xp = array_module(g)
            b = xp.logical_not(xp.isfinite(g)).any()
            bad = b if bad is None else bad | b
            g *= g.dtype.type(inv)
        found = bool(bad) if bad is not None else False  # the one host synchronisation
        if dist is not None:
            found = agree_any([found], dist)[0]
        self.found_inf = found
        return found

    def step(self, optimizer, *args, **kwargs) -> bool:
        """optimizer.step(*args, **kwargs) unless the gradients held an inf/NaN (unscales
        first if unscale_ was not called). Returns whether the step was taken."""
        if not self.enabled:
            optimizer.step(*args, **kwargs)
            return True
        if self.found_inf is None:
            self.unscale_([p for _, p in optimizer.named_params()])
        if self.found_inf:
            return False
        optimizer.step(*args, **kwargs)
        return True

    def update(self) -> None:
        """Back off on an inf (and restart the count), grow after growth_interval clean steps
        (torch's _amp_update_scale_: a grown scale that is not finite is not taken)."""
        if not self.enabled:
            return
        if self.found_inf is None:
            raise RuntimeError("update(): no unscale_()/step() since the last update")
        if self.found_inf:
            self.skipped_steps += 1
        if not self.dynamic:
            pass
        elif self.found_inf:
            self._scale = np.float32(self._scale * np.float32(self.backoff_factor))
            self._growth_tracker = 0
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                with np.errstate(over="ignore"):
                    grown = np.float32(self._scale * np.float32(self.growth_factor))
                if np.isfinite(grown):
                    self._scale = grown
                self._growth_tracker = 0
        self.found_inf = None

    def state_dict(self) -> dict:
        if self.state is not None:  # read from the device (a checkpoint is a synchronisation anyway)
            scale, tracker, skipped = (float(v) for v in to_host(self.state))
            self._scale, self._growth_tracker, self.skipped_steps = np.float32(scale), int(tracker), int(skipped)
        return {"scale": float(self._scale), "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "_growth_tracker": self._growth_tracker, "skipped_steps": self.skipped_steps}

    def load_state_dict(self, sd: dict) -> None:
        self._scale = np.float32(sd["scale"])
        self.growth_factor, self.backoff_factor = float(sd["growth_factor"]), float(sd["backoff_factor"])
        self.growth_interval, self._growth_tracker = int(sd["growth_interval"]), int(sd["_growth_tracker"])
        self.skipped_steps = int(sd.get("skipped_steps", 0))
        if self.state is not None:
            self.to_device(array_module(self.state))
