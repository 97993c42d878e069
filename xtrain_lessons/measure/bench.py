"""Benchmarks: training throughput of the engine against PyTorch eager, and MFU.

    xtrain bench train [--preset tiny] [--batch-size 16] [--seq-len 128] [--steps 3] [--rounds 3]

Times full training steps (forward, backward, gradient clipping, AdamW) of the engine's
model and of an equivalent PyTorch eager model (same config, same weights, same batch and
sequence length, same thread count, attention composed from matmul + mask + softmax as in
the engine) in one run: `--rounds` rounds of a block of engine steps then a block of torch
steps (`--steps` timed steps each, after one untimed step), so that both see the same
machine load without one's idle worker threads slowing the other's step. Reports the median tokens/s of both, the achieved FLOP/s of the engine
against the machine's measured float32 matmul peak (the best of a large ``np.matmul``
before and after), i.e. the model FLOPs utilisation (MFU). Last line:

    throughput vs torch: R.RRx (engine E tok/s, torch T tok/s, MFU M%)

FLOPs per trained token = 6 × (matmul parameters: every weight matrix except the
embedding, whose forward is a gather) + 12 × n_layers × T × n_heads × head_dim (scores
and weighted sum, forward 2×, backward 4×, over the full T×T square the composed
attention computes).

Threads: ``--threads N`` sets the engine's threads (``cpu_threads.set_blas_threads``: its
matmuls and row blocks are split over them, OpenBLAS single-threaded inside), NumPy's
OpenBLAS for the sgemm peak, and torch's; default: the CPU count.
"""

from __future__ import annotations

import math
import os
import time

import numpy as np

from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.runtime.cpu_threads import blas_threads, set_blas_threads
from xtrain_lessons.training.optim import AdamW, clip_grad_norm

# ----- measurements ----------------------------------------------------------------------

