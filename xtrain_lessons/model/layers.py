"""Fused layer ops of the transformer (phase T05): each is ONE graph node with a
hand-written backward, made with `tensor.make_node`.

Composing attention from small ops (transpose, matmul, mask, softmax, matmul) works, but
every small op is a Python-level node and a temporary array; on 2 CPU cores the fused
versions below are what makes a few-million-parameter model train in minutes.

    linear(x, w)                 x @ w.T, w in the (out, in) layout of torch / Hugging Face
    linear_cross_entropy(x, w, t) cross_entropy(linear(x, w), t), fused on row chunks
    rope(x, cos, sin)            rotary position embedding, rotate-half convention
    causal_attention(q, k, v)    softmax(q k^T / sqrt(D) + causal mask) v, grouped-query, by
                                 blocks of queries (model/causal_blocks.py; C++ on float32)
    square_attention(q, k, v)    the same over the whole (T, T) square, in NumPy (T05's, T14's baseline)
    swiglu(gate, up)             silu(gate) * up
    rope_tables(T, D, theta)     the cos / sin tables RoPE reads

Shapes: B batch, T time (positions), H query heads, Hkv key/value heads, D head_dim.
Every function works on NumPy or CuPy data (the array module is taken from the input).
The pure-array forward functions (`*_fwd`) are shared with the no-grad decoding path.
"""

from __future__ import annotations

import math

import numpy as np

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor, make_node
from xtrain_lessons.model import causal_blocks
from xtrain_lessons.runtime import blas, cpu_threads
from xtrain_lessons.runtime.allocator import empty  # np.empty, or the engine allocator's (T11)
from xtrain_lessons.runtime.cpu_threads import map_rows
from xtrain_lessons.runtime import fused, opset
from xtrain_lessons.runtime.opset.products import right_operand
from xtrain_lessons.runtime.opset.rows import _softmax_block
from xtrain_lessons.runtime.device import HostChecked, array_module, on_gpu

__all__ = ["linear", "linear_cross_entropy", "rope", "causal_attention", "square_attention", "swiglu",
           "rope_tables", "rotate_half", "attention_fwd"]


# ----------------------------------------------------------------------------------------
# linear: y = x @ w.T


def linear(x: Tensor, w: Tensor) -> Tensor:
    """y = x @ w.T for x (..., in) and w (out, in) -> (..., out). No bias (Qwen3 has none)."""
    n_in = x.shape[-1]
    if w.shape[1] != n_in:
        raise ValueError(f"linear: input has {n_in} features but weight is {w.shape} (out, in)")
    lead = x.shape[:-1]
    x2 = x.data.reshape(-1, n_in)  # (N, in)
    y = opset.matmul(x2, w.data.T).reshape(*lead, w.shape[0])  # (..., out)

    def backward(g):
        g2 = g.reshape(-1, w.shape[0])  # (N, out)
        if x.requires_grad and w.requires_grad:  # both in one hand-over to the threads
            gx, gw = opset.matmuls((g2, w.data), (g2.T, x2))
            return gx.reshape(x.shape), gw
        gx = opset.matmul(g2, w.data).reshape(x.shape) if x.requires_grad else None  # (..., in)
        gw = opset.matmul(g2.T, x2) if w.requires_grad else None  # (out, in)
        return gx, gw

    return make_node(y, (x, w), backward, "linear")


