"""The engine's model as PyTorch, for `xtrain bench train`'s baselines (phase T07).

    step, threads = torch_stepper(config, engine.state_dict(), threads, kind="sdpa", device="cuda",
                                  precision="bf16")
    step.prepare(batches)        # pins the batches (on a GPU), outside the timing, as a DataLoader does
    loss, seconds = step(batch)  # batch: int64 (B, T + 1) tokens

The same model, weights, optimizer recipe and batches as the engine; the kinds:
- ``eager``: attention composed from matmul + causal mask + softmax + matmul, as the engine's own
  `causal_attention` computes it (the CPU lesson's baseline);
- ``sdpa``: attention is `F.scaled_dot_product_attention(is_causal=True)` (flash-style blocks,
  masked blocks skipped): what a PyTorch user runs eagerly;
- ``compile``: the sdpa model's forward and loss under `torch.compile` (default mode; AOTAutograd
  compiles their backward with them), and the clip + AdamW step compiled apart, as PyTorch's recipe
  "(beta) Compiling the optimizer with torch.compile" does (AdamW's default foreach implementation,
  which inductor fuses); the first step compiles;
- ``reduce-overhead``: the same under `mode="reduce-overhead"` (inductor's CUDA graphs, "CUDA graph
  trees", of the forward, the backward and the optimizer step; a GPU baseline);
- ``cuda-graph``: the whole step (forward, loss, backward, clip, `AdamW(fused=True, capturable=True)`)
  captured once with `torch.cuda.graph` and replayed, as PyTorch's CUDA-semantics notes capture a
  whole network (warm-up on a side stream, grads set to None before the capture, autocast with
  `cache_enabled=False`); the weights and AdamW's state are put back after the warm-up, so the first
  replay is the first step (a GPU baseline);
- ``amp``: the sdpa model under `torch.autocast(dtype=torch.bfloat16)` whatever the precision asked
  for (the name the CPU bench and earlier GPU runs use).

`precision` ("float32", "bf16" or "fp16", `--dtype` on the GPU): bf16 / fp16 run forward and loss
under `torch.autocast` of that dtype, with float32 weights and optimizer, as PyTorch's mixed precision
does; the loss is computed inside autocast, which computes its log-softmax in float32 and widens
nothing else (no float32 copy of the logits beside it). fp16 adds `torch.amp.GradScaler`, whose
step reads found-inf on the host, so it is measured with the eager kinds only.

On "cuda" every kind uses `AdamW(fused=True)` (the compiled kinds: the compiled foreach one) and
takes its batches from pinned host memory with `non_blocking=True` copies (`step.prepare` pins
them beforehand; an unprepared batch is pinned when first seen); the step returns the loss as a
device tensor (no synchronisation): the caller times blocks of steps between two synchronisations.
On the CPU the optimizer is AdamW's default and batches are used where they are.

A baseline that cannot be built here raises BaselineUnavailable with a one-line reason (a GPU kind
on the CPU, fp16 with a graph); torch.compile's own failures surface at the first step.
"""

from __future__ import annotations

import contextlib
import math
import time

import numpy as np

KINDS = ("eager", "sdpa", "compile", "reduce-overhead", "cuda-graph", "amp")
CPU_KINDS = ("eager", "sdpa", "compile", "amp")  # reduce-overhead and cuda-graph are CUDA graphs
PRECISIONS = ("float32", "bf16", "fp16")


class BaselineUnavailable(RuntimeError):
    """This baseline cannot run here; the message says why in one line."""


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


def _compile(torch, fn, mode):
    """torch.compile(fn) in `mode` (None: the default). One seam, so tests can swap the backend."""
    return torch.compile(fn) if mode is None else torch.compile(fn, mode=mode)


