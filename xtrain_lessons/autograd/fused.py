"""The fused ops of the tape autograd (phase T04): each ONE graph node whose backward is derived by
hand instead of composed from smaller ops — fewer nodes, fewer temporaries, one pass where it can
be. Their array work is the op set's (runtime/opset), on either device.

    softmax(x, axis=-1)  log_softmax(x, axis=-1)
    rmsnorm(x, weight=None, eps=1e-6)          over the last axis, y = x / rms(x) * weight
    embedding(weight, ids)                     weight (V, D), ids int (...) -> (..., D)
    cross_entropy(logits, targets, ignore_index=-100)   mean over the non-ignored targets
    scaled_dot_product_attention(q, k, v, causal=False, scale=None, mask=None)

All are reachable through `autograd.ops` (and as Tensor methods where it makes sense).
"""

from __future__ import annotations

import math

import numpy as np

from xtrain_lessons.autograd.tensor import Tensor, as_tensor, make_node
from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.allocator import empty as _empty  # np.empty, or the engine allocator's (T11)
from xtrain_lessons.runtime.device import array_module, to_host

__all__ = ["softmax", "log_softmax", "rmsnorm", "embedding", "cross_entropy", "scaled_dot_product_attention"]


def softmax(x, axis=-1) -> Tensor:
    """exp(x - max) / sum, one node. Backward: y * (g - sum(g * y)) along `axis`."""
    x = as_tensor(x)
    xp = array_module(x.data)
    y = x.data - x.data.max(axis=axis, keepdims=True)
    xp.exp(y, out=y)
    y /= y.sum(axis=axis, keepdims=True)

    def backward(g):
        gx = g * y
        gx -= y * gx.sum(axis=axis, keepdims=True)
        return (gx,)

    return make_node(y, (x,), backward, "softmax")


def log_softmax(x, axis=-1) -> Tensor:
    """x - logsumexp(x), one node. Backward: g - softmax(x) * sum(g)."""
    x = as_tensor(x)
    xp = array_module(x.data)
    y = x.data - x.data.max(axis=axis, keepdims=True)
    y -= xp.log(xp.exp(y).sum(axis=axis, keepdims=True))

    def backward(g):
        return (g - xp.exp(y) * g.sum(axis=axis, keepdims=True),)

    return make_node(y, (x,), backward, "log_softmax")


def rmsnorm(x, weight=None, eps=1e-6, out_dtype=None) -> Tensor:
    """RMSNorm over the last axis, one node: y = x * r * w with r = 1/sqrt(mean(x^2) + eps).

    Backward, with xhat = x * r and gh = g * w:
        dw = sum over rows of g * xhat
        dx = r * (gh - xhat * mean(gh * xhat))
    `out_dtype` (bf16/fp16 compute): y and the saved xhat in that storage dtype from a float32 x
    (float32 statistics inside); r stays float32.
    """
    x = as_tensor(x)
    xp = array_module(x.data)
    D = x.shape[-1]
    if weight is not None:
        weight = as_tensor(weight)
        if weight.shape != (D,):
            raise ValueError(f"rmsnorm: weight shape {weight.shape} does not match the last "
                             f"dimension of x {x.shape}")
    x2 = x.data.reshape(-1, D)  # (N, D)
    w = weight.data if weight is not None else None
    y_dtype = np.dtype(out_dtype) if out_dtype is not None else x2.dtype
    r_dtype = np.float32 if x2.dtype.itemsize < 4 else x2.dtype  # bf16 / fp16 storage: float32 statistics
    xhat, r = _empty(x2.shape, y_dtype, x2), xp.empty((x2.shape[0], 1), dtype=r_dtype)
    out = _empty(x2.shape, y_dtype, x2) if w is not None else xhat
    opset.rmsnorm_fwd(x2, w, xhat, out, r, eps)

    def backward(g):
        gx = _empty(x2.shape, x2.dtype, x2) if x.requires_grad else None
        gw = opset.rmsnorm_bwd(g.reshape(-1, D), xhat, w, r, gx, weight is not None and weight.requires_grad)
        gx = gx.reshape(x.shape) if gx is not None else None
        return (gx, gw) if weight is not None else (gx,)

    parents = (x, weight) if weight is not None else (x,)
    return make_node(out.reshape(x.shape), parents, backward, "rmsnorm")


