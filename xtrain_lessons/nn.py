"""Fused layer ops of the transformer (phase T05): each is ONE graph node with a
hand-written backward, made with `autograd.make_node`.

Composing attention from small ops (transpose, matmul, mask, softmax, matmul) works, but
every small op is a Python-level node and a temporary array; on 2 CPU cores the fused
versions below are what makes a few-million-parameter model train in minutes.

    linear(x, w)                 x @ w.T, w in the (out, in) layout of torch / Hugging Face
    rope(x, cos, sin)            rotary position embedding, rotate-half convention
    causal_attention(q, k, v)    softmax(q k^T / sqrt(D) + causal mask) v, grouped-query
    swiglu(gate, up)             silu(gate) * up
    rope_tables(T, D, theta)     the cos / sin tables RoPE reads

Shapes: B batch, T time (positions), H query heads, Hkv key/value heads, D head_dim.
Every function works on NumPy or CuPy data (the array module is taken from the input).
The pure-array forward functions (`*_fwd`) are shared with the no-grad decoding path.
"""

from __future__ import annotations

import math

import numpy as np

from .autograd import Tensor, array_module, make_node

__all__ = ["linear", "rope", "causal_attention", "swiglu", "rope_tables", "rotate_half",
           "attention_fwd"]


# ----------------------------------------------------------------------------------------
# linear: y = x @ w.T


def linear(x: Tensor, w: Tensor) -> Tensor:
    """y = x @ w.T for x (..., in) and w (out, in) -> (..., out). No bias (Qwen3 has none)."""
    n_in = x.shape[-1]
    if w.shape[1] != n_in:
        raise ValueError(f"linear: input has {n_in} features but weight is {w.shape} (out, in)")
    lead = x.shape[:-1]
    x2 = x.data.reshape(-1, n_in)  # (N, in)
    y = (x2 @ w.data.T).reshape(*lead, w.shape[0])  # (..., out)

    def backward(g):
        g2 = g.reshape(-1, w.shape[0])  # (N, out)
        gx = (g2 @ w.data).reshape(x.shape) if x.requires_grad else None  # (..., in)
        gw = g2.T @ x2 if w.requires_grad else None  # (out, in)
        return gx, gw

    return make_node(y, (x, w), backward, "linear")


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
    c, s = cos[None, :, None, :], sin[None, :, None, :]  # (1, T, 1, D)
    out = x.data * c + rotate_half(x.data) * s

    def backward(g):
        return (g * c + _rotate_half_T(g * s),)

    return make_node(out, (x,), backward, "rope")


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


def attention_fwd(q, k, v):
    """Arrays in, arrays out: (out (B, Tq, H, D), probs (B, Hkv, G*Tq, Tk)).

    q (B, Tq, H, D); k, v (B, Tk, Hkv, D) with Tk >= Tq: the queries are the LAST Tq
    positions, so query i (absolute position Tk - Tq + i) sees keys 0 .. Tk - Tq + i.
    """
    xp = array_module(q)
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    if H % Hkv:
        raise ValueError(f"attention: {H} query heads not divisible by {Hkv} kv heads")
    if Tk < Tq or k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit "
                         f"(need k, v (B, Tk, Hkv, D) with Tk >= Tq)")
    scale = 1.0 / math.sqrt(D)
    qh = _to_heads(q, Hkv)  # (B, Hkv, G*Tq, D)
    kh = k.transpose(0, 2, 1, 3)  # (B, Hkv, Tk, D)
    vh = v.transpose(0, 2, 1, 3)  # (B, Hkv, Tk, D)
    s = qh @ kh.swapaxes(-1, -2)  # (B, Hkv, G*Tq, Tk)
    s *= q.dtype.type(scale)
    s = s.reshape(B, Hkv, H // Hkv, Tq, Tk)  # view: mask per (query, key)
    future = xp.arange(Tk)[None, :] > (Tk - Tq + xp.arange(Tq))[:, None]  # (Tq, Tk)
    s += xp.where(future, -xp.inf, 0.0).astype(s.dtype)  # causal mask, broadcast
    s -= s.max(axis=-1, keepdims=True)  # max subtraction: exp never overflows
    p = xp.exp(s, out=s)
    p /= p.sum(axis=-1, keepdims=True)
    p = p.reshape(B, Hkv, -1, Tk)  # (B, Hkv, G*Tq, Tk)
    out = _from_heads(p @ vh, B, Tq, H, D)  # (B, Tq, H, D)
    return out, p


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal scaled-dot-product attention as one node.

    q (B, Tq, H, D), k and v (B, Tk, Hkv, D) -> (B, Tq, H, D). Hkv divides H (grouped-query
    attention: kv head j serves query heads j*G .. j*G+G-1, G = H/Hkv, like HF repeat_kv).
    Backward (P = softmax(S), S = q k^T / sqrt(D)):
        dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),
        dQ = dS K / sqrt(D),  dK = dS^T Q / sqrt(D)
    The P^T dO and dS^T Q products sum over a group's query heads by themselves.
    """
    out, p = attention_fwd(q.data, k.data, v.data)
    B, Tq, H, D = q.shape
    Hkv = k.shape[2]
    scale = q.dtype.type(1.0 / math.sqrt(D))

    def backward(g):
        xp = array_module(g)
        qh = _to_heads(q.data, Hkv)  # (B, Hkv, G*Tq, D)
        kh = k.data.transpose(0, 2, 1, 3)  # (B, Hkv, Tk, D)
        vh = v.data.transpose(0, 2, 1, 3)
        gh = _to_heads(g, Hkv)  # (B, Hkv, G*Tq, D)
        dv = p.swapaxes(-1, -2) @ gh  # (B, Hkv, Tk, D)
        dp = gh @ vh.swapaxes(-1, -2)  # (B, Hkv, G*Tq, Tk)
        ds = dp
        ds -= (dp * p).sum(axis=-1, keepdims=True)
        ds *= p
        ds *= scale
        dq = _from_heads(ds @ kh, B, Tq, H, D)  # (B, Tq, H, D)
        dk = ds.swapaxes(-1, -2) @ qh  # (B, Hkv, Tk, D)
        return (dq, xp.ascontiguousarray(dk.transpose(0, 2, 1, 3)),
                xp.ascontiguousarray(dv.transpose(0, 2, 1, 3)))

    return make_node(out, (q, k, v), backward, "causal_attention")


# ----------------------------------------------------------------------------------------
# SwiGLU


def _sigmoid(x):
    xp = array_module(x)
    return x.dtype.type(0.5) * (xp.tanh(x * x.dtype.type(0.5)) + x.dtype.type(1.0))  # no overflow


def swiglu(gate: Tensor, up: Tensor) -> Tensor:
    """silu(gate) * up, silu(a) = a * sigmoid(a); the gating of the Qwen3 MLP.

    d/dgate = g * up * sig * (1 + gate * (1 - sig)),  d/dup = g * silu(gate).
    """
    if gate.shape != up.shape:
        raise ValueError(f"swiglu: gate {gate.shape} and up {up.shape} differ")
    sig = _sigmoid(gate.data)
    silu = gate.data * sig
    out = silu * up.data

    def backward(g):
        one = sig.dtype.type(1.0)
        dgate = g * up.data * sig * (one + gate.data * (one - sig))
        return dgate, g * silu

    return make_node(out, (gate, up), backward, "swiglu")
