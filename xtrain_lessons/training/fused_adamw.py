"""FusedAdamW: AdamW whose step is one launch of the fused kernel (kernels/adamw.cu).

    from xtrain_lessons.training.fused_adamw import FusedAdamW
    opt = FusedAdamW(model.named_parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    ...; loss.backward(); opt.step()          # one kernel launch for all parameters

`FusedAdamW` is `optim.AdamW` (same arguments, same parameter groups, same state_dict format)
whose step is ONE launch of `adamw_step` over flat buffers: at construction the parameters
are copied into one flat float32 buffer and each parameter's `.data` becomes a view of it
(create the optimizer after `model.to(device)`; `Model.load_state_dict` writes in place and
keeps working). The gradients have a flat buffer too: each parameter's `grad_buffer` is its view,
where the autograd writes the parameter's gradient (tensor._accumulate_into), so nothing is
gathered at the step. `clip_grad_norm(max_norm)` computes the global norm and the clip factor on
the device over that buffer (kernels/grad_norm.cu, two launches, no host synchronisation); the
next `step` multiplies the gradients by the factor inside its one launch
(`adamw_step_scaled`) and skips the update on the device when the norm was not finite or
`where` is False.
It is meant for the GPU (CuPy arrays); with NumPy arrays the kernel runs on the CPU emulator —
correct but slow, for tests and the T07 notebook only. The CPU engine keeps `optim.AdamW`.

Restrictions: float32 parameters; all groups share lr, betas and eps; the groups that decay
share one weight_decay (the default decay / no-decay split does); every parameter must have a
gradient at each step (optim.AdamW skips a parameter without one; this raises instead).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.runtime.kernels.adamw import adamw_flat, adamw_flat_graphed, adamw_flat_scaled
from xtrain_lessons.runtime.kernels.grad_norm import NORM_GRID, global_norm_and_clip
from xtrain_lessons.training.optim import AdamW

__all__ = ["FusedAdamW"]


class FusedAdamW(AdamW):
    """optim.AdamW with a one-launch step over flat buffers (see the module docstring)."""

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, decay_filter=None, kernel=None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         decay_filter=decay_filter)
        self._kernel = kernel
        g0 = self.groups[0]
        for g in self.groups:
            if (g["lr"], tuple(g["betas"]), g["eps"]) != (g0["lr"], tuple(g0["betas"]), g0["eps"]):
                raise ValueError("FusedAdamW: all parameter groups must share lr, betas and eps")
        decays = {g["weight_decay"] for g in self.groups if g["weight_decay"] != 0.0}
        if len(decays) > 1:
            raise ValueError(f"FusedAdamW: the decayed groups must share one weight_decay, got {decays}")
        self._wd = decays.pop() if decays else 0.0
        # decayed parameters first: the kernel decays elements [0, n_decay)
        ordered = [(n, p) for g in self.groups if g["weight_decay"] != 0.0 for n, p in g["params"]]
        self.n_decay = sum(int(p.data.size) for _, p in ordered)
        ordered += [(n, p) for g in self.groups if g["weight_decay"] == 0.0 for n, p in g["params"]]
        first = ordered[0][1].data
        xp = array_module(first)
        for n, p in ordered:
            if p.data.dtype != np.float32:
                raise ValueError(f"FusedAdamW: {n} is {p.data.dtype}; the kernel is float32")
        total = sum(int(p.data.size) for _, p in ordered)
        self.flat_param = xp.empty(total, dtype=np.float32)
        self.flat_grad = xp.zeros(total, dtype=np.float32)
        self.flat_exp_avg = xp.zeros(total, dtype=np.float32)
        self.flat_exp_avg_sq = xp.zeros(total, dtype=np.float32)
        self._segments = []
        off = 0
        for n, p in ordered:
            size, shape = int(p.data.size), p.data.shape
            view = self.flat_param[off:off + size].reshape(shape)
            view[...] = p.data
            p.data = view  # the parameter now lives in the flat buffer
            p.grad_buffer = self.flat_grad[off:off + size].reshape(shape)  # and its gradient will too
            self._segments.append((n, p, off, size, shape))
            off += size
        self._step = 0
        self._factors = self.last_factors = None  # [norm, gradient factor, skip] on the device (clip_grad_norm)
        self._partials = xp.empty(NORM_GRID, dtype=np.float64)
        self._bind_state()

    def _bind_state(self):
        """state[name] holds views of the flat moment buffers (what state_dict saves)."""
        self.state = {}
        for n, _, off, size, shape in self._segments:
            self.state[n] = {"step": self._step,
                             "exp_avg": self.flat_exp_avg[off:off + size].reshape(shape),
                             "exp_avg_sq": self.flat_exp_avg_sq[off:off + size].reshape(shape)}

    def step(self, lr: float | None = None, where=None, step_scalars=None) -> None:
        """One update of every parameter: gather the gradients, one kernel launch.

        ``where``: a 0-d boolean device array, as in ``optim.AdamW.step``: the update is
        kept only if it is True (the buffers are copied before and restored where it is
        False, on the device: no host synchronisation). The step count advances either way.
        ``step_scalars``: a float32 device array of 3 that the host fills before each step with
        ``adamw_step_scalars`` (a step captured in a CUDA graph: training/cuda_graph.py); the
        kernel reads lr and the bias corrections there instead of taking them by value. Needs
        clip_grad_norm first (its factors)."""
        if lr is not None:
            self.set_lr(lr)
        self._gather()
        factors, self._factors = self._factors, None
        if where is not None:  # skip when `where` is False: factors[2] = max(factors[2], not where)
            factors = self._factors_of(factors)
            skip = array_module(factors).logical_not(where).astype(np.float32)
            factors[2:3] = array_module(factors).maximum(factors[2:3], skip)
        self._step += 1
        g = self.groups[0]
        args = (self._step, g["lr"], g["betas"], g["eps"], self._wd, self.n_decay)
        if step_scalars is not None:
            if factors is None:
                raise ValueError("FusedAdamW.step: step_scalars needs clip_grad_norm's factors (call it first)")
            adamw_flat_graphed(self.flat_param, self.flat_grad, self.flat_exp_avg, self.flat_exp_avg_sq, factors,
                               step_scalars, g["betas"], g["eps"], self.n_decay)
        elif factors is None:  # the plain kernel (T07's exercise can be passed as `kernel`)
            adamw_flat(self.flat_param, self.flat_grad, self.flat_exp_avg, self.flat_exp_avg_sq, *args,
                       kernel=self._kernel)
        else:
            adamw_flat_scaled(self.flat_param, self.flat_grad, self.flat_exp_avg, self.flat_exp_avg_sq, factors, *args)
        for st in self.state.values():
            st["step"] = self._step

    def clip_grad_norm(self, max_norm: float, eps: float = 1e-6, scale_state=None):
        """The gradients' global L2 norm (a float32 device scalar: inf/nan when one is not
        finite) and, for the next step, the factor min(1, max_norm / (norm + eps)) (torch's
        clip_grad_norm_ rule; max_norm <= 0: no clipping). `scale_state`: the fp16 GradScaler's
        device state: the gradients are divided by its scale inside the same factor, the norm is
        that of the unscaled gradients, and a non-finite one skips the step. Returns the norm;
        `last_factors` holds [norm, factor, found_inf] on the device. No host synchronisation."""
        self._gather()
        xp = array_module(self.flat_grad)
        self._factors = self.last_factors = xp.empty(3, dtype=np.float32)
        global_norm_and_clip(self.flat_grad, self._partials, self._factors, max_norm, eps, scale_state=scale_state)
        return self._factors[0]

    def _factors_of(self, factors):
        """`factors`, or [0, 1, 0] (no norm, factor 1, no skip) on the device when none were set."""
        if factors is not None:
            return factors
        return array_module(self.flat_grad).asarray(np.array([0.0, 1.0, 0.0], np.float32))

    def _gather(self) -> None:
        """Every gradient into the flat buffer, unless it is already there (its grad_buffer)."""
        for n, p, off, size, _ in self._segments:
            if p.grad is None:
                raise ValueError(f"FusedAdamW.step: {n} has no gradient (every parameter needs one)")
            if p.grad is not p.grad_buffer:
                self.flat_grad[off:off + size] = p.grad.reshape(-1)

    def load_state_dict(self, sd: dict) -> None:
        """Restore moments and step (they must be equal for all parameters) into the flat buffers."""
        super().load_state_dict(sd)  # validates names and shapes; fills self.state with arrays
        loaded = self.state
        steps = {st["step"] for st in loaded.values()}
        if len(steps) > 1:
            raise ValueError(f"FusedAdamW: parameters have different step counts {sorted(steps)}")
        self._step = steps.pop() if steps else 0
        self.flat_exp_avg[...] = 0
        self.flat_exp_avg_sq[...] = 0
        for n, _, off, size, _ in self._segments:
            st = loaded.get(n, {})
            if "exp_avg" in st:
                self.flat_exp_avg[off:off + size] = st["exp_avg"].reshape(-1)
                self.flat_exp_avg_sq[off:off + size] = st["exp_avg_sq"].reshape(-1)
        self._bind_state()
