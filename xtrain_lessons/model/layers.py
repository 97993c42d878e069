"""The layers of the transformer (phase T05), each ONE graph node: the forward as the math says
it, and a hand-written backward (made with `tensor.make_node`).

    linear(x, w)                  y = x @ w.T, w in the (out, in) layout of torch / Hugging Face
    linear_cross_entropy(x, w, t) cross_entropy(linear(x, w), t) with the (N, V) logits kept once
    rope(x, cos, sin)             rotary position embedding, rotate-half convention
    causal_attention(q, k, v)     softmax(q k^T / sqrt(D) + causal mask) v, grouped-query
    square_attention(q, k, v)     the same over the whole (T, T) square (T05's, T14's baseline)
    swiglu(gate, up)              silu(gate) * up
    rope_tables(T, D, theta)      the cos / sin tables RoPE reads
    attention_fwd(q, k, v)        composed attention on arrays: (out, P)

Composing attention from small ops (transpose, matmul, mask, softmax, matmul) works, but every
small op is a Python-level node and a temporary array; one node per layer, its arrays computed
by the op set (runtime/opset: a CUDA kernel on a GPU, C++ rows and BLAS on the CPU, NumPy where
no kernel applies), is what makes a few-million-parameter model train in minutes on 2 cores.

Shapes: B batch, T time (positions), H query heads, Hkv key/value heads, D head_dim.
"""

from __future__ import annotations

import math

import numpy as np

from xtrain_lessons.autograd.tensor import Tensor, make_node
from xtrain_lessons.model.inputs import host_targets
from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.allocator import empty  # np.empty, or the engine allocator's (T11)
from xtrain_lessons.runtime.device import array_module

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
    """cross_entropy(linear(x, w), targets) as one node: the lm_head and the loss fused (llm.c's
    fused classifier), the (N, V) logits never kept twice. One (N, V) buffer holds the logits, then
    exp(logits - max) in their place; the backward turns it into d loss / d logits in place, makes
    dx and dW from it as `linear` does, and lets it go. So the backward can run once (a second
    call raises).
    """
    n_in, V = x.shape[-1], w.shape[0]
    if w.shape[1] != n_in:
        raise ValueError(f"linear_cross_entropy: input has {n_in} features but weight is {w.shape} (out, in)")
    t, n_valid = host_targets(targets, x.shape[:-1], V, ignore_index)
    x2 = x.data.reshape(-1, n_in)  # (N, in)
    loss, saved = opset.linear_cross_entropy_fwd(x2, w.data, t, n_valid, ignore_index)

    def backward(g):
        gx, gw = opset.linear_cross_entropy_bwd(g, saved, x2, w.data, x.requires_grad, w.requires_grad)
        return (gx.reshape(x.shape) if gx is not None else None), gw

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


def _check_shapes(q, k, v):
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    if H % Hkv:
        raise ValueError(f"attention: {H} query heads not divisible by {Hkv} kv heads")
    if Tk < Tq or k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit "
                         f"(need k, v (B, Tk, Hkv, D) with Tk >= Tq)")


def attention_fwd(q, k, v):
    """Arrays in, arrays out: (out (B, Tq, H, D), probs (B, Hkv, G*Tq, Tk)), the whole square.

    q (B, Tq, H, D); k, v (B, Tk, Hkv, D) with Tk >= Tq: the queries are the LAST Tq
    positions, so query i (absolute position Tk - Tq + i) sees keys 0 .. Tk - Tq + i.
    """
    _check_shapes(q, k, v)
    B, Tq, H, D = q.shape
    Hkv = k.shape[2]
    s = opset.matmul(_to_heads(q, Hkv), k.transpose(0, 2, 3, 1))  # scores q k^T (B, Hkv, G*Tq, Tk)
    opset.causal_softmax_fwd(s, Tq, q.dtype.type(1.0 / math.sqrt(D)))  # scale, mask the future, softmax
    out = opset.matmul(s, v.transpose(0, 2, 1, 3))  # P V (B, Hkv, G*Tq, D)
    return _from_heads(out, B, Tq, H, D), s


def causal_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal scaled-dot-product attention as one node.

    q (B, Tq, H, D), k and v (B, Tk, Hkv, D) -> (B, Tq, H, D). Hkv divides H (grouped-query
    attention: kv head j serves query heads j*G .. j*G+G-1, G = H/Hkv, like HF repeat_kv).
    Backward (P = softmax(S), S = q k^T / sqrt(D)):
        dV = P^T dO,  dP = dO V^T,  dS = P * (dP - rowsum(dP * P)),
        dQ = dS K / sqrt(D),  dK = dS^T Q / sqrt(D)
    The P^T dO and dS^T Q products sum over a group's query heads by themselves. The work runs
    on blocks of queries, each multiplied by the keys it sees only (runtime/opset/attention.py).
    """
    return _attention_node(q, k, v, None, False, "causal_attention")


def square_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """causal_attention over the whole (T, T) square of scores, in NumPy: composed attention as
    T05 builds it (P and dP as large as the square), the baseline T14 measures flash attention
    against. The engine's causal_attention skips the masked blocks and runs in C++ (T07)."""
    return _attention_node(q, k, v, q.shape[1], True, "square_attention")


def _attention_node(q, k, v, block, reference, op):
    _check_shapes(q, k, v)
    if q.shape[1] == 0:
        raise ValueError(f"{op}: no queries in q {q.shape}")
    out, (blocks, probs) = opset.causal_attention_fwd(q.data, k.data, v.data, block, reference)

    def backward(g):  # P of each block of queries is what the backward keeps
        return opset.causal_attention_bwd(q.data, k.data, v.data, g, (blocks, probs), reference)

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
