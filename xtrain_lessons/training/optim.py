"""Optimizers: AdamW (decoupled weight decay) and SGD, written on plain arrays.

A parameter is anything with a ``.data`` array and a ``.grad`` array (or ``None``):
the engine's ``Tensor`` or any stand-in. Updates are done in place on ``.data``, in
the parameter's own dtype, following the arithmetic of ``torch.optim.AdamW`` /
``torch.optim.SGD`` (single-tensor path), so the two agree to rounding (not bit for bit:
one step can differ by an ulp).

AdamW, for a parameter θ with gradient g at step t (1-based, counted per parameter):

    θ ← θ · (1 − lr·λ)                       decoupled weight decay
    m ← m + (1 − β1)·(g − m)                 = β1·m + (1 − β1)·g
    v ← β2·v + (1 − β2)·g²
    θ ← θ − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + ε)

Parameter groups. ``AdamW(model.named_parameters(), weight_decay=0.1)`` builds two
groups by default: every parameter with 2 or more dimensions (embedding, projections,
lm_head) is decayed; every 1-D parameter (RMSNorm / QK-norm gains, biases) is *not*
decayed, because shrinking a norm gain towards 0 fights the normalisation instead of
regularising the model. Pass ``decay_filter=`` to choose otherwise, a plain list of
parameters (one group, all decayed), or explicit groups::

    AdamW([{"params": {"w": w}, "weight_decay": 0.1}, {"params": {"g": g}, "weight_decay": 0.0}])

State. ``state_dict()`` returns ``{"tensors": {name: array}, "meta": {...}}``: the moment
arrays keyed ``"<param name>.exp_avg"`` / ``".exp_avg_sq"`` (``".momentum_buffer"`` for
SGD) and a JSON-able ``meta`` with the hyper-parameters, group layout and per-parameter
step counts. That is what a checkpoint stores (safetensors + JSON, no pickle).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from xtrain_lessons.runtime.cpu_threads import map_items, map_rows
from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.runtime.host import fused_rows

__all__ = [
    "AdamW",
    "SGD",
    "Optimizer",
    "clip_grad_norm",
    "global_grad_norm",
    "default_decay_filter",
]


def default_decay_filter(name: str, param) -> bool:
    """Decay a parameter iff it has two or more dimensions (not norms, not biases)."""
    return np.ndim(param.data) >= 2


def _named(params) -> list[tuple[str, Any]]:
    """Normalise dict / list of (name, p) / list of p to a list of (name, p)."""
    if isinstance(params, Mapping):
        return [(str(k), v) for k, v in params.items()]
    out = []
    for i, p in enumerate(params):
        if isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str):
            out.append(p)
        else:
            out.append((str(i), p))
    return out


class Optimizer:
    """Base class: parameter groups, named state, lr control, (de)serialisation."""

    kind = "Optimizer"
    #: per-parameter state arrays this optimizer keeps (names of the slots)
    slots: tuple[str, ...] = ()

    def __init__(self, params, defaults: dict, decay_filter: Callable | None = None):
        self.defaults = dict(defaults)
        self.groups: list[dict] = []
        self.state: dict[str, dict] = {}  # name -> {"step": int, slot: array}
        if isinstance(params, (list, tuple)) and params and isinstance(params[0], dict):
            raw_groups = list(params)  # explicit groups
        else:
            is_named = isinstance(params, Mapping)
            named = _named(params)
            if decay_filter is not None or (is_named and "weight_decay" in defaults):
                flt = decay_filter or default_decay_filter
                decay = [(n, p) for n, p in named if flt(n, p)]
                no_decay = [(n, p) for n, p in named if not flt(n, p)]
                raw_groups = []
                if decay:
                    raw_groups.append({"params": decay})
                if no_decay:
                    raw_groups.append({"params": no_decay, "weight_decay": 0.0})
            else:
                raw_groups = [{"params": named}]
        seen = set()
        explicit = raw_groups is not None and isinstance(params, (list, tuple)) and params \
            and isinstance(params[0], dict)
        for gi, g in enumerate(raw_groups):
            group = {k: v for k, v in self.defaults.items()}
            group.update({k: v for k, v in g.items() if k != "params"})
            named = _named(g["params"])
            if explicit and not isinstance(g["params"], Mapping):
                # unnamed parameters of explicit groups: name them "<group>.<index>"
                named = [(n if not n.isdigit() else f"{gi}.{n}", p) for n, p in named]
            for n, _ in named:
                if n in seen:
                    raise ValueError(f"parameter {n!r} appears in more than one group")
                seen.add(n)
            group["params"] = named
            self.groups.append(group)
        if not self.groups or not any(g["params"] for g in self.groups):
            raise ValueError("optimizer got an empty parameter list")

    # ----- learning rate -------------------------------------------------
    @property
    def lr(self) -> float:
        return self.groups[0]["lr"]

    @lr.setter
    def lr(self, value: float) -> None:
        self.set_lr(value)

    def set_lr(self, lr: float) -> None:
        """Set the learning rate of every group (what a schedule calls each step)."""
        for g in self.groups:
            g["lr"] = float(lr)

    def named_params(self):
        for g in self.groups:
            yield from g["params"]

    def zero_grad(self) -> None:
        """Drop every gradient (``.grad = None``), so the next backward starts clean."""
        for _, p in self.named_params():
            p.grad = None

    def step(self, lr: float | None = None) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    # ----- state ---------------------------------------------------------
    _hyper = ("lr",)

    def state_dict(self) -> dict:
        """``{"tensors": {key: array}, "meta": JSON-able dict}`` (arrays are copies on the host)."""
        tensors = {}
        steps = {}
        for name, st in self.state.items():
            steps[name] = int(st["step"])
            for slot in self.slots:
                if slot in st and st[slot] is not None:
                    a = st[slot]
                    a = a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.array(a)
                    tensors[f"{name}.{slot}"] = np.ascontiguousarray(a)
        groups = []
        for g in self.groups:
            gd = {k: (list(v) if isinstance(v, tuple) else v) for k, v in g.items() if k != "params"}
            gd["params"] = [n for n, _ in g["params"]]
            groups.append(gd)
        meta = {"type": self.kind, "groups": groups, "step": steps}
        return {"tensors": tensors, "meta": meta}

    def load_state_dict(self, sd: dict) -> None:
        """Restore from :meth:`state_dict` output. Names and shapes must match."""
        meta, tensors = sd["meta"], sd["tensors"]
        if meta.get("type") != self.kind:
            raise ValueError(f"optimizer state is for {meta.get('type')!r}, this is {self.kind!r}")
        mine = [[n for n, _ in g["params"]] for g in self.groups]
        theirs = [list(g["params"]) for g in meta["groups"]]
        if mine != theirs:
            raise ValueError("optimizer state has different parameter groups/names than this optimizer")
        for g, gd in zip(self.groups, meta["groups"]):
            for k, v in gd.items():
                if k == "params":
                    continue
                g[k] = tuple(v) if isinstance(v, list) else v
        params = dict(self.named_params())
        self.state = {}
        for name, step in meta["step"].items():
            if name not in params:
                raise ValueError(f"optimizer state for unknown parameter {name!r}")
            p = params[name]
            xp = array_module(p.data)
            st: dict = {"step": int(step)}
            for slot in self.slots:
                key = f"{name}.{slot}"
                if key in tensors:
                    a = np.asarray(tensors[key])
                    if a.shape != tuple(p.data.shape):
                        raise ValueError(f"{key}: shape {a.shape} != parameter shape {tuple(p.data.shape)}")
                    st[slot] = xp.array(a, dtype=p.data.dtype)
            self.state[name] = st


class AdamW(Optimizer):
    """AdamW with decoupled weight decay and bias correction (``torch.optim.AdamW`` semantics).

    ``params``: ``model.named_parameters()`` (dict; default decay/no-decay groups), a list
    of parameters, or a list of group dicts ``{"params": ..., "lr"/"weight_decay"/...}``.
    """

    kind = "AdamW"
    slots = ("exp_avg", "exp_avg_sq")

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, decay_filter: Callable | None = None):
        if lr < 0 or eps < 0 or weight_decay < 0:
            raise ValueError("lr, eps and weight_decay must be >= 0")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must be in [0, 1): {betas}")
        super().__init__(params, dict(lr=float(lr), betas=tuple(float(b) for b in betas),
                                      eps=float(eps), weight_decay=float(weight_decay)),
                         decay_filter)

    def step(self, lr: float | None = None, where=None) -> None:
        """One update of every parameter that has a gradient (others are skipped).

        ``where``: a 0-d boolean array on the device; the update is applied only if it is
        True (a skip decided on the device, e.g. "the loss and the gradient norm are
        finite", without a host synchronisation). The step count advances either way."""
        if lr is not None:
            self.set_lr(lr)
        updates = []  # (arrays, hyperparameters) of every parameter, run together below
        for g in self.groups:
            lr_, (b1, b2), eps, wd = g["lr"], g["betas"], g["eps"], g["weight_decay"]
            for name, p in g["params"]:
                grad = p.grad
                if grad is None:
                    continue
                theta = p.data
                xp = array_module(theta)
                grad = xp.asarray(grad)
                if grad.dtype != theta.dtype:
                    grad = grad.astype(theta.dtype)
                st = self.state.get(name)
                if st is None:
                    st = {"step": 0, "exp_avg": xp.zeros_like(theta), "exp_avg_sq": xp.zeros_like(theta)}
                    self.state[name] = st
                st["step"] += 1
                t = st["step"]
                bc1 = 1.0 - b1 ** t
                bc2_sqrt = math.sqrt(1.0 - b2 ** t)
                updates.append(((theta, grad, st["exp_avg"], st["exp_avg_sq"]),
                                (lr_, b1, b2, eps, wd, bc1, bc2_sqrt, where)))
        _adamw_updates(updates)


def _adamw_update(theta, grad, m, v, lr, b1, b2, eps, wd, bc1, bc2_sqrt, where=None):
    """One AdamW update of one parameter (or a slice of it), in place. With `where` (a 0-d
    boolean array) the new values are computed aside and copied in only where it is True:
    the same arithmetic, so the same bits as the in-place update when it is applied."""
    xp = array_module(theta)
    if where is not None:
        theta_new, m_new, v_new = theta.copy(), m.copy(), v.copy()
        _adamw_update(theta_new, grad, m_new, v_new, lr, b1, b2, eps, wd, bc1, bc2_sqrt)
        for dst, src in ((theta, theta_new), (m, m_new), (v, v_new)):
            xp.copyto(dst, src, where=where)
        return
    if wd != 0.0:
        theta *= 1.0 - lr * wd
    # m ← m + (1−β1)(g − m): torch's lerp, written the same way
    m += (1.0 - b1) * (grad - m)
    v *= b2
    v += (1.0 - b2) * (grad * grad)
    denom = xp.sqrt(v)
    denom /= bc2_sqrt
    denom += eps
    theta += (-(lr / bc1)) * (m / denom)


def _adamw_updates(updates):
    """Every parameter's update, spread over the engine's threads in ONE cpu_threads.map_rows:
    the parameters, flattened, are laid end to end as one long row of numbers, and each
    thread updates the pieces of its span. Elementwise, so the same bits on any split; one
    hand-over to the pool per step instead of one per parameter. The float32 NumPy ones go
    to runtime/host's C++ AdamW first (one hand-over to its pool, the same bits)."""
    flat, spans, end = [], [], 0
    for arrays, hyper in fused_rows.adamw_arrays(updates):
        theta = arrays[0]
        if isinstance(theta, np.ndarray) and all(a.flags.c_contiguous for a in arrays):
            flat.append(([a.reshape(-1) for a in arrays], hyper))
            spans.append((end, end + theta.size))
            end += theta.size
        else:  # CuPy, or a layout whose flat view would be a copy: one whole update
            _adamw_update(*arrays, *hyper)
    if not flat:
        return
    starts = np.array([lo for lo, _ in spans])

    def run(lo, hi):
        i = int(np.searchsorted(starts, lo, side="right")) - 1
        while i < len(spans) and spans[i][0] < hi:
            a, b = spans[i]
            piece = slice(max(lo, a) - a, min(hi, b) - a)
            arrays, hyper = flat[i]
            _adamw_update(*(x[piece] for x in arrays), *hyper)
            i += 1

    map_rows(run, end, flat[0][0][0].itemsize)


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


# ----- gradient clipping ---------------------------------------------------

def _params_list(params) -> list:
    if isinstance(params, Mapping):
        return list(params.values())
    if hasattr(params, "data") and hasattr(params, "grad"):
        return [params]
    return [p[1] if isinstance(p, tuple) else p for p in params]


def global_grad_norm(params, sync: bool = True):
    """‖(g₁, g₂, …)‖₂ over every parameter that has a gradient (accumulated in float64).

    A Python float (one host synchronisation), or with ``sync=False`` a 0-d float64 array
    left on the device (the same number)."""
    grads = [p.grad for p in _params_list(params) if p.grad is not None]
    if not grads:
        return 0.0 if sync else np.zeros((), dtype=np.float64)
    xp = array_module(grads[0])
    sums = fused_rows.sum_squares(grads)  # float32 on the CPU: C++, one task per gradient
    if sums is not None:
        total = 0.0
        for s in sums:  # in parameter order
            total += float(s)
        return math.sqrt(total) if sync else np.sqrt(np.float64(total))

    def square_sums(i, j):  # whole gradients, one reduction each: the same bits on any split
        return [xp.sum(xp.square(g.astype(np.float64, copy=False))) for g in grads[i:j]]

    total = None  # summed on the device, in parameter order
    for group in map_items(square_sums, [g.size for g in grads], like=grads[0]):
        for s in group:
            total = s if total is None else total + s
    return math.sqrt(float(total)) if sync else xp.sqrt(total)


def _scale_grads(plist, coef_as):
    """p.grad *= coef_as(p.grad.dtype) for every parameter, spread over the engine's threads."""
    def scale(i, j):
        for p in plist[i:j]:
            p.grad *= coef_as(p.grad.dtype)

    if plist and not fused_rows.scale_arrays([p.grad for p in plist], coef_as(np.dtype(np.float32))):
        map_items(scale, [p.grad.size for p in plist], like=plist[0].grad)


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
    plist = [p for p in _params_list(params) if p.grad is not None]
    if not sync:  # the same rule as a device computation: scale by 1 when not clipping
        norm = global_grad_norm(plist, sync=False)
        xp = array_module(norm)
        coef = float(max_norm) / (norm + eps)
        coef = xp.where(xp.isfinite(norm) & (coef < 1.0), coef, 1.0)
        if plist:
            _scale_grads(plist, coef.astype)
        return norm
    norm = global_grad_norm(plist)
    if not math.isfinite(norm):
        return norm
    coef = float(max_norm) / (norm + eps)
    if coef < 1.0 and plist:
        _scale_grads(plist, lambda dtype: dtype.type(coef))
    return norm