def linear_cross_entropy(x: Tensor, w: Tensor, targets, ignore_index: int = -100) -> Tensor:
    """cross_entropy(linear(x, w), targets) as one node: the lm_head and the loss fused on
    the matmul's row chunks, the same bits as the two ops.

    Each chunk of rows (`cpu_threads.matmul_chunks`, the chunks `linear` cuts the product
    into) computes its logits and at once, while they are in cache, exp(logits - max) in
    their place: ONE (N, V) buffer instead of three (logits, exp, gradient); the backward
    turns it into d loss / d logits in place, makes dx and dW from it as `linear` does, and
    lets it go (the unfused pair keeps logits and exp until the graph dies). So the backward
    can run once (a second call raises).
    """
    n_in, V = x.shape[-1], w.shape[0]
    if w.shape[1] != n_in:
        raise ValueError(f"linear_cross_entropy: input has {n_in} features but weight is {w.shape} (out, in)")
    if fused.on_device(x.data, w.data):
        return _linear_cross_entropy_gpu(x, w, targets, ignore_index)
    xp = array_module(x.data)
    x2 = x.data.reshape(-1, n_in)  # (N, in)
    N = x2.shape[0]
    t_safe, valid, n_valid = ops.cross_entropy_targets(targets, x.shape[:-1], V, ignore_index, xp)
    buf = empty((N, V), xp.result_type(x2, w.data), x2)  # logits, then exp, then the gradient
    s, lse, hit = (xp.empty((N, 1), dtype=buf.dtype) for _ in range(3))
    rows = xp.arange(N)
    use_kernels = fused.usable(buf, s, lse)

    wt = right_operand(w.data.T)  # (in, V)

    def forward_chunk(lo, hi):
        blas.gemm(x2[lo:hi], wt, buf[lo:hi])  # MKL's sgemm or np.matmul (runtime/blas.py)
        hit[lo:hi, 0] = buf[rows[lo:hi], t_safe[lo:hi]]  # the target's logit
        for a, b in cpu_threads.grid(lo, hi, V * buf.itemsize):  # cache-sized blocks of rows
            _softmax_block(buf[a:b], buf[a:b], s[a:b], lse[a:b])

    if use_kernels:  # C++: the chunks' products on the pool, then one pass per row over all of them
        opset.matmul(x2, wt, out=buf)
        hit[:, 0] = buf[rows, t_safe]  # the target's logit
        opset.softmax_rows(buf, buf, s, lse)
    else:
        cpu_threads.map_chunks(forward_chunk, cpu_threads.matmul_chunks(N, n_in, V), like=x2)
    loss = ops.mean_valid_loss(lse[:, 0] - hit[:, 0], valid, n_valid)
    held = {"buf": buf}  # the backward takes it: freed when the backward returns
    del buf

    def backward(g):
        if "buf" not in held:
            raise RuntimeError("linear_cross_entropy: backward ran twice (its buffer is reused in place)")
        b = held.pop("buf")
        f, scale = ops.softmax_grad_factors(g, s, valid, n_valid)
        opset.scale_rows(b, f)
        b[rows, t_safe] -= scale
        gx = gw = None
        if x.requires_grad and w.requires_grad:
            gx, gw = opset.matmuls((b, w.data), (b.T, x2))
        elif x.requires_grad:
            gx = opset.matmul(b, w.data)
        elif w.requires_grad:
            gw = opset.matmul(b.T, x2)
        return (gx.reshape(x.shape) if gx is not None else None), gw

    return make_node(loss, (x, w), backward, "linear_cross_entropy")


def host_targets(targets, lead_shape, V: int, ignore_index: int):
    """(targets as int64 (N,) on the host, number of valid ones), checked on the host: free when
    they come from the host, as a training batch does (device targets cost one synchronisation);
    HostChecked targets were checked before their copy and stay on the device."""
    if isinstance(targets, HostChecked):  # on the device, checked before the copy
        if tuple(targets.data.shape) != tuple(lead_shape) or targets.data.dtype != np.int64:
            raise ValueError(f"cross_entropy: checked targets must be int64 of shape {tuple(lead_shape)}, got "
                             f"{targets.data.dtype} {tuple(targets.data.shape)}")
        return targets.data.reshape(-1), targets.n_valid
    t = targets.data if isinstance(targets, Tensor) else targets
    t = t.get() if on_gpu(t) else np.asarray(t)
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


def _linear_cross_entropy_gpu(x: Tensor, w: Tensor, targets, ignore_index: int) -> Tensor:
    """linear_cross_entropy on a GPU, llm.c's fused classifier: the logits by cuBLAS into one (N, V)
    buffer, then one kernel per row turns them into exp(logits - max) in place with the row's loss,
    and in the backward one more turns that into d loss / d logits in place, reading the upstream
    gradient on the device (no host synchronisation). Then dx and dW by cuBLAS."""
    xp = array_module(x.data)
    n_in, V = x.shape[-1], w.shape[0]
    x2 = x.data.reshape(-1, n_in)
    N = x2.shape[0]
    t_host, n_valid = host_targets(targets, x.shape[:-1], V, ignore_index)
    t = xp.asarray(t_host)  # one copy to the device
    inv_count = np.float32(1.0 / n_valid) if n_valid else np.float32(np.nan)  # no valid target: nan, as torch
    buf = opset.matmul(x2, w.data.T)  # (N, V) logits, then exp, then the gradient
    s, lse, losses = (xp.empty(N, dtype=np.float32) for _ in range(3))
    fused.cross_entropy_fwd(buf, t, s, lse, losses, ignore_index)
    loss = xp.empty((), dtype=np.float32)
    fused.mean_loss(losses, inv_count, loss)
    held = {"buf": buf}
    del buf

    def backward(g):
        if "buf" not in held:
            raise RuntimeError("linear_cross_entropy: backward ran twice (its buffer is reused in place)")
        b = held.pop("buf")
        fused.cross_entropy_bwd(b, s, t, g.astype(np.float32, copy=False), inv_count, ignore_index)
        gx = opset.matmul(b, w.data).reshape(x.shape) if x.requires_grad else None
        gw = opset.matmul(b.T, x2) if w.requires_grad else None
        return gx, gw

    return make_node(loss, (x, w), backward, "linear_cross_entropy")


