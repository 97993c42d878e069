"""AdamW over flat buffers: one update of every parameter in one kernel call (phases T06, T07b).

    opt = AdamW(model.named_parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    loss.backward(); opt.step(lr)                     # torch.optim.AdamW's update
    norm = opt.clip_grad_norm(1.0); opt.step(lr)      # the clip folded into the step (the loop's way)

The arithmetic is torch.optim.AdamW's (single-tensor path), so the two agree to rounding. For a
parameter θ with gradient g at step t (1-based, counted per parameter):

    θ ← θ · (1 − lr·λ)                       decoupled weight decay
    m ← m + (1 − β1)·(g − m)                 = β1·m + (1 − β1)·g
    v ← β2·v + (1 − β2)·g²
    θ ← θ − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + ε)

Flat buffers. At construction the parameters are copied into ONE flat buffer and each parameter's
`.data` becomes a view of it (create the optimizer after `model.to(device)`; `Model.load_state_dict`
writes in place and keeps working). The gradients, m and v have a flat buffer each; a parameter's
`grad_buffer` is its view of the gradients', where the autograd writes the gradient
(tensor._accumulate_into), so nothing is gathered at the step. The update is the op set's `adamw`
over the buffers: one launch on a GPU, one hand-over to the C++ pool on the CPU.

`clip_grad_norm(max_norm)` computes the global norm and the clip factor over the flat gradients
(on a GPU: on the device, no host synchronisation) and the next `step` applies the factor; with
fp16's loss-scale state the gradients are unscaled by the same factor and a step whose gradients
overflowed is skipped. `step(where=...)`: a 0-d boolean device array; the update is kept only if
it is True (the device-side skip of `xtrain train --log-every N`).

Parameter groups. ``AdamW(model.named_parameters(), weight_decay=0.1)`` builds two groups by
default: every parameter with 2 or more dimensions is decayed; every 1-D parameter (RMSNorm gains,
biases) is *not*. Parameters without a gradient are skipped (their step does not advance).
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.training.optim.base import Optimizer, named_list

__all__ = ["AdamW"]


class AdamW(Optimizer):
    """AdamW with decoupled weight decay and bias correction (``torch.optim.AdamW`` semantics).

    ``params``: ``model.named_parameters()`` (dict; default decay/no-decay groups), a list
    of parameters, or a list of group dicts ``{"params": ..., "lr"/"weight_decay"/...}``.
    ``kernel``: another compiled ``adamw_step`` for the update (T07b's exercise).
    """

    kind = "AdamW"
    slots = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, decay_filter: Callable | None = None, kernel=None):
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError("lr, eps and weight_decay must be >= 0")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1): {betas}")
        if not isinstance(params, (Mapping, list, tuple)):
            params = list(params)
        super().__init__(params, dict(lr=float(lr), betas=tuple(float(b) for b in betas),
                                      eps=float(eps), weight_decay=float(weight_decay)),
                         decay_filter)
        self._kernel = kernel
        given = [p for _, p in named_list(params)] if not (isinstance(params, (list, tuple)) and params
                                                     and isinstance(params[0], dict)) else None
        self._lay_out(given)

    def _lay_out(self, given) -> None:
        """The flat buffers, the decayed groups first; `self._norm_order`: the gradients' views in the
        order the parameters were given (the global norm adds them in that order)."""
        ordered = [(n, p, g) for g in self.groups if g["weight_decay"] != 0.0 for n, p in g["params"]]
        ordered += [(n, p, g) for g in self.groups if g["weight_decay"] == 0.0 for n, p in g["params"]]
        first = ordered[0][1].data
        dtype = first.dtype
        for n, p, _ in ordered:
            if p.data.dtype != dtype:
                raise ValueError(f"AdamW: every parameter must have one dtype; {n} is {p.data.dtype}, "
                                 f"{ordered[0][0]} is {dtype}")
        xp = array_module(first)
        total = sum(int(p.data.size) for _, p, _ in ordered)
        self.flat_param = xp.empty(total, dtype=dtype)
        self.flat_grad = xp.zeros(total, dtype=dtype)
        self.flat_exp_avg = xp.zeros(total, dtype=dtype)
        self.flat_exp_avg_sq = xp.zeros(total, dtype=dtype)
        self._layout, self._views, off = [], {}, 0
        for n, p, g in ordered:
            size, shape = int(p.data.size), p.data.shape
            self._views[n] = (self.flat_exp_avg[off:off + size].reshape(shape),
                              self.flat_exp_avg_sq[off:off + size].reshape(shape))
            view = self.flat_param[off:off + size].reshape(shape)
            view[...] = p.data
            p.data = view  # the parameter now lives in the flat buffer
            p.grad_buffer = self.flat_grad[off:off + size].reshape(shape)  # and its gradient will too
            self._layout.append((n, p, g, off, size))
            off += size
        by_id = {id(p): p for _, p, _, _, _ in self._layout}
        self._norm_order = [by_id[id(p)] for p in given if id(p) in by_id] if given else [p for _, p, *_ in self._layout]
        self._zeroed = set(self._views)  # parameters whose moment views are known to be zero
        self._factors = self.last_factors = None  # [norm, gradient factor, skip] on the device (clip_grad_norm)
        self._partials = xp.empty(opset.NORM_GRID, dtype=np.float64)  # the norm's scratch on a GPU

    def _gather(self) -> None:
        """Every gradient into the flat buffer, unless it is already there (its grad_buffer); a
        parameter without one counts as 0 in the norm over the flat buffer."""
        for _, p, _, off, size in self._layout:
            if p.grad is None:
                self.flat_grad[off:off + size] = 0
            elif p.grad is not p.grad_buffer:
                self.flat_grad[off:off + size] = p.grad.reshape(-1)

    def _state_of(self, name: str) -> dict:
        """The state of parameter `name`, its moments views of the flat buffers. Moments set from
        outside (`opt.state[name] = {"step": t, "exp_avg": m, ...}`) are copied into them first."""
        m, v = self._views[name]
        st = self.state.get(name)
        if st is None:
            st = self.state[name] = {"step": 0, "exp_avg": m, "exp_avg_sq": v}
        for slot, view in (("exp_avg", m), ("exp_avg_sq", v)):
            if st.get(slot) is not view:
                view[...] = st[slot] if st.get(slot) is not None else 0
                st[slot] = view
        return st

    def _fresh_moments(self, name: str) -> int:
        """A parameter's first step: its moments zero (they are, unless a state was dropped)."""
        if name not in self._zeroed:
            for view in self._views[name]:
                view[...] = 0
        self._zeroed.discard(name)
        return 1

    def step(self, lr: float | None = None, where=None, step_scalars=None) -> None:
        """One update of every parameter that has a gradient (others are skipped).

        ``where``: a 0-d boolean array on the device; the update is applied only if it is
        True (a skip decided on the device, e.g. "the loss and the gradient norm are
        finite", without a host synchronisation). The step count advances either way (as it does
        for a step the fp16 loss scale skips on a GPU, which only the device knows).
        ``step_scalars``: a float32 device array of 3 that the host fills before each step with
        `next_step_scalars()` (a step captured in a CUDA graph: training/loop/cuda_graph.py); the
        update reads lr and the bias corrections there. Needs clip_grad_norm first."""
        if lr is not None:
            self.set_lr(lr)
        self._gather()
        segments, taken = [], []
        for name, p, g, off, size in self._layout:
            if p.grad is None:
                continue
            step = self._state_of(name)["step"] + 1 if name in self.state else self._fresh_moments(name)
            segments.append(opset.Segment(off, off + size, g["lr"], tuple(g["betas"]), g["eps"], g["weight_decay"], step))
            taken.append(name)
        factors, self._factors = self._factors, None
        if opset.adamw(self.flat_param, self.flat_grad, self.flat_exp_avg, self.flat_exp_avg_sq, segments, factors,
                       where, step_scalars, kernel=self._kernel):
            return  # skipped for fp16's overflow, known here: the step does not count (torch's GradScaler)
        for name in taken:
            self._state_of(name)["step"] += 1

    def clip_grad_norm(self, max_norm: float, eps: float = 1e-6, scale_state=None):
        """The gradients' global L2 norm (a 0-d device array: inf/nan when one is not finite) and,
        for the next step, the factor min(1, max_norm / (norm + eps)) (torch's clip_grad_norm_
        rule; max_norm <= 0: no clipping). `scale_state`: the fp16 GradScaler's device state: the
        gradients are unscaled inside the same factor, the norm is that of the unscaled gradients,
        and a non-finite one skips the step. `last_factors` holds [norm, factor, found_inf] on the
        device. No host synchronisation on a GPU."""
        self._gather()
        grads = [p.grad_buffer for p in self._norm_order if p.grad is not None]
        self._factors = self.last_factors = array_module(self.flat_grad).empty(3, dtype=np.float32)
        return opset.grad_norm_and_clip(grads, self.flat_grad, self._factors, max_norm, eps, scale_state,
                                        self._partials)

    # ----- a step replayed from a CUDA graph (training/loop/cuda_graph.py) --------------------------
    @property
    def step_count(self) -> int:
        """The step every parameter has taken (they must agree: a flat update's)."""
        steps = {st["step"] for st in self.state.values()} or {0}
        if len(steps) > 1:
            raise ValueError(f"AdamW: parameters have different step counts {sorted(steps)}")
        return steps.pop()

    @step_count.setter
    def step_count(self, n: int) -> None:
        for name, *_ in self._layout:
            self._state_of(name)["step"] = int(n)

    def next_step_scalars(self) -> np.ndarray:
        """[decay, bc2_sqrt, neg_step] of the next step, as a float32 host array (what a replayed
        graph's update reads on the device)."""
        g = self.groups[0]
        decays = {grp["weight_decay"] for grp in self.groups if grp["weight_decay"] != 0.0}
        return opset.adamw_step_scalars(self.step_count + 1, g["lr"], g["betas"], decays.pop() if decays else 0.0)

    def load_state_dict(self, sd: dict) -> None:
        """Restore moments and steps (validated by Optimizer.load_state_dict) into the flat buffers."""
        super().load_state_dict(sd)
        loaded, self.state = self.state, {}
        self.flat_exp_avg[...] = 0
        self.flat_exp_avg_sq[...] = 0
        self._zeroed = set(self._views) - set(loaded)
        for name, *_ in self._layout:
            if name in loaded:
                self.state[name] = loaded[name]
                self._state_of(name)  # the moments into the flat buffers
