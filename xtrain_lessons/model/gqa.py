"""Grouped-query attention (phase T15): fewer key/value heads than query heads.

With H query heads and Hkv key/value heads (Hkv divides H), query head h reads kv head
h // G, G = H / Hkv (the group size). G = 1 is multi-head attention, Hkv = 1 multi-query
attention. The k/v projections and the KV cache shrink by G; the query side is unchanged.

Two ways to compute it:
  * repeat, then attend: `repeat_kv(k, G)` copies each kv head G times (as Hugging Face's
    `repeat_kv`, i.e. `torch.repeat_interleave(k, G, dim=head axis)`), then plain multi-head
    attention. The backward of the repeat sums the gradients of the G copies of each kv head
    — a reshape and a sum over the group axis: deterministic, no atomics.
  * attend by group, no copy: `layers.causal_attention` (one matmul per kv head over its G*T
    query rows) and `flash_attention.flash_attention` (kv head h // G per query head).

    from xtrain_lessons.model.gqa import repeat_kv, mha_attention, gqa_attention, kv_cache_bytes
    k4 = repeat_kv(k, 2)                      # (B, T, 2, D) -> (B, T, 4, D)
    out = gqa_attention(q, k, v)              # = mha_attention(q, repeat_kv(k), repeat_kv(v))

Layout as in the model: q (B, T, H, D), k and v (B, T, Hkv, D).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor, make_node
from xtrain_lessons.runtime.device import array_module

__all__ = ["repeat_kv", "mha_attention", "gqa_attention", "kv_cache_bytes",
           "attention_param_count"]


def repeat_kv(x: Tensor, n_rep: int, axis: int = 2) -> Tensor:
    """Repeat each head of x `n_rep` times along the head axis (default 2: (B, T, Hkv, D)).

    Head j of the input becomes heads j*n_rep .. j*n_rep + n_rep - 1 of the output, like
    `torch.repeat_interleave(x, n_rep, dim=axis)`. n_rep = 1 returns x itself (nothing to
    repeat, as in Hugging Face). Backward: the gradient of kv head j is the sum of the
    gradients of its n_rep copies (a reshape exposing the group axis, then a sum over it).
    """
    n_rep = int(n_rep)
    if n_rep < 1:
        raise ValueError(f"repeat_kv: n_rep must be >= 1, got {n_rep}")
    if n_rep == 1:
        return x
    axis = axis % x.ndim
    xp = array_module(x.data)
    out = xp.repeat(x.data, n_rep, axis=axis)  # (..., Hkv * n_rep, ...)
    grouped = x.shape[:axis] + (x.shape[axis], n_rep) + x.shape[axis + 1:]

    def backward(g):
        return (g.reshape(grouped).sum(axis=axis + 1),)  # sum over each kv head's group

    return make_node(out, (x,), backward, "repeat_kv")


def mha_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Plain causal multi-head attention, every query head with its own k/v head:
    q, k, v (B, T, H, D) -> (B, T, H, D), built from T04's ops (transpose to (B, H, T, D),
    `ops.scaled_dot_product_attention(causal=True)`, transpose back)."""
    if k.shape != q.shape or v.shape != q.shape:
        raise ValueError(f"mha_attention: q {q.shape}, k {k.shape}, v {v.shape} must have the same "
                         f"shape (use repeat_kv, or gqa_attention)")
    qh, kh, vh = (ops.transpose(t, (0, 2, 1, 3)) for t in (q, k, v))  # (B, H, T, D)
    out = ops.scaled_dot_product_attention(qh, kh, vh, causal=True)
    return ops.transpose(out, (0, 2, 1, 3))  # (B, T, H, D)


def gqa_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Grouped-query attention by repetition: q (B, T, H, D), k, v (B, T, Hkv, D)."""
    H, Hkv = q.shape[2], k.shape[2]
    if H % Hkv:
        raise ValueError(f"gqa_attention: {H} query heads not divisible by {Hkv} kv heads")
    return mha_attention(q, repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv))


def kv_cache_bytes(config, seq_len: int | None = None, batch: int = 1,
                   dtype=np.float32) -> int:
    """Bytes of a full KV cache: 2 (k and v) x layers x batch x seq_len x n_kv_heads x
    head_dim x itemsize (what `qwen3.KVCache` allocates)."""
    seq_len = config.max_seq_len if seq_len is None else seq_len
    return (2 * config.n_layers * batch * seq_len * config.n_kv_heads * config.head_dim
            * np.dtype(dtype).itemsize)


def attention_param_count(config) -> int:
    """Parameters of one layer's attention projections: q and o (H heads), k and v (Hkv)."""
    d, hd = config.dim, config.head_dim
    return 2 * d * config.n_heads * hd + 2 * d * config.n_kv_heads * hd