def _check(kind: str, device: str, precision: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"torch_stepper: kind must be one of {KINDS}, got {kind!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"torch_stepper: precision must be one of {PRECISIONS}, got {precision!r}")
    if device != "cuda" and kind not in CPU_KINDS:
        raise BaselineUnavailable(f"{kind} is a CUDA graph: it needs torch with CUDA on a GPU")
    if precision == "fp16" and kind not in ("eager", "sdpa"):
        raise BaselineUnavailable(f"fp16's GradScaler reads found-inf on the host every step: {kind} is "
                                  f"measured in float32 and bf16 (fp16 against eager or sdpa)")


def torch_stepper(config, init_state: dict, threads: int | None, kind: str = "eager", device: str = "cpu",
                  precision: str = "float32"):
    """(step(batch) -> (loss, seconds), torch's thread count) for the PyTorch twin of `kind` in
    `precision` (see the module docstring), starting from the engine's weights. For the compiled
    kinds the first step compiles (tens of seconds); `step.warmup_steps` more untimed steps let
    CUDA graph trees record. On "cuda" the loss is a device tensor (no synchronisation)."""
    import torch  # noqa: PLC0415

    if kind == "amp":  # sdpa under autocast bf16, whatever was asked
        precision = "bf16"
    _check(kind, device, precision)
    if threads:
        torch.set_num_threads(threads)
    model = torch_model(config, torch, "composed" if kind == "eager" else "sdpa")
    model.load_state_dict({k: torch.from_numpy(np.asarray(v)) for k, v in init_state.items()})
    model.to(device)
    on_gpu = device == "cuda"
    groups = [{"params": [p for p in model.parameters() if p.dim() >= 2]},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    compiled = kind in ("compile", "reduce-overhead")
    extra = {}  # the CPU: AdamW's default; compiled: the foreach one, which inductor fuses
    if on_gpu and not compiled:
        extra = {"fused": True, "capturable": kind == "cuda-graph"}
    opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1, **extra)
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)

    def autocast():
        if low is None:
            return contextlib.nullcontext()
        # a graph capture replays what it recorded: autocast's cast cache must be off (torch.cuda.graph's notes)
        return torch.autocast(device_type=device, dtype=low, cache_enabled=kind != "cuda-graph")

    def loss_fn(ids, targets):
        with autocast():  # the loss inside: autocast widens only what log-softmax needs
            logits = model(ids)
            return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def update():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    batches = _Batches(torch, device)
    if kind == "cuda-graph":
        step = _graphed_step(torch, model, opt, loss_fn, update, batches)
    else:
        mode = "reduce-overhead" if kind == "reduce-overhead" else None
        loss_c, update_c = (_compile(torch, loss_fn, mode), _compile(torch, update, mode)) if compiled \
            else (loss_fn, update)
        scaler = torch.amp.GradScaler(device) if precision == "fp16" else None
        step = _plain_step(torch, model, opt, loss_c, update_c, scaler, batches, on_gpu,
                           mark=kind == "reduce-overhead")
        step.warmup_steps = 2 if kind == "reduce-overhead" else 0  # graph trees: a warm-up run, then a recording
    step.prepare = batches.prepare
    return step, torch.get_num_threads()


class _Batches:
    """Batches as the model takes them: on a GPU from pinned host memory, copied without blocking."""

    def __init__(self, torch, device):
        self.torch, self.device, self.pinned = torch, device, {}

    def prepare(self, batches) -> None:
        if self.device == "cuda":
            for b in batches:
                self.pinned.setdefault(id(b), (b, self.torch.from_numpy(np.ascontiguousarray(b)).pin_memory()))

    def host(self, b):
        """`b` as a torch tensor in host memory (pinned on a GPU machine)."""
        if self.device != "cuda":
            return self.torch.from_numpy(b)
        if id(b) not in self.pinned:
            self.prepare([b])
        return self.pinned[id(b)][1]

    def __call__(self, b):
        """`b` on the device (a copy that does not block the host, from pinned memory)."""
        return self.host(b).to(self.device, non_blocking=True)


def _plain_step(torch, model, opt, loss_fn, update, scaler, batches, on_gpu, mark=False):
    def step(b):
        t0 = time.perf_counter()
        if mark:  # a new iteration for CUDA graph trees: last step's outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        bt = batches(b)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(bt[:, :-1], bt[:, 1:])
        if scaler is None:
            loss.backward()
            update()
        else:  # fp16: scaled backward, unscaled clip, a skipped step on inf, the scale updated
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
        loss = loss.detach() if on_gpu else float(loss.detach())
        return loss, time.perf_counter() - t0

    return step


def _record(torch, fn, stream):
    """(replay, output): `fn`'s CUDA work captured on `stream` into one torch.cuda.graph (not run);
    `replay()` runs it again, refilling `output` in place. One seam, so tests can stand in for a GPU."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        out = fn()
    return graph.replay, out


@contextlib.contextmanager
def _warm_up_on(torch, stream):
    """Run the block on `stream` (the capture's, so that what cuBLAS sets up per stream is there
    before the capture), ordered after and before the current stream's work; None: where it is."""
    if stream is None:
        yield
        return
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream().wait_stream(stream)


def _graphed_step(torch, model, opt, loss_fn, update, batches):
    """The whole step captured in one torch.cuda.graph at the first call (with that batch), replayed
    after: the batch is copied into a static input before each replay."""
    state = {}

    def body(static):
        # gradients written afresh, not accumulated: at the capture the backward allocates them from the
        # graph's pool (PyTorch's notes), and each replay refills that memory in place
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(static[:, :-1], static[:, 1:])
        loss.backward()
        update()
        return loss.detach()

    def capture(first):
        static = first.clone()
        saved = [p.detach().clone() for p in model.parameters()]
        stream = torch.cuda.Stream() if first.is_cuda else None
        with _warm_up_on(torch, stream):  # warm-up off the default stream, as PyTorch's notes do
            for _ in range(3):
                body(static)
        with torch.no_grad():  # back to the engine's weights and a fresh AdamW: the first replay is step 1
            for p, q in zip(model.parameters(), saved):
                p.copy_(q)
            for st in opt.state.values():
                for v in st.values():
                    if torch.is_tensor(v):
                        v.zero_()
        replay, loss = _record(torch, lambda: body(static), stream)
        state.update(static=static, replay=replay, loss=loss)

    def step(b):
        t0 = time.perf_counter()
        if not state:
            capture(batches(b))
        state["static"].copy_(batches.host(b), non_blocking=True)  # pinned host -> the graph's input
        state["replay"]()
        return state["loss"], time.perf_counter() - t0

    step.warmup_steps = 0
    return step
