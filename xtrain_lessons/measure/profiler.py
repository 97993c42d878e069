"""Where the time of a training step goes (phase T07): per-op timing inside the engine, the
phases of a step, and a cProfile summary of the host (Python) overhead.

    from xtrain_lessons.measure.profiler import OpProfiler, step_phases, host_profile
    with OpProfiler() as prof:
        loss = model.loss(ids, targets)
        loss.backward()
    print(prof.report(top=10))        # op, calls, forward ms, backward ms, total, share

OpProfiler
    While active, every op function of the engine (`ops.*`, `layers.linear/rope/causal_attention/
    swiglu`, flash attention, checkpoint, dropout, repeat_kv) is replaced by a timed wrapper
    wherever it is referenced (module globals, `Tensor` methods), and the backward closure of
    every node it makes is wrapped too. Times are EXCLUSIVE: an op called inside another op
    (matmul's reshape, the forward recomputed inside a checkpoint's backward) counts for
    itself, not for its caller. On a GPU the device is synchronised before each clock read, so
    an op is charged for its kernels, not just their launch (this serialises the GPU: profile
    to find where time goes, not to measure the fastest step). A node is named by its
    `make_node` op name (`linear`, `matmul`, `causal_attention`, ...).
    `.stats`: op -> OpStats(calls, forward, backward_calls, backward) in seconds;
    `.table()` rows sorted by total time; `.report(top)` a text table; `.total` seconds;
    `.untimed(elapsed)`: the part of a wall time outside any op.
    Not thread-safe: the patches are process-wide, so profile one training thread at a time.
step_phases(model, optimizer, batch, clip=1.0) -> dict of seconds for the phases of one step:
    forward, backward, clip (gradient norm + scaling), optimizer.
exclusive_times(events) -> {name: seconds}: the same exclusive times from a recorded trace of
    ("enter" | "exit", name, time) events (the reference of T07's first exercise).
host_profile(fn, top=15) -> (result, text): `fn()` under cProfile, the functions with the most
    own time (tottime) as a text table: Python overhead vs time inside NumPy calls.
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import time
from dataclasses import dataclass

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.model import dropout, flash_attention, gqa, layers, recompute
from xtrain_lessons.runtime.device import Timer, synchronize
from xtrain_lessons.training.optim import clip_grad_norm

__all__ = ["OpProfiler", "OpStats", "step_phases", "host_profile", "op_functions", "exclusive_times"]


@dataclass
class OpStats:
    calls: int = 0
    forward: float = 0.0
    backward_calls: int = 0
    backward: float = 0.0

    @property
    def total(self) -> float:
        return self.forward + self.backward


def op_functions() -> dict:
    """function -> name of every engine op the profiler wraps."""
    fns = {}
    for name in ops.__all__:
        fns.setdefault(getattr(ops, name), name)
    for name in ("linear", "linear_cross_entropy", "rope", "causal_attention", "swiglu"):
        fns[getattr(layers, name)] = name
    for mod, name in ((flash_attention, "flash_attention"), (recompute, "checkpoint"),
                      (dropout, "dropout"), (gqa, "repeat_kv")):
        fn = getattr(mod, name, None)
        if callable(fn):
            fns[fn] = name
    return fns


def _synchronize():
    if "cupy" in sys.modules:
        synchronize()


class OpProfiler:
    """Context manager timing every engine op's forward and backward (see module doc)."""
    def __init__(self, sync: bool = True):
        self.sync = sync
        self.stats: dict[str, OpStats] = {}
        self._stack: list[float] = []  # time spent in nested ops, per open op
        self._patched: list = []

    # -- timing ----------------------------------------------------------------------------
    def _timed(self, fn, label, kind):
        prof = self

        def timed(*args, **kwargs):
            if prof.sync:
                _synchronize()
            prof._stack.append(0.0)
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
                if prof.sync:
                    _synchronize()
            finally:
                elapsed = time.perf_counter() - t0
                inner = prof._stack.pop()
                if prof._stack:
                    prof._stack[-1] += elapsed
            name = label
            if kind == "forward":
                if isinstance(out, Tensor):
                    name = out.op if out.op != "leaf" else label
                    if out._backward is not None:
                        out._backward = prof._timed(out._backward, name, "backward")
            st = prof.stats.setdefault(name, OpStats())
            if kind == "forward":
                st.calls += 1
                st.forward += elapsed - inner
            else:
                st.backward_calls += 1
                st.backward += elapsed - inner
            return out

        timed.__wrapped__ = fn
        return timed

    # -- patching --------------------------------------------------------------------------
    def __enter__(self) -> "OpProfiler":

        fns = op_functions()
        wrappers = {fn: self._timed(fn, name, "forward") for fn, name in fns.items()}
        namespaces = [vars(m) for n, m in list(sys.modules.items())
                      if m is not None and (n == "xtrain_lessons" or n.startswith("xtrain_lessons."))]
        for ns in namespaces:
            for attr, value in list(ns.items()):
                try:
                    w = wrappers.get(value)
                except TypeError:  # unhashable
                    continue
                if w is not None:
                    self._patched.append((ns, attr, value))
                    ns[attr] = w
        for attr, value in list(vars(Tensor).items()):
            try:
                w = wrappers.get(value)
            except TypeError:
                continue
            if w is not None:
                self._patched.append((Tensor, attr, value))
                setattr(Tensor, attr, w)
        return self

    def __exit__(self, *exc) -> None:
        for target, attr, value in reversed(self._patched):
            if isinstance(target, dict):
                target[attr] = value
            else:
                setattr(target, attr, value)
        self._patched.clear()

    # -- results ---------------------------------------------------------------------------
    @property
    def total(self) -> float:
        return sum(s.total for s in self.stats.values())

    def table(self) -> list[dict]:
        """Rows (op, calls, forward_ms, backward_ms, total_ms, share), most expensive first."""
        total = self.total or 1.0
        rows = [{"op": op, "calls": s.calls, "forward_ms": s.forward * 1e3,
                 "backward_ms": s.backward * 1e3, "total_ms": s.total * 1e3,
                 "share": s.total / total} for op, s in self.stats.items()]
        return sorted(rows, key=lambda r: -r["total_ms"])

    def report(self, top: int | None = None) -> str:
        rows = self.table()
        shown = rows[:top] if top else rows
        lines = [f"{'op':18s} {'calls':>5s} {'fwd ms':>8s} {'bwd ms':>8s} {'total ms':>9s} {'share':>6s}"]
        for r in shown:
            lines.append(f"{r['op']:18s} {r['calls']:5d} {r['forward_ms']:8.2f} {r['backward_ms']:8.2f} "
                         f"{r['total_ms']:9.2f} {r['share']:6.1%}")
        if len(rows) > len(shown):
            rest = rows[len(shown):]
            lines.append(f"{'(' + str(len(rest)) + ' more)':18s} {sum(r['calls'] for r in rest):5d} "
                         f"{sum(r['forward_ms'] for r in rest):8.2f} {sum(r['backward_ms'] for r in rest):8.2f} "
                         f"{sum(r['total_ms'] for r in rest):9.2f} {sum(r['share'] for r in rest):6.1%}")
        lines.append(f"{'total in ops':18s} {'':5s} {'':8s} {'':8s} {self.total * 1e3:9.2f}")
        return "\n".join(lines)

    def untimed(self, elapsed: float) -> float:
        """Seconds of `elapsed` spent outside every op (graph walk, Python glue)."""
        return elapsed - self.total


