"""SGD with (Nesterov) momentum and coupled weight decay, torch.optim.SGD's arithmetic (phase T06)."""

from __future__ import annotations

from typing import Callable

from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.training.optim.base import Optimizer

__all__ = ["SGD"]


class SGD(Optimizer):
    """Stochastic gradient descent, optionally with (Nesterov) momentum and L2 weight decay.

    Same arithmetic as ``torch.optim.SGD``: ``d = g + λθ``; with momentum
    ``b ← μb + (1 − dampening)d`` (``b = d`` on the first step) and ``d = b`` (or
    ``d + μb`` for Nesterov); ``θ ← θ − lr·d``. Weight decay here is coupled (L2), as in torch.
    """

    kind = "SGD"
    slots = ("momentum_buffer",)

    def __init__(self, params, lr: float = 1e-2, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False,
                 decay_filter: Callable | None = None):
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires momentum > 0 and dampening = 0")
        super().__init__(params, dict(lr=float(lr), momentum=float(momentum), dampening=float(dampening),
                                      weight_decay=float(weight_decay), nesterov=bool(nesterov)),
                         decay_filter)

    def step(self, lr: float | None = None) -> None:
        if lr is not None:
            self.set_lr(lr)
        for g in self.groups:
            lr_, mu, damp, wd, nest = g["lr"], g["momentum"], g["dampening"], g["weight_decay"], g["nesterov"]
            for name, p in g["params"]:
                grad = p.grad
                if grad is None:
                    continue
                theta = p.data
                xp = array_module(theta)
                d = xp.asarray(grad).astype(theta.dtype, copy=True)
                if wd != 0.0:
                    d += wd * theta
                st = self.state.setdefault(name, {"step": 0})
                st["step"] += 1
                if mu != 0.0:
                    buf = st.get("momentum_buffer")
                    if buf is None:
                        buf = d.copy()
                        st["momentum_buffer"] = buf
                    else:
                        buf *= mu
                        buf += (1.0 - damp) * d
                    if nest:
                        d += mu * buf
                    else:
                        d = buf
                theta += (-lr_) * d
