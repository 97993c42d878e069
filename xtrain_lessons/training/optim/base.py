"""The optimizers' common part: parameter groups, named state, the learning rate, and the state
as safetensors-ready arrays plus JSON (phase T06).

A parameter is anything with a ``.data`` array and a ``.grad`` array (or ``None``): the engine's
``Tensor`` or any stand-in.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import numpy as np

from xtrain_lessons.runtime.device import array_module, to_host

__all__ = ["Optimizer", "default_decay_filter", "named_list", "params_list"]


def default_decay_filter(name: str, param) -> bool:
    """Decay a parameter iff it has two or more dimensions (not norms, not biases)."""
    return np.ndim(param.data) >= 2


def named_list(params) -> list[tuple[str, Any]]:
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
            named = named_list(params)
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
            named = named_list(g["params"])
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
                    tensors[f"{name}.{slot}"] = np.array(to_host(st[slot]), copy=True, order="C")
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




def params_list(params) -> list:
    """The parameters of a dict, a list of (name, p), a list of p, or one parameter."""
    if isinstance(params, Mapping):
        return list(params.values())
    if hasattr(params, "data") and hasattr(params, "grad"):
        return [params]
    return [p[1] if isinstance(p, tuple) else p for p in params]