# ----------------------------------------------------------------------------------------
# RoPE, rotate-half convention (as Hugging Face Llama / Qwen3)


def rope_tables(T: int, head_dim: int, theta: float, dtype=np.float32):
    """cos, sin tables of shape (T, head_dim).

    Pair i (i < head_dim/2) of a head vector is rotated by the angle t * theta**(-2i/D) at
    position t; the half table is repeated twice because rotate-half pairs element i with
    element i + D/2. Computed in float64, then cast.
    """
    if head_dim % 2:
        raise ValueError(f"rope_tables: head_dim must be even, got {head_dim}")
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.arange(T, dtype=np.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    ang = np.concatenate([ang, ang], axis=-1)  # (T, D)
    return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)


def rotate_half(x):
    """[x1, x2] -> [-x2, x1] on the last axis (x1, x2 its two halves)."""
    xp = array_module(x)
    h = x.shape[-1] // 2
    return xp.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _rotate_half_T(y):
    """The transpose of rotate_half: [y1, y2] -> [y2, -y1]."""
    xp = array_module(y)
    h = y.shape[-1] // 2
    return xp.concatenate([y[..., h:], -y[..., :h]], axis=-1)


def rope(x: Tensor, cos, sin) -> Tensor:
    """Rotate each head vector of x (B, T, H, D) by its position's angles.

    cos, sin: arrays (T, D) for the positions of x (slice the tables for an offset).
    out = x * cos + rotate_half(x) * sin; the backward is the inverse rotation
    g * cos + rotate_half^T(g * sin).
    """
    B, T, H, D = x.shape
    if cos.shape != (T, D):
        raise ValueError(f"rope: tables have shape {cos.shape}, expected {(T, D)}")
    return make_node(opset.rope(x.data, cos, sin), (x,), lambda g: (opset.rope(g, cos, sin, -1.0),), "rope")


# ----------------------------------------------------------------------------------------
# causal self-attention, grouped-query


def _to_heads(x, Hkv):
    """(B, T, H, D) -> (B, Hkv, G*T, D): query head h = j*G + g lands in group j, so one
    batched matmul per kv head serves its G query heads (no repeat of K, V)."""
    B, T, H, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, Hkv, (H // Hkv) * T, D)


def _from_heads(y, B, T, H, D):
    """(B, Hkv, G*T, D) -> (B, T, H, D), contiguous."""
    xp = array_module(y)
    return xp.ascontiguousarray(y.reshape(B, H, T, D).transpose(0, 2, 1, 3))


def _from_heads_into(out, y):
    """Write y (b, Hkv, G*T, D) into out (b, T, H, D): the inverse of _to_heads."""
    b, T, H, D = out.shape
    out[...] = y.reshape(b, H, T, D).transpose(0, 2, 1, 3)


def _check_shapes(q, k, v):
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    if H % Hkv:
        raise ValueError(f"attention: {H} query heads not divisible by {Hkv} kv heads")
    if Tk < Tq or k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit "
                         f"(need k, v (B, Tk, Hkv, D) with Tk >= Tq)")


