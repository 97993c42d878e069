"""What both graphed steps of loop/cuda_graph.py share (phase T07b): a step captured once per key
(a batch shape) and replayed, the graphs of the last `cache_size` keys kept, each capture checked
bit for bit against the eager step; see cuda_graph.py's module doc.

The capture goes through the device (device.capture_graph: a stream and a memory pool of the
graphs' own), the comparison reads one array of flags on the host (the one synchronisation).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from xtrain_lessons.runtime.device import capture_graph, synchronize, to_host

__all__ = ["GraphCache"]


class _Entry:
    """One batch shape's device buffers and, once captured, its graph and the arrays it writes."""

    def __init__(self, xp, shape):
        self.ids = xp.empty(shape, np.int64)
        self.targets = xp.empty(shape, np.int64)
        self.graph = self.outs = None
        self.before = self.after = None  # the host's bookkeeping before and after the captured step


class GraphCache:
    """What both graphed steps share: a step (`_body`, on an entry's buffers) captured once per key
    and replayed, the graphs of the last `cache_size` keys kept, each capture checked bit for bit
    against the eager step (see the module doc). A subclass names the state the step carries
    (`_state`: device arrays, compared and restored), the host's bookkeeping (`_host` / `_set_host`)
    and what a replay must do on the host (`_after_replay`)."""

    def __init__(self, xp, warmup: int = 2, cache_size: int = 4):
        if cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {cache_size}")
        self.xp = xp  # the array module of the device the step runs on
        self.warmup, self.cache_size = warmup, cache_size
        self.cache: OrderedDict = OrderedDict()  # key -> _Entry, least recently used first
        self.reason = None  # why the step runs eagerly (None while graphs are used)
        self.calls = self.captures = self.replays = 0
        self._keep = None  # the graphs' memory pool and stream (device.capture_graph)

    @property
    def graph(self):
        """The graph of the last shape used (None before its capture, or once eager)."""
        entry = next(reversed(self.cache.values()), None)
        return None if entry is None or self.reason is not None else entry.graph

    def _entry(self, key, shape) -> _Entry:
        entry = self.cache.get(key)
        if entry is not None:
            self.cache.move_to_end(key)
            return entry
        self.cache[key] = entry = _Entry(self.xp, shape)
        if len(self.cache) > self.cache_size:  # a graph may still run: wait before dropping one (rare)
            synchronize()
            self.cache.popitem(last=False)
        return entry

    def _run(self, entry):
        """The step on `entry`: replayed, or captured and checked, or eager. Returns its outputs."""
        if entry.graph is None:
            return self._capture_and_check(entry)
        entry.graph.launch()
        self.replays += 1
        self._after_replay(entry)
        return entry.outs

    # -- the subclass's part ----------------------------------------------------------------
    def _body(self, entry) -> tuple:
        raise NotImplementedError

    def _state(self) -> tuple:
        raise NotImplementedError

    def _host(self):
        raise NotImplementedError

    def _set_host(self, host) -> None:
        raise NotImplementedError

    def _after_replay(self, entry) -> None:
        raise NotImplementedError

    # -- capture, replay once, compare with the eager step ------------------------------------
    def _capture_and_check(self, entry):
        xp = self.xp
        state = self._state()
        before, host0 = [a.copy() for a in state], self._host()
        eager_outs = tuple(o.copy() for o in self._body(entry))
        eager, host1 = [a.copy() for a in state], self._host()
        try:
            self._restore(before, host0)
            entry.outs, entry.graph = self._capture(entry)
            self.captures += 1
            entry.before, entry.after = host0, self._host()  # (after: with the arrays the graph writes)
            self._restore(before, host0)  # (the CPU stand-in ran the step while capturing it)
            entry.graph.launch()
            self._after_replay(entry)
            got, want = (*entry.outs, *state), (*eager_outs, *eager)
            same = to_host(xp.stack([xp.array_equal(a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8))
                                     for a, b in zip(got, want)]))  # the one host synchronisation
            differs = [self._name(i) for i, ok in enumerate(same) if not ok]
            if differs:
                self.reason = "the replayed graph differs from the eager step in " + ", ".join(differs)
        except Exception as e:  # noqa: BLE001 - whatever the capture meets, the step goes on eagerly
            self.reason = f"the capture failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
        if self.reason is None:
            return entry.outs
        entry.graph = entry.outs = None  # keep the eager step's result
        self._restore(eager, host1)
        return eager_outs

    def _name(self, i: int) -> str:
        return f"output {i}"

    def _restore(self, arrays, host) -> None:
        for a, b in zip(self._state(), arrays):
            a[...] = b
        self._set_host(host)

    def _capture(self, entry):
        """(the arrays the graph writes, the graph): the step recorded on a stream of its own, its
        temporaries from a memory pool of its own (one for all the shapes' graphs: they never run
        at the same time, and each writes a temporary before it reads it)."""
        outs, graph, self._keep = capture_graph(lambda: self._body(entry), keep=self._keep)
        return outs, graph