def sgemm_peak(n: int = 1536, reps: int = 5) -> float:
    """FLOP/s of the best of `reps` float32 (n×n)·(n×n) np.matmul calls (2n³ FLOPs each)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    np.matmul(a, b)  # warm-up
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        np.matmul(a, b)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def train_flops_per_token(config, seq_len: int) -> float:
    """Model FLOPs of one trained token (see the module docstring)."""
    c = config
    d, hd = c.dim, c.head_dim
    attn_w = d * c.n_heads * hd + 2 * d * c.n_kv_heads * hd + c.n_heads * hd * d
    mlp_w = 3 * d * c.ffn_dim
    matmul_params = c.n_layers * (attn_w + mlp_w) + c.vocab_size * d  # + lm_head
    return 6.0 * matmul_params + 12.0 * c.n_layers * seq_len * c.n_heads * hd


def _batches(vocab: int, batch: int, seq: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=(batch, seq + 1), dtype=np.int64) for _ in range(n)]


def engine_stepper(config, seed: int = 0):
    """(step(batch) -> (loss, seconds), initial state_dict) for the engine: one full training
    step (forward, backward, clip, AdamW) on a (B, T+1) token batch."""
    model = Model(config, seed=seed)
    params = model.named_parameters()
    opt = AdamW(params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)

    def step(b):
        t0 = time.perf_counter()
        loss = model.loss(b[:, :-1], b[:, 1:])
        model.zero_grad()
        loss.backward()
        clip_grad_norm(params, 1.0)
        opt.step()
        return float(loss.item()), time.perf_counter() - t0

    return step, model.state_dict()


def _torch_model(c, torch):
    nn = torch.nn

    class RMSNorm(nn.Module):
        def __init__(self, n):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))

        def forward(self, x):
            return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + c.norm_eps) * self.weight

    def rot(x):
        h = x.shape[-1] // 2
        return torch.cat([-x[..., h:], x[..., :h]], dim=-1)

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
            s = (q @ k.transpose(-1, -2)) / math.sqrt(D)
            mask = torch.ones(T, T, dtype=torch.bool).triu(1)
            p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
            return self.o_proj((p @ v).transpose(1, 2).reshape(B, T, H * D))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.gate_proj = nn.Linear(c.dim, c.ffn_dim, bias=False)
            self.up_proj = nn.Linear(c.dim, c.ffn_dim, bias=False)
            self.down_proj = nn.Linear(c.ffn_dim, c.dim, bias=False)

        def forward(self, x):
            return self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))

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


def torch_stepper(config, init_state: dict, threads: int | None):
    """(step(batch) -> (loss, seconds), thread count) for the PyTorch eager twin, starting
    from the engine's weights."""
    import torch  # noqa: PLC0415

    if threads:
        torch.set_num_threads(threads)
    model = _torch_model(config, torch)
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in init_state.items()})
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)

    def step(b):
        bt = torch.from_numpy(b)
        t0 = time.perf_counter()
        logits = model(bt[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), bt[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return float(loss.detach()), time.perf_counter() - t0

    return step, torch.get_num_threads()


def run_train_bench(args) -> int:
    """`xtrain bench train`: the report described in the module docstring; `args` holds the
    options of cli/bench.py. Returns the exit code."""
    if args.preset not in PRESETS:
        print(f"xtrain bench: unknown preset {args.preset!r}; choose one of {sorted(PRESETS)}")
        return 2
    base = PRESETS[args.preset]
    config = base.replace(vocab_size=args.vocab_size, max_seq_len=max(base.max_seq_len, args.seq_len))
    B, T = args.batch_size, args.seq_len
    tokens = B * T
    if args.steps < 1 or args.rounds < 1:
        print("xtrain bench: --steps and --rounds must be at least 1")
        return 2
    batches = _batches(config.vocab_size, B, T, args.rounds * (args.steps + 1))
    print(f"bench train: preset {args.preset} ({config.n_params() / 1e6:.2f}M params, vocab "
          f"{config.vocab_size}), batch {B} x {T} = {tokens} tokens/step, {args.rounds} rounds x "
          f"{args.steps} timed steps, "
          f"{os.cpu_count()} CPUs")
    threads = args.threads or os.cpu_count() or 1
    set_blas_threads(threads)
    print(f"threads: {threads} (NumPy BLAS reports {blas_threads()}; torch gets the same)")
    peak = sgemm_peak(args.peak_n)
    print(f"sgemm peak (np.matmul float32 {args.peak_n}^3, best of 5): {peak / 1e9:.1f} GFLOP/s")
    fpt = train_flops_per_token(config, T)
    print(f"model FLOPs per trained token: {fpt / 1e6:.1f} MFLOP")

    engine, init = engine_stepper(config)
    torch_step, nthreads = None, None
    if not args.no_torch:
        try:
            import torch  # noqa: F401,PLC0415
        except ImportError:
            print("torch is not installed, so there is nothing to compare against "
                  "(pip install torch --index-url https://download.pytorch.org/whl/cpu)")
        else:
            torch_step, nthreads = torch_stepper(config, init, threads)
    # Blocks, not single steps: (engine: 1 untimed + `steps` timed, torch: the same) x rounds.
    # One step of each in turn would charge each engine for the other's threads, which
    # keep spinning on the cores for a while after a step (OpenBLAS's and OpenMP's
    # workers wait for more work); rounds still spread slow changes of load over both.
    steppers = {"engine": engine, "torch": torch_step} if torch_step else {"engine": engine}
    times = {name: [] for name in steppers}
    first_loss = {}
    for r in range(args.rounds):
        block = batches[r * (args.steps + 1):(r + 1) * (args.steps + 1)]
        for name, step in steppers.items():
            losses, secs = zip(*(step(b) for b in block))
            first_loss.setdefault(name, losses[0])  # round 0, step 0: the initial weights
            times[name] += secs[1:]  # the block's first step is not timed
    et, tt = times["engine"], times.get("torch", [])
    eloss, tloss = first_loss["engine"], first_loss.get("torch")
    peak = max(peak, sgemm_peak(args.peak_n))  # the best seen, before or after
    e_step = float(np.median(et))
    e_tps = tokens / e_step
    mfu = e_tps * fpt / peak
    print(f"engine: {e_step * 1e3:.0f} ms/step (median), {e_tps:,.0f} tok/s, "
          f"{e_tps * fpt / 1e9:.1f} GFLOP/s, MFU {100 * mfu:.1f}% of {peak / 1e9:.1f} GFLOP/s, "
          f"first loss {eloss:.4f}")
    if torch_step is None:
        why = "torch not run" if args.no_torch else "torch not installed"
        print(f"throughput vs torch: n/a (engine {e_tps:,.0f} tok/s, {why}, MFU {100 * mfu:.1f}%)")
        return 0
    t_step = float(np.median(tt))
    t_tps = tokens / t_step
    print(f"torch ({nthreads} threads, eager): {t_step * 1e3:.0f} ms/step (median), {t_tps:,.0f} tok/s, "
          f"MFU {100 * t_tps * fpt / peak:.1f}%, first loss {tloss:.4f} (same weights: "
          f"|Δ| {abs(tloss - eloss):.1e})")
    print(f"throughput vs torch: {e_tps / t_tps:.2f}x (engine {e_tps:,.0f} tok/s, "
          f"torch {t_tps:,.0f} tok/s, MFU {100 * mfu:.1f}%)")
    return 0
