"""The lm_head's cross-entropy on the GPU: the launchers for kernels/cross_entropy.cu and their
NumPy references (T07b).

llm.c's fused classifier split in two, so that the upstream gradient arrives later:

    cross_entropy_fwd(logits, targets, s, lse, losses, ignore_index=-100)
        logits (N, V) of T (float32, bfloat16, float16), in place -> e = exp(logits - rowmax);
        targets (N,) int64; s, lse, losses float32 (N,): s = row sums of e, lse = rowmax + log(s),
        losses[r] = lse[r] - logits[r, t_r], 0 where t_r == ignore_index (NaN for a target
        outside [0, V): the caller checks the targets, the launcher never reads them).
    cross_entropy_bwd(e, s, targets, dloss, inv_count, ignore_index=-100)
        In place over e: d loss / d logits = (e / s - onehot(t)) * dloss[0] * inv_count for valid
        rows, exactly 0 for ignored rows. dloss: float32 device array of shape (1,) or () — the
        gradient of the mean loss, read by the kernel; inv_count: a Python/NumPy float, 1 / the
        number of valid targets (known on the host).
    mean_loss(losses, inv_count, out)
        out (a float32 array of shape () or (1,)) = sum(losses) * inv_count, by one block: a
        fixed summation order, the same bits on every run.

One launch each, no host synchronisation. Arithmetic is float32, one rounding on store.
References (float64): cross_entropy_fwd_reference(logits, targets, ignore_index) ->
(e, s, lse, losses); cross_entropy_bwd_reference(e, s, targets, dloss, inv_count, ignore_index);
mean_loss_reference(losses, inv_count).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.host.fused_rows import ref_softmax_exp_rows
from xtrain_lessons.runtime.kernels._common import F32, STORAGE, check, device_of, kernel, name_expression, \
    row_threads

__all__ = ["cross_entropy_fwd", "cross_entropy_bwd", "mean_loss", "cross_entropy_fwd_reference",
           "cross_entropy_bwd_reference", "mean_loss_reference", "NAME_EXPRESSIONS", "IGNORE_INDEX"]

NAME_EXPRESSIONS = (*(name_expression(k, T) for T in STORAGE for k in ("cross_entropy_fwd", "cross_entropy_bwd")),
                    "mean_loss")
IGNORE_INDEX = -100  # torch's default
MEAN_BLOCK = 256
_FILE = "cross_entropy.cu"
_I64 = np.dtype(np.int64)


def _logits(fn, name, x, xp):
    check(fn, name, x, xp, STORAGE)
    if x.ndim != 2:
        raise ValueError(f"{fn}: {name} must have shape (N, V), got {tuple(x.shape)}")
    return x.shape


def cross_entropy_fwd(logits, targets, s, lse, losses, ignore_index: int = IGNORE_INDEX) -> None:
    fn = "cross_entropy_fwd"
    xp = device_of(fn, "logits", logits)
    N, V = _logits(fn, "logits", logits, xp)
    check(fn, "targets", targets, xp, (_I64,), (N,))
    for name, a in (("s", s), ("lse", lse), ("losses", losses)):
        check(fn, name, a, xp, (F32,), (N,))
    if N and V:
        k = kernel(_FILE, name_expression(fn, logits.dtype), NAME_EXPRESSIONS, xp)
        k((N,), (row_threads(V),), (logits, targets, s, lse, losses, np.int32(V), np.int64(ignore_index)))


def cross_entropy_bwd(e, s, targets, dloss, inv_count: float, ignore_index: int = IGNORE_INDEX) -> None:
    fn = "cross_entropy_bwd"
    xp = device_of(fn, "e", e)
    N, V = _logits(fn, "e", e, xp)
    check(fn, "s", s, xp, (F32,), (N,))
    check(fn, "targets", targets, xp, (_I64,), (N,))
    check(fn, "dloss", dloss, xp, (F32,))
    if dloss.shape not in ((), (1,)):
        raise ValueError(f"{fn}: dloss must have shape () or (1,), got {tuple(dloss.shape)}")
    if N and V:
        k = kernel(_FILE, name_expression(fn, e.dtype), NAME_EXPRESSIONS, xp)
        k((N,), (row_threads(V),), (e, s, targets, dloss, np.float32(inv_count), np.int32(V), np.int64(ignore_index)))


def mean_loss(losses, inv_count: float, out) -> None:
    fn = "mean_loss"
    xp = device_of(fn, "losses", losses)
    check(fn, "losses", losses, xp, (F32,))
    if losses.ndim != 1:
        raise ValueError(f"{fn}: losses must have shape (N,), got {tuple(losses.shape)}")
    check(fn, "out", out, xp, (F32,))
    if out.shape not in ((), (1,)):
        raise ValueError(f"{fn}: out must have shape () or (1,), got {tuple(out.shape)}")
    k = kernel(_FILE, "mean_loss", NAME_EXPRESSIONS, xp)
    k((1,), (MEAN_BLOCK,), (losses, np.int32(losses.size), np.float32(inv_count), out))


def cross_entropy_fwd_reference(logits, targets, ignore_index: int = IGNORE_INDEX):
    """(e, s, lse, losses) in float64 from the stored logits; s, lse, losses of shape (N,)."""
    x = np.asarray(logits).astype(np.float64)
    t = np.asarray(targets)
    e, s, lse = ref_softmax_exp_rows(x)
    valid = t != ignore_index
    x_t = x[np.arange(len(x)), np.where(valid, t, 0)]
    losses = np.where(valid, lse[:, 0] - x_t, 0.0)
    return e, s[:, 0], lse[:, 0], losses


def cross_entropy_bwd_reference(e, s, targets, dloss, inv_count: float, ignore_index: int = IGNORE_INDEX):
    """(e / s - onehot(t)) * dloss * inv_count per valid row, 0 for ignored rows (float64)."""
    e64 = np.asarray(e).astype(np.float64)
    t = np.asarray(targets)
    valid = t != ignore_index
    d = e64 / np.asarray(s, np.float64).reshape(-1, 1)
    d[np.arange(len(d))[valid], t[valid]] -= 1.0
    d *= float(np.asarray(dloss).reshape(-1)[0]) * float(inv_count)
    d[~valid] = 0.0
    return d


def mean_loss_reference(losses, inv_count: float) -> float:
    return float(np.asarray(losses, np.float64).sum() * inv_count)
