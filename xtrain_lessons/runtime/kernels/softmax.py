"""Softmax rows on the GPU: the launchers for kernels/softmax.cu and their NumPy references (T07b).

The CUDA twins of runtime/host/fused_rows' row kernels, on CuPy arrays (the GPU) or NumPy
arrays (the CPU emulator). The rows are of one storage dtype T (float32, bfloat16, float16);
row statistics are float32; arithmetic is float32, one rounding on store. One launch each, no
host synchronisation.

    causal_softmax_fwd(s, Tq, scale)
        In place over s (..., Tk) seen as rows: row i's query sits at absolute position
        Tk - Tq + (i % Tq) and sees keys 0 .. that position; p = softmax(s * scale) over them
        (scale applied before the max), exactly 0 on the keys after it. 1 <= Tq <= Tk.
    causal_softmax_bwd(p, dp, Tq, scale)
        In place over dp (same shape and dtype as p): dS = P * (dP - rowsum(dP * P)) * scale
        on the seen keys, exactly 0 on the masked ones.
    softmax_exp_rows(x, s, lse)
        x (N, V) in place -> exp(x - rowmax); s = row sums, lse = rowmax + log(s): float32
        arrays of shape (N,) or (N, 1).
    scale_rows(x, f)
        x (N, V) in place: x[r, :] *= f[r], f float32 (N,) or (N, 1).

References (float64, from the stored values): causal_softmax_fwd_reference(s, Tq, scale),
causal_softmax_bwd_reference(p, dp, Tq, scale), softmax_exp_rows_reference(x) -> (e, s, lse)
(fused_rows' ref_causal_softmax_fwd / _bwd and ref_softmax_exp_rows), scale_rows_reference(x, f).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.host.fused_rows import ref_causal_softmax_bwd, ref_causal_softmax_fwd, \
    ref_softmax_exp_rows
from xtrain_lessons.runtime.kernels._common import BLOCK, F32, STORAGE, check, device_of, kernel, \
    name_expression, row_threads

__all__ = ["causal_softmax_fwd", "causal_softmax_bwd", "softmax_exp_rows", "scale_rows",
           "causal_softmax_fwd_reference", "causal_softmax_bwd_reference", "softmax_exp_rows_reference",
           "scale_rows_reference", "NAME_EXPRESSIONS"]

_KERNELS = ("causal_softmax_fwd", "causal_softmax_bwd", "softmax_exp_rows", "scale_rows")
NAME_EXPRESSIONS = tuple(name_expression(k, T) for T in STORAGE for k in _KERNELS)
_FILE = "softmax.cu"


def _rows(fn, name, a, xp):
    check(fn, name, a, xp, STORAGE)
    if a.ndim < 1 or a.shape[-1] == 0:
        raise ValueError(f"{fn}: {name} must have shape (..., Tk) with Tk >= 1, got {tuple(a.shape)}")
    return a.size // a.shape[-1], a.shape[-1]


def _causal(fn, Tq, Tk):
    if not 1 <= int(Tq) <= Tk:
        raise ValueError(f"{fn}: Tq must lie in [1, Tk = {Tk}], got {Tq}")


def _stats(fn, name, a, xp, N):
    check(fn, name, a, xp, (F32,))
    if a.shape not in ((N,), (N, 1)):
        raise ValueError(f"{fn}: {name} must have shape ({N},) or ({N}, 1), got {tuple(a.shape)}")


def causal_softmax_fwd(s, Tq: int, scale: float) -> None:
    fn = "causal_softmax_fwd"
    xp = device_of(fn, "s", s)
    n_rows, Tk = _rows(fn, "s", s, xp)
    _causal(fn, Tq, Tk)
    if n_rows:
        k = kernel(_FILE, name_expression(fn, s.dtype), NAME_EXPRESSIONS, xp)
        k((n_rows,), (row_threads(Tk),), (s, np.int32(Tq), np.int32(Tk), np.float32(scale)))


def causal_softmax_bwd(p, dp, Tq: int, scale: float) -> None:
    fn = "causal_softmax_bwd"
    xp = device_of(fn, "p", p)
    n_rows, Tk = _rows(fn, "p", p, xp)
    check(fn, "dp", dp, xp, (p.dtype,), p.shape)
    _causal(fn, Tq, Tk)
    if n_rows:
        k = kernel(_FILE, name_expression(fn, p.dtype), NAME_EXPRESSIONS, xp)
        k((n_rows,), (row_threads(Tk),), (p, dp, np.int32(Tq), np.int32(Tk), np.float32(scale)))


def _matrix(fn, x, xp):
    check(fn, "x", x, xp, STORAGE)
    if x.ndim != 2:
        raise ValueError(f"{fn}: x must have shape (N, V), got {tuple(x.shape)}")
    return x.shape


def softmax_exp_rows(x, s, lse) -> None:
    fn = "softmax_exp_rows"
    xp = device_of(fn, "x", x)
    N, V = _matrix(fn, x, xp)
    _stats(fn, "s", s, xp, N)
    _stats(fn, "lse", lse, xp, N)
    if N and V:
        k = kernel(_FILE, name_expression(fn, x.dtype), NAME_EXPRESSIONS, xp)
        k((N,), (row_threads(V),), (x, s, lse, np.int32(V)))


def scale_rows(x, f) -> None:
    fn = "scale_rows"
    xp = device_of(fn, "x", x)
    N, V = _matrix(fn, x, xp)
    _stats(fn, "f", f, xp, N)
    if N and V:
        k = kernel(_FILE, name_expression(fn, x.dtype), NAME_EXPRESSIONS, xp)
        k((N,), (BLOCK,), (x, f, np.int32(V)))


def causal_softmax_fwd_reference(s, Tq: int, scale: float):
    return ref_causal_softmax_fwd(np.asarray(s).astype(np.float64), Tq, scale)


def causal_softmax_bwd_reference(p, dp, Tq: int, scale: float):
    return ref_causal_softmax_bwd(np.asarray(p).astype(np.float64), np.asarray(dp).astype(np.float64), Tq, scale)


def softmax_exp_rows_reference(x):
    """(e, s, lse) in float64, s and lse of shape (N, 1)."""
    return ref_softmax_exp_rows(np.asarray(x).astype(np.float64))


def scale_rows_reference(x, f):
    return np.asarray(x).astype(np.float64) * np.asarray(f, np.float64).reshape(-1, 1)