def attention_fwd(q, k, v):
    """Arrays in, arrays out: (out (B, Tq, H, D), probs (B, Hkv, G*Tq, Tk)).

    q (B, Tq, H, D); k, v (B, Tk, Hkv, D) with Tk >= Tq: the queries are the LAST Tq
    positions, so query i (absolute position Tk - Tq + i) sees keys 0 .. Tk - Tq + i.
    """
    xp = array_module(q)
    _check_shapes(q, k, v)
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    G = H // Hkv
    scale = q.dtype.type(1.0 / math.sqrt(D))
    qh = _to_heads(q, Hkv)  # (B, Hkv, G*Tq, D), a view
    vh = v.transpose(0, 2, 1, 3)  # (B, Hkv, Tk, D), a view
    future = xp.arange(Tk)[None, :] > (Tk - Tq + xp.arange(Tq))[:, None]  # (Tq, Tk)
    bias = xp.where(future, -xp.inf, 0.0).astype(q.dtype)  # causal mask, added to scores
    p = empty((B, Hkv, G * Tq, Tk), q.dtype, q)
    out = empty((B, Tq, H, D), q.dtype, q)

    use_kernels = fused.usable(p)

    def batch_rows(lo, hi):  # sequences lo..hi-1: scores, softmax, weighted sum
        s = p[lo:hi]
        opset.matmul(qh[lo:hi], causal_blocks.keys_t(k[lo:hi]), out=s)  # (b, Hkv, G*Tq, Tk)
        if use_kernels:  # scale, mask, max, exp, normalise: one pass per row (C++, or one GPU launch)
            fused.causal_softmax_fwd(s, Tq, scale)
        else:
            s *= scale
            s.reshape(hi - lo, Hkv, G, Tq, Tk)[...] += bias  # view: mask per (query, key)
            s -= s.max(axis=-1, keepdims=True)  # max subtraction: exp never overflows
            xp.exp(s, out=s)
            s /= s.sum(axis=-1, keepdims=True)
        _from_heads_into(out[lo:hi], opset.matmul(s, vh[lo:hi]))

    # the layout copies (keys transposed, heads back to (B, T, H, D)) happen inside the
    # per-sequence blocks too: on every thread, while the block is in cache
    map_rows(batch_rows, B, p[0].nbytes, like=q, blas=True)
    return out, p  # (B, Tq, H, D)


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal scaled-dot-product attention as one node.

    q (B, Tq, H, D), k and v (B, Tk, Hkv, D) -> (B, Tq, H, D). Hkv divides H (grouped-query
    attention: kv head j serves query heads j*G .. j*G+G-1, G = H/Hkv, like HF repeat_kv).
    Backward (P = softmax(S), S = q k^T / sqrt(D)):
        dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),
        dQ = dS K / sqrt(D),  dK = dS^T Q / sqrt(D)
    The P^T dO and dS^T Q products sum over a group's query heads by themselves. The work runs
    on blocks of queries, each multiplied by the keys it sees only (model/causal_blocks.py).
    """
    return _attention_node(q, k, v, None, False, "causal_attention")


def square_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """causal_attention over the whole (T, T) square of scores, in NumPy: composed attention as
    T05 builds it (P and dP as large as the square), the baseline T14 measures flash attention
    against. The engine's causal_attention skips the masked blocks and runs in C++ (T07)."""
    return _attention_node(q, k, v, q.shape[1], True, "square_attention")


def _attention_node(q, k, v, block, numpy_path, op):
    _check_shapes(q, k, v)
    if q.shape[1] == 0:
        raise ValueError(f"{op}: no queries in q {q.shape}")
    out, blocks, probs = causal_blocks.causal_forward(q.data, k.data, v.data, block, numpy_path)

    def backward(g):
        return causal_blocks.causal_backward(q.data, k.data, v.data, g, blocks, probs, numpy_path)

    return make_node(out, (q, k, v), backward, op)


# ----------------------------------------------------------------------------------------
# SwiGLU


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up, silu(a) = a * sigmoid(a); the gating of the Qwen3 MLP.

    d/dgate = g * up * sig * (1 + gate * (1 - sig)),  d/dup = g * silu(gate).
    Nothing but the inputs is kept for backward: sigmoid is recomputed there (cheaper than
    writing two more activation-sized arrays to memory and reading them back, as torch's
    silu_backward does).
    """
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {gate.shape} and up {up.shape} differ")
    xp = array_module(gate.data)
    F = gate.shape[-1] if gate.ndim else 1
    a2, u2 = gate.data.reshape(-1, F), up.data.reshape(-1, F)
    out = empty(a2.shape, xp.result_type(a2, u2), a2)
    opset.swiglu_fwd(a2, u2, out)

    def backward(g):
        dgate, dup = empty(out.shape, out.dtype, out), empty(out.shape, out.dtype, out)
        opset.swiglu_bwd(a2, u2, g.reshape(-1, F), dgate, dup)
        return dgate.reshape(gate.shape), dup.reshape(up.shape)

    return make_node(out.reshape(gate.shape), (gate, up), backward, "swiglu")
