"""The classifier and its loss: the lm_head fused with the cross-entropy, and the plain
cross-entropy of given logits (phases T04, T06, T07).

    t, n_valid = check_targets(targets, lead_shape, V, ignore_index)     # on the host, once
    loss, saved = linear_cross_entropy_fwd(x, w, t, n_valid, ignore_index)
    dx, dw = linear_cross_entropy_bwd(g, saved, x, w, want_x, want_w)
    loss, saved = cross_entropy_fwd(logits, t, n_valid, ignore_index)
    dlogits = cross_entropy_bwd(g, saved)

`linear_cross_entropy_*`: cross_entropy(x @ w.T, t) for x (N, in), w (V, in), without keeping
the (N, V) logits twice: ONE (N, V) buffer holds the logits, then exp(logits - max) in their place,
then (in the backward, in place) d loss / d logits, which makes dx and dW and is let go (so the
backward runs once: a second call raises).
  * GPU: llm.c's fused classifier. The logits by cuBLAS, then one kernel per row turns them into
    exp(logits - max) in place with the row's loss, and the backward's kernel turns that into
    d loss / d logits reading the upstream gradient on the device (no host synchronisation);
    then dx and dW by cuBLAS.
  * CPU: the products on the engine's threads (runtime/cpu_threads.py), then the C++ softmax rows
    over all of them; where no kernel applies, each chunk of rows of the product (the chunks a
    2-D product is cut into) computes its logits and at once, while they are in cache, exp(logits
    - max) in their place.
The loss is the mean over the targets that are not ignore_index (nan when none is: 0/0, as torch).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime import blas, cpu_threads
from xtrain_lessons.runtime.allocator import empty
from xtrain_lessons.runtime.device import array_module, to_host
from xtrain_lessons.runtime.kernels import cross_entropy as _ce
from xtrain_lessons.runtime.opset import dispatch, lowp
from xtrain_lessons.runtime.opset.casts import cast, is_low
from xtrain_lessons.runtime.opset.products import matmul, matmuls, right_operand
from xtrain_lessons.runtime.opset.rows import _softmax_block, scale_rows, softmax_rows
from xtrain_lessons.runtime.opset.table import op

__all__ = ["check_targets", "linear_cross_entropy_fwd", "linear_cross_entropy_bwd", "cross_entropy_fwd",
           "cross_entropy_bwd"]


def check_targets(targets, lead_shape, V: int, ignore_index: int):
    """(targets as int64 (N,) on the host, the number of valid ones), checked there: integers of
    shape `lead_shape`, each in [0, V) or ignore_index. Free for host targets, as a training batch's
    are (device targets are copied to the host: one synchronisation)."""
    t = to_host(targets)
    if t.shape != tuple(lead_shape):
        raise ValueError(f"cross_entropy: logits shape {(*lead_shape, V)} and targets shape {t.shape} do not "
                         f"match (expected targets {tuple(lead_shape)})")
    if t.dtype.kind not in "iu":
        raise TypeError(f"cross_entropy: targets must be integers, got {t.dtype}")
    t = t.reshape(-1).astype(np.int64, copy=False)
    valid = t != ignore_index
    if valid.any() and (t[valid].min() < 0 or t[valid].max() >= V):
        raise ValueError(f"cross_entropy: targets must lie in [0, {V}) or equal ignore_index={ignore_index}")
    return t, int(valid.sum())


def _mean_valid_loss(losses, valid, n_valid):
    """The mean of the per-row losses over the valid rows (nan if none), a 0-d array."""
    xp = array_module(losses)
    with np.errstate(invalid="ignore", divide="ignore"):
        loss = (losses * valid).sum() / n_valid.astype(losses.dtype)
    return xp.asarray(loss, dtype=losses.dtype)


def _grad_factors(g, s, valid, n_valid):
    """(f (N, 1), scale (N,)) of d loss / d logits = e * f - onehot(target) * scale, for the
    upstream gradient g of the mean loss (softmax = e / s)."""
    dt = s.dtype
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = valid.astype(dt) * (g / n_valid.astype(dt)).astype(dt)  # (N,)
    return (scale / s[:, 0])[:, None], scale


def _rows_of(t, ignore_index: int, xp):
    """(t_safe (N,) with ignored positions as 0, valid (N,) bool) on the device of `xp`."""
    t = xp.asarray(t)
    valid = t != ignore_index
    return xp.where(valid, t, 0), valid


# ----- the plain cross-entropy of given logits (autograd's cross_entropy)
@op("classifier", cpu="host/fused_rows.cpp: softmax_exp_rows", gpu="kernels/softmax.cu: softmax_exp_rows",
    reference="opset/rows.py: _softmax_block", test="test_ops_torch_parity.py")
def cross_entropy_fwd(x, t, n_valid: int, ignore_index: int = -100):
    """(mean loss, saved) for logits x (N, V) and checked targets t (N,) (check_targets)."""
    xp = array_module(x)
    t_safe, valid = _rows_of(t, ignore_index, xp)
    if is_low(x):  # bf16 / fp16 logits: float32 arithmetic on their values
        return lowp.cross_entropy_fwd(x, t_safe, valid, n_valid)
    n = np.int64(n_valid)
    N = x.shape[0]
    e = empty(x.shape, x.dtype, x)  # exp(x - max), kept for backward (unnormalised)
    s, lse = xp.empty((N, 1), dtype=x.dtype), xp.empty((N, 1), dtype=x.dtype)
    softmax_rows(x, e, s, lse)  # one pass per row: C++ on the engine's threads, or one GPU launch
    rows = xp.arange(N)
    loss = _mean_valid_loss(lse[:, 0] - x[rows, t_safe], valid, n)
    return loss, (e, s, t_safe, valid, n)


@op("classifier", cpu="opset/rows.py: scale_rows", gpu="opset/rows.py: scale_rows",
    reference="opset/rows.py: scale_rows", test="test_ops_torch_parity.py")
def cross_entropy_bwd(g, saved):
    """d loss / d logits (N, V) = (softmax - onehot(target)) * g / n_valid."""
    e, s, t_safe, valid, n = saved
    if is_low(e):
        return lowp.cross_entropy_bwd(g, saved)
    f, scale = _grad_factors(g, s, valid, n)
    gx = empty(e.shape, e.dtype, e)
    scale_rows(e, f, out=gx)
    gx[array_module(e).arange(e.shape[0]), t_safe] -= scale
    return gx


# ----- the lm_head fused with its loss
@op("classifier", cpu="cpu_threads.py: matmuls + host/fused_rows.cpp: softmax_exp_rows",
    gpu="kernels/cross_entropy.cu: cross_entropy_fwd, mean_loss + cuBLAS",
    reference="opset/classifier.py: _classifier_chunks", test="test_kernels_step.py")
def linear_cross_entropy_fwd(x, w, t, n_valid: int, ignore_index: int = -100):
    """(mean loss, saved) of cross_entropy(x @ w.T, t) for x (N, in), w (V, in), checked targets t."""
    if dispatch.gpu(x, w):
        return _classifier_gpu(x, w, t, n_valid, ignore_index)
    xp = array_module(x)
    (N, n_in), V = x.shape, w.shape[0]
    t_safe, valid = _rows_of(t, ignore_index, xp)
    if is_low(x) or is_low(w):  # bf16 / fp16: the logits rounded once, then the loss in float32
        loss, ce = lowp.cross_entropy_fwd(lowp.matmul(x, w.T), t_safe, valid, n_valid)
        return loss, {"buf": ce}
    buf = empty((N, V), xp.result_type(x, w), x)  # logits, then exp, then the gradient
    s, lse, hit = (xp.empty((N, 1), dtype=buf.dtype) for _ in range(3))
    rows = xp.arange(N)
    wt = right_operand(w.T)  # (in, V)
    if dispatch.host(buf, s, lse):  # C++: the chunks' products on the pool, then one pass per row over all
        matmul(x, wt, out=buf)
        hit[:, 0] = buf[rows, t_safe]  # the target's logit
        softmax_rows(buf, buf, s, lse)
    else:
        _classifier_chunks(x, wt, buf, s, lse, hit, rows, t_safe)
    loss = _mean_valid_loss(lse[:, 0] - hit[:, 0], valid, np.int64(n_valid))
    return loss, {"buf": buf, "s": s, "t_safe": t_safe, "valid": valid, "n": np.int64(n_valid), "rows": rows}


def _classifier_chunks(x, wt, buf, s, lse, hit, rows, t_safe) -> None:
    """Each chunk of rows of the product computes its logits (one blas.gemm on one thread) and, while
    they are in cache, exp(logits - max) in their place, block by block."""
    (N, n_in), V = x.shape, wt.shape[1]

    def chunk(lo, hi):
        blas.gemm(x[lo:hi], wt, buf[lo:hi])  # MKL's sgemm or np.matmul (runtime/blas.py)
        hit[lo:hi, 0] = buf[rows[lo:hi], t_safe[lo:hi]]  # the target's logit
        for a, b in cpu_threads.grid(lo, hi, V * buf.itemsize):  # cache-sized blocks of rows
            _softmax_block(buf[a:b], buf[a:b], s[a:b], lse[a:b])

    cpu_threads.map_chunks(chunk, cpu_threads.matmul_chunks(N, n_in, V), like=x)


@op("classifier", cpu="host/fused_rows.cpp: scale_rows + cpu_threads.py: matmuls",
    gpu="kernels/cross_entropy.cu: cross_entropy_bwd + cuBLAS", reference="opset/rows.py: scale_rows",
    test="test_kernels_step.py")
def linear_cross_entropy_bwd(g, saved, x, w, want_x: bool, want_w: bool):
    """(dx (N, in) or None, dw (V, in) or None) for the upstream gradient g of the mean loss. The
    buffer is turned into d loss / d logits in place: a second call raises."""
    if "buf" not in saved:
        raise RuntimeError("linear_cross_entropy: backward ran twice (its buffer is reused in place)")
    b = saved.pop("buf")
    if isinstance(b, tuple):  # bf16 / fp16 on the CPU: d loss / d logits rounded as the logits were
        b = cast(lowp.cross_entropy_bwd(g, b), b[0].dtype)
    elif "inv_count" in saved:  # the GPU's classifier kernel
        _ce.cross_entropy_bwd(b, saved["s"], saved["t"], g.astype(np.float32, copy=False), saved["inv_count"],
                              saved["ignore_index"])
    else:
        f, scale = _grad_factors(g, saved["s"], saved["valid"], saved["n"])
        scale_rows(b, f)
        b[saved["rows"], saved["t_safe"]] -= scale
    if want_x and want_w:
        return tuple(matmuls((b, w), (b.T, x)))
    return (matmul(b, w) if want_x else None), (matmul(b.T, x) if want_w else None)


def _classifier_gpu(x, w, t, n_valid: int, ignore_index: int):
    xp = array_module(x)
    N = x.shape[0]
    t = xp.asarray(t)  # one copy to the device
    inv_count = np.float32(1.0 / n_valid) if n_valid else np.float32(np.nan)  # no valid target: nan, as torch
    buf = matmul(x, w.T)  # (N, V) logits, then exp, then the gradient
    s, lse, losses = (xp.empty(N, dtype=np.float32) for _ in range(3))
    _ce.cross_entropy_fwd(buf, t, s, lse, losses, ignore_index)
    loss = xp.empty((), dtype=np.float32)
    _ce.mean_loss(losses, inv_count, loss)
    return loss, {"buf": buf, "s": s, "t": t, "inv_count": inv_count, "ignore_index": ignore_index}