def exclusive_times(events) -> dict[str, float]:
    """{name: exclusive seconds} of a trace of (kind, name, time) events, kind "enter" or "exit",
    properly nested: each call's time minus the time of the calls made inside it (OpProfiler's rule,
    with its stack). A name called inside itself counts each call for its own part."""
    times: dict[str, float] = {}
    stack: list[list] = []  # [name, start, time spent in calls inside it], per open call
    for kind, name, t in events:
        if kind == "enter":
            stack.append([name, t, 0.0])
            continue
        opened, start, inner = stack.pop()
        if opened != name:
            raise ValueError(f"exit of {name!r} while {opened!r} is open: the events are not nested")
        elapsed = t - start
        times[name] = times.get(name, 0.0) + elapsed - inner
        if stack:
            stack[-1][2] += elapsed
    if stack:
        raise ValueError(f"{stack[-1][0]!r} never exits")
    return times


def step_phases(model, optimizer, batch, clip: float | None = 1.0) -> dict:
    """Seconds of the phases of one training step on batch = (ids, targets)."""
    ids, targets = batch
    params = model.named_parameters()
    model.zero_grad()
    out = {}
    with Timer() as t:
        loss = model.loss(ids, targets)
    out["forward"] = t.elapsed
    with Timer() as t:
        loss.backward()
    out["backward"] = t.elapsed
    if clip is not None:
        with Timer() as t:
            clip_grad_norm(params, clip)
        out["clip"] = t.elapsed
    with Timer() as t:
        optimizer.step()
    out["optimizer"] = t.elapsed
    return out


def host_profile(fn, top: int = 15):
    """(fn(), text): cProfile of fn, the `top` functions by own time (tottime)."""
    prof = cProfile.Profile()
    result = prof.runcall(fn)
    buf = io.StringIO()
    stats = pstats.Stats(prof, stream=buf)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    text = buf.getvalue()
    # drop pstats' header lines up to the table
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    return result, "\n".join(line for line in lines[start:] if line.strip())