def embedding(weight, ids, checked: bool = False) -> Tensor:
    """weight (V, D) gathered at integer ids (...) -> (..., D).

    Backward scatter-adds the rows of the gradient into a (V, D) zero array: a token
    that appears several times receives the sum of its rows. NumPy would silently wrap a
    negative id around: ids are checked on the host (free for host ids; ids already on a GPU
    are copied there), unless `checked` says that was done before they were copied.
    """
    weight = as_tensor(weight)
    ids = ids.data if isinstance(ids, Tensor) else ids
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be (V, D), got {weight.shape}")
    if not checked:
        host = to_host(ids)
        if host.dtype.kind not in "iu":
            raise TypeError(f"embedding: ids must be integers, got {host.dtype}")
        if host.size and (int(host.min()) < 0 or int(host.max()) >= weight.shape[0]):
            raise ValueError(f"embedding: ids must lie in [0, {weight.shape[0]}), got "
                             f"min {int(host.min())}, max {int(host.max())}")
    ids = array_module(weight.data).asarray(ids)
    out = weight.data[ids]  # (..., D)

    def backward(g):
        return (opset.embedding_bwd(ids.reshape(-1), g.reshape(-1, weight.shape[1]), weight.shape[0]),)

    return make_node(out, (weight,), backward, "embedding")


def cross_entropy(logits, targets, ignore_index=-100) -> Tensor:
    """Mean over non-ignored positions of -log softmax(logits)[target], one node.

    logits (..., V), targets int (...). Forward keeps exp(logits - max) and its row sums for
    backward: d loss / d logits = (softmax - onehot(target)) / n_valid.
    If every target is ignored the loss is nan (0/0), as in torch.
    """
    logits = as_tensor(logits)
    V = logits.shape[-1]
    t, n_valid = opset.check_targets(targets.data if isinstance(targets, Tensor) else targets,
                                     logits.shape[:-1], V, ignore_index)
    loss, saved = opset.cross_entropy_fwd(logits.data.reshape(-1, V), t, n_valid, ignore_index)
    return make_node(loss, (logits,), lambda g: (opset.cross_entropy_bwd(g, saved).reshape(logits.shape),),
                     "cross_entropy")


def scaled_dot_product_attention(q, k, v, causal=False, scale=None, mask=None) -> Tensor:
    """softmax(q k^T * scale [+ mask]) v as one node.

    q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv) -> (..., Tq, Dv). `causal` lets query i
    attend to keys j <= i; `mask` is boolean, True where attending is allowed. The
    attention probabilities P (..., Tq, Tk) are kept for backward:
        dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),
        dQ = dS K * scale,  dK = dS^T Q * scale.
    """
    q, k, v = as_tensor(q), as_tensor(k), as_tensor(v)
    xp = array_module(q.data)
    if q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: shapes q {q.shape}, k {k.shape}, "
                         f"v {v.shape} do not match")
    Tq, Tk = q.shape[-2], k.shape[-2]
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    s = opset.matmul(q.data, k.data.swapaxes(-1, -2))  # (..., Tq, Tk)
    s *= s.dtype.type(scale)
    allowed = None
    if causal:
        allowed = xp.tril(xp.ones((Tq, Tk), dtype=bool))
    if mask is not None:
        mask = mask.data if isinstance(mask, Tensor) else xp.asarray(mask)
        allowed = mask if allowed is None else (allowed & mask)
    if allowed is not None:
        s = xp.where(allowed, s, s.dtype.type(-np.inf))
    # softmax over the keys, in place
    s -= s.max(axis=-1, keepdims=True)
    xp.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    p = s  # (..., Tq, Tk)
    out = opset.matmul(p, v.data)  # (..., Tq, Dv)

    def backward(g):  # g: (..., Tq, Dv)
        gv = opset.matmul(p.swapaxes(-1, -2), g) if v.requires_grad else None  # (..., Tk, Dv)
        ds = opset.matmul(g, v.data.swapaxes(-1, -2))  # dP (..., Tq, Tk)
        ds -= (ds * p).sum(axis=-1, keepdims=True)
        ds *= p
        ds *= ds.dtype.type(scale)
        gq = opset.matmul(ds, k.data) if q.requires_grad else None  # (..., Tq, D)
        gk = opset.matmul(ds.swapaxes(-1, -2), q.data) if k.requires_grad else None  # (..., Tk, D)
        return gq, gk, gv

    return make_node(out, (q, k, v), backward, "sdpa", unbroadcast=True)
