"""The engine's model as PyTorch, for `xtrain bench train`'s baselines (phase T07).

    step, threads = torch_stepper(config, engine.state_dict(), threads, kind="compile")
    loss, seconds = step(batch)  # batch: int64 (B, T + 1) tokens

Four kinds, the same model, weights, optimizer and thread count:
- ``eager``: attention composed from matmul + causal mask + softmax + matmul, as the engine's
  own `causal_attention` computes it;
- ``sdpa``: attention is `F.scaled_dot_product_attention(is_causal=True)` (torch's fused
  kernel: flash-style blocks, causal blocks skipped);
- ``compile``: the sdpa model and its cross-entropy under `torch.compile` (inductor: fused
  elementwise kernels in C++, or Triton on a GPU); its first step compiles;
- ``amp``: the sdpa model under `torch.autocast(dtype=torch.bfloat16)`, torch's mixed precision
  (float32 weights and optimizer, bf16 matmuls): the baseline of the engine's `--dtype bf16`.

`device="cuda"` puts the twin on the GPU (the batch is copied there each step, as the engine
copies its own); its step then returns the loss as a device tensor, not a float: the caller
times a block of steps between two synchronisations, as a training loop would run.

The step is forward, cross-entropy, backward, `clip_grad_norm_(1.0)` and `AdamW` (decay on
matrices only), the engine's recipe.
"""

from __future__ import annotations

import math
import time

import numpy as np

KINDS = ("eager", "sdpa", "compile", "amp")


def torch_model(c, torch, attention: str = "composed"):
    """An nn.Module with the engine's parameter names: logits (B, T, V) from ids (B, T).
    `attention`: "composed" or "sdpa"."""
    nn = torch.nn
    F = torch.nn.functional

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + c.norm_eps) * self.weight

    def rot(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], dim=-1)

    def composed(q, k, v):
        T = q.shape[-2]
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        mask = torch.ones(T, T, dtype=torch.bool, device=s.device).triu(1)
        return torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1) @ v

    def sdpa(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    attend = {"composed": composed, "sdpa": sdpa}[attention]

    class Attn(nn.Module):
        def __init__(self):
            super().__init__()
            H, K, D = c.n_heads, c.n_kv_heads, c.head_dim
            self.q_proj = nn.Linear(c.dim, H * D, bias=False)
            self.k_proj = nn.Linear(c.dim, K * D, bias=False)
            self.v_proj = nn.Linear(c.dim, K * D, bias=False)
            self.o_proj = nn.Linear(H * D, c.dim, bias=False)
            if c.qk_norm:
                self.q_norm, self.k_norm = RMSNorm(D), RMSNorm(D)

        def forward(self, x, cos, sin):
            B, T, _ = x.shape
            H, K, D = c.n_heads, c.n_kv_heads, c.head_dim
            q = self.q_proj(x).view(B, T, H, D)
            k = self.k_proj(x).view(B, T, K, D)
            v = self.v_proj(x).view(B, T, K, D)
            if c.qk_norm:
                q, k = self.q_norm(q), self.k_norm(k)
            q, k = q * cos + rot(q) * sin, k * cos + rot(k) * sin
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            if K != H:
                k = k.repeat_interleave(H // K, dim=1)
                v = v.repeat_interleave(H // K, dim=1)
            return self.o_proj(attend(q, k, v).transpose(1, 2).reshape(B, T, H * D))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(c.dim, c.ffn_dim, bias=False)
            self.up_proj = nn.Linear(c.dim, c.ffn_dim, bias=False)
            self.down_proj = nn.Linear(c.ffn_dim, c.dim, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = RMSNorm(c.dim)
            self.self_attn = Attn()
            self.post_attention_layernorm = RMSNorm(c.dim)
            self.mlp = MLP()

        def forward(self, x, cos, sin):
            x = x + self.self_attn(self.input_layernorm(x), cos, sin)
            return x + self.mlp(self.post_attention_layernorm(x))

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed_tokens = nn.Embedding(c.vocab_size, c.dim)
            self.layers = nn.ModuleList([Layer() for _ in range(c.n_layers)])
            self.norm = RMSNorm(c.dim)

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Inner()
            self.lm_head = nn.Linear(c.dim, c.vocab_size, bias=False)
            i = torch.arange(0, c.head_dim, 2, dtype=torch.float64)
            ang = torch.arange(c.max_seq_len, dtype=torch.float64)[:, None] / (c.rope_theta ** (i / c.head_dim))
            ang = torch.cat([ang, ang], -1)
            self.register_buffer("cos", torch.cos(ang).float()[:, None, :], persistent=False)
            self.register_buffer("sin", torch.sin(ang).float()[:, None, :], persistent=False)

        def forward(self, ids):
            T = ids.shape[1]
            x = self.model.embed_tokens(ids)
            for layer in self.model.layers:
                x = layer(x, self.cos[:T], self.sin[:T])
            return self.lm_head(self.model.norm(x))

    return LM()


def torch_stepper(config, init_state: dict, threads: int | None, kind: str = "eager", device: str = "cpu"):
    """(step(batch) -> (loss, seconds), torch's thread count) for the PyTorch twin of `kind`
    (see the module docstring), starting from the engine's weights. For "compile" the first
    step compiles (tens of seconds). On "cuda" the loss is a device tensor (no synchronisation)."""
    import contextlib  # noqa: PLC0415

    import torch  # noqa: PLC0415

    if kind not in KINDS:
        raise ValueError(f"torch_stepper: kind must be one of {KINDS}, got {kind!r}")
    if threads:
        torch.set_num_threads(threads)
    model = torch_model(config, torch, "composed" if kind == "eager" else "sdpa")
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in init_state.items()})
    model.to(device)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)

    def autocast():
        if kind != "amp":
            return contextlib.nullcontext()
        return torch.autocast(device_type="cuda" if device == "cuda" else "cpu", dtype=torch.bfloat16)

    def loss_fn(ids, targets):
        with autocast():
            logits = model(ids)
        return torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))

    if kind == "compile":
        loss_fn = torch.compile(loss_fn)

    def step(b):
        t0 = time.perf_counter()
        bt = torch.from_numpy(b).to(device)
        loss = loss_fn(bt[:, :-1], bt[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        loss = loss.detach() if device == "cuda" else float(loss.detach())
        return loss, time.perf_counter() - t0

    return step, torch.get_num_threads()
