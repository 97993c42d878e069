"""An independent, plain-PyTorch Qwen3-style decoder: the oracle for the engine's model.

Written from the math (not from `transformers` and not from `xtrain_lessons.model.qwen3`), so a
bug in the engine cannot be copied into its own reference. Parameter names follow the
Hugging Face Qwen3 layout, so `load_state_dict(engine_model.state_dict())` just works:

    model.embed_tokens.weight                        (V, dim)
    model.layers.{i}.input_layernorm.weight          (dim,)
    model.layers.{i}.self_attn.{q,k,v,o}_proj.weight (out, in), no biases
    model.layers.{i}.self_attn.{q,k}_norm.weight     (head_dim,)   when qk_norm
    model.layers.{i}.post_attention_layernorm.weight (dim,)
    model.layers.{i}.mlp.{gate,up,down}_proj.weight  (out, in)
    model.norm.weight                                (dim,)
    lm_head.weight                                   (V, dim)

The config is a plain dict with the fields of `xtrain_lessons.model.qwen3.Config`.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        rms = torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps)
        return x / rms * self.weight


def rope_tables(T: int, head_dim: int, theta: float, dtype):
    """cos, sin of shape (T, head_dim): angle(t, i) = t / theta**(2i/head_dim), the half
    table repeated twice (the rotate-half convention)."""
    i = torch.arange(0, head_dim, 2, dtype=torch.float64)
    inv_freq = 1.0 / (theta ** (i / head_dim))
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv_freq[None, :]  # (T, D/2)
    ang = torch.cat([ang, ang], dim=-1)  # (T, D)
    return torch.cos(ang).to(dtype), torch.sin(ang).to(dtype)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class Attention(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.nh, self.nkv, self.hd = c["n_heads"], c["n_kv_heads"], c["head_dim"]
        dim = c["dim"]
        self.q_proj = nn.Linear(dim, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(dim, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(dim, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, dim, bias=False)
        self.qk_norm = c.get("qk_norm", True)
        if self.qk_norm:
            self.q_norm = RMSNorm(self.hd, c["norm_eps"])
            self.k_norm = RMSNorm(self.hd, c["norm_eps"])

    def forward(self, x, cos, sin):
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.nh, self.hd)
        k = self.k_proj(x).view(B, T, self.nkv, self.hd)
        v = self.v_proj(x).view(B, T, self.nkv, self.hd)
        if self.qk_norm:  # per-head RMSNorm over head_dim, before RoPE
            q, k = self.q_norm(q), self.k_norm(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # (B, h, T, hd)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        group = self.nh // self.nkv  # kv head j serves query heads j*group .. j*group+group-1
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.hd)  # (B, nh, T, T)
        mask = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        att = torch.softmax(scores, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, self.nh * self.hd)
        return self.o_proj(y)


class MLP(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.gate_proj = nn.Linear(c["dim"], c["ffn_dim"], bias=False)
        self.up_proj = nn.Linear(c["dim"], c["ffn_dim"], bias=False)
        self.down_proj = nn.Linear(c["ffn_dim"], c["dim"], bias=False)

    def forward(self, x):
        g = self.gate_proj(x)
        return self.down_proj(g * torch.sigmoid(g) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.input_layernorm = RMSNorm(c["dim"], c["norm_eps"])
        self.self_attn = Attention(c)
        self.post_attention_layernorm = RMSNorm(c["dim"], c["norm_eps"])
        self.mlp = MLP(c)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    def __init__(self, c: dict):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["dim"])
        self.layers = nn.ModuleList([Block(c) for _ in range(c["n_layers"])])
        self.norm = RMSNorm(c["dim"], c["norm_eps"])


class TorchQwen3(nn.Module):
    """logits = lm_head(norm(blocks(embed(ids)))), causal, RoPE rotate-half."""

    def __init__(self, c: dict):
        super().__init__()
        self.c = dict(c)
        self.model = Decoder(c)
        self.lm_head = nn.Linear(c["dim"], c["vocab_size"], bias=False)

    def forward(self, ids):
        T = ids.shape[1]
        x = self.model.embed_tokens(ids)
        cos, sin = rope_tables(T, self.c["head_dim"], self.c["rope_theta"], x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.model.norm(x))

    def loss(self, ids, targets, ignore_index=-100):
        logits = self(ids)
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=ignore_index)


def from_state_dict(c: dict, state: dict, dtype=torch.float64) -> TorchQwen3:
    """A TorchQwen3 in `dtype` holding the arrays of `state` (name -> numpy array)."""
    m = TorchQwen3(c).to(dtype)
    m.load_state_dict({k: torch.tensor(v, dtype=dtype) for k, v in state.items()}, strict=True)
    return m
