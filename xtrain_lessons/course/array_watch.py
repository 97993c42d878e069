"""Arrays that record what a function does with them, for checks that are about how a result is
computed, not only what it is.

`widest_reduction(fn, x, chunk)`: the most values of a row any max / sum reduced at once (a
streamed, online softmax stays within one chunk). `product_entries(fn, q, k, ..., watch=(0, 1))`:
the entries of the matrix products between arrays derived from the watched arguments (the scores
Q·Kᵀ of an attention: a causal flash attention that skips the masked tiles computes half of them).
`ufunc_passes(fn, *arrays)`: every NumPy pass (ufunc call) fn makes over the arrays and what it
derives from them, as (bytes read + written, rows): an elementwise chain on row blocks makes no
pass wider than a block (T07).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np


class _ReductionWatch(np.ndarray):
    """An array that records the widest reduction over its last axis (see widest_reduction)."""

    widest = [0]

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [np.asarray(x) if isinstance(x, _ReductionWatch) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(o) if isinstance(o, _ReductionWatch) else o
                                  for o in kwargs["out"])
        if method == "reduce":
            a, axis = plain[0], kwargs.get("axis", 0)
            axes = range(a.ndim) if axis is None else np.atleast_1d(axis)
            if a.ndim and any(int(ax) % a.ndim == a.ndim - 1 for ax in axes):
                self.widest[0] = max(self.widest[0], a.shape[-1])
        result = getattr(ufunc, method)(*plain, **kwargs)
        if isinstance(result, np.ndarray) and method != "reduce":
            return result.view(_ReductionWatch)
        return result


def widest_reduction(fn: Callable, x: np.ndarray, *args: Any) -> int:
    """Run fn(x, *args); return the most values of x's last axis any max / sum reduced at once.

    A streamed (online) computation over chunks of c values reduces at most c at a time.
    """
    _ReductionWatch.widest[0] = 0
    fn(np.asarray(x).view(_ReductionWatch), *args)
    return _ReductionWatch.widest[0]


_PRODUCTS = (np.dot, np.einsum, np.tensordot, np.inner, np.vdot, np.outer, np.matmul)


def _tags(x: Any) -> frozenset:
    if isinstance(x, _ProductWatch):
        return x._tags
    if isinstance(x, (list, tuple)):
        return frozenset().union(*(_tags(v) for v in x)) if x else frozenset()
    return frozenset()


def _plain(x: Any) -> Any:
    if isinstance(x, _ProductWatch):
        return x.view(np.ndarray)
    if isinstance(x, (list, tuple)):
        return type(x)(_plain(v) for v in x)
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    return x


def _watched(x: Any, tags: frozenset) -> Any:
    if type(x) is np.ndarray and tags:
        x = x.view(_ProductWatch)
        x._tags = tags
        return x
    if isinstance(x, tuple):
        return tuple(_watched(v, tags) for v in x)
    return x


class _ProductWatch(np.ndarray):
    """An array tagged with the arguments it derives from (through slicing, transposing,
    elementwise operations); a matrix product whose operands derive from every watched argument
    between them adds its number of entries to the count (see product_entries)."""

    entries, watching = [0], [frozenset()]

    def __array_finalize__(self, obj):
        self._tags = getattr(obj, "_tags", frozenset())

    def _count(self, operands, result) -> None:
        tagged = [t for t in (_tags(o) for o in operands) if t]
        if len(tagged) >= 2 and frozenset().union(*tagged) >= self.watching[0]:
            self.entries[0] += int(np.size(result))

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        result = getattr(ufunc, method)(*_plain(inputs), **_plain(kwargs))
        if ufunc is np.matmul:
            self._count(inputs, result)
            return result
        return _watched(result, _tags(inputs)) if method == "__call__" else result

    def __array_function__(self, func, types, args, kwargs):
        result = func(*_plain(args), **_plain(kwargs))
        if func in _PRODUCTS:
            self._count([a for a in args if isinstance(a, _ProductWatch)], result)
            return result
        return _watched(result, _tags(list(args)))


def product_entries(fn: Callable, *args: Any, watch: Sequence[int] = (0, 1)) -> int:
    """Run fn(*args); return how many entries the matrix products (`@`, matmul, dot, einsum)
    between arrays derived from the watched arguments computed: with q and k watched, the scores
    S = Q·Kᵀ of an attention. A causal flash attention that skips the key tiles above the diagonal
    computes about half the scores of one that does not.
    """
    _ProductWatch.entries[0], _ProductWatch.watching[0] = 0, frozenset(watch)
    args = list(args)
    for i in watch:
        args[i] = _watched(np.asarray(args[i]), frozenset([i]))
    fn(*args)
    return _ProductWatch.entries[0]


class _Passes(np.ndarray):
    """An array that logs every NumPy pass (ufunc call) over it: (bytes read + written, rows)."""

    log: list[tuple[int, int]] = []

    def __array_ufunc__(self, ufunc, method, *inputs, out=(), **kwargs):
        plain = [np.asarray(a) if isinstance(a, _Passes) else a for a in inputs]
        outs = tuple(np.asarray(o) for o in out)
        result = getattr(ufunc, method)(*plain, **({"out": outs} if out else {}), **kwargs)
        arrays = [a for a in (*plain, *(outs or (result,))) if isinstance(a, np.ndarray)]
        _Passes.log.append((sum(a.nbytes for a in arrays), max(len(a) if a.ndim else 1 for a in arrays)))
        return out[0] if out else result.view(_Passes)


def ufunc_passes(fn: Callable, *arrays: np.ndarray) -> tuple[Any, list[tuple[int, int]]]:
    """(fn(*arrays), [(bytes read + written, rows) of each NumPy pass fn made]).

    A pass is one ufunc call (`a * b`, `np.tanh(a, out=c)`, `c += a`) over the arrays or anything
    computed from them; its rows are the first axis of the widest array it touched.
    """
    _Passes.log = []
    result = fn(*(np.asarray(a).view(_Passes) for a in arrays))
    log, _Passes.log = list(_Passes.log), []
    return result, log
