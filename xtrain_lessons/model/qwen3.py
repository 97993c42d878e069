"""A tiny Qwen3-style decoder-only transformer on the tape autograd (phase T05).

    ids (B, T) -> embed_tokens -> n_layers x Block -> norm -> lm_head -> logits (B, T, V)
    Block:  x = x + o_proj(attention(rope(qk_norm(q)), rope(qk_norm(k)), v))   (RMSNorm first)
            x = x + down_proj(silu(gate_proj(h)) * up_proj(h)),  h = RMSNorm(x)

Parameters are `Tensor`s named exactly as in Hugging Face Qwen3 (`model.layers.0.self_attn.
q_proj.weight`, ...; weights in the (out, in) layout, no biases, untied lm_head), so
exporting to the HF format is a plain mapping.

Initialisation (deterministic: one `np.random.default_rng(seed)`, drawn in parameter order):
    embeddings and linear weights   normal(0, 0.02)
    o_proj and down_proj weights    normal(0, 0.02 / sqrt(2 * n_layers))  (the two writes into
                                    the residual stream, GPT-2 style, keep its variance flat)
    RMSNorm weights                 ones
Everything is float32 unless asked otherwise.

    from xtrain_lessons.model.qwen3 import Config, Model, PRESETS
    model = Model(PRESETS["tiny"].replace(vocab_size=tok.get_vocab_size()), seed=0)
    loss = model.loss(ids, targets); loss.backward()
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor, no_grad
from xtrain_lessons.model.dropout import DeviceKey, dropout
from xtrain_lessons.model.flash_attention import flash_attention
from xtrain_lessons.model.layers import causal_attention, linear, linear_cross_entropy, rope, rope_tables, swiglu
from xtrain_lessons.model.precision import forward_lowp, loss_lowp
from xtrain_lessons.model.recompute import checkpoint
from xtrain_lessons.model.inputs import HostChecked, check_ids
from xtrain_lessons.runtime.device import array_module, move_to, to_device_of

__all__ = ["Config", "PRESETS", "Model", "KVCache", "ffn_dim_for"]


def ffn_dim_for(dim: int, multiple: int = 32) -> int:
    """The SwiGLU hidden size: 8/3 * dim (same parameter count as a 4*dim GELU MLP),
    rounded up to a multiple of `multiple`."""
    return multiple * math.ceil(8 * dim / 3 / multiple)


@dataclass
class Config:
    """Model hyper-parameters (the fields Hugging Face's Qwen3Config needs, in our names).

    head_dim, n_kv_heads and ffn_dim may be left None: they become dim // n_heads,
    n_heads (plain multi-head attention) and ffn_dim_for(dim).
    """

    vocab_size: int = 4096
    dim: int = 192
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int | None = None
    head_dim: int | None = None
    ffn_dim: int | None = None
    rope_theta: float = 10000.0
    norm_eps: float = 1e-6
    max_seq_len: int = 256
    qk_norm: bool = True
    attention: str = "composed"  # T14: "composed" (nn.causal_attention) or "flash"
    dropout: float = 0.0  # T18: dropout probability at the 2 residual sites of each block
    recompute: bool = False  # T13: keep only each block's input, recompute it in backward

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.head_dim is None:
            if not (isinstance(self.n_heads, int) and self.n_heads > 0 and self.dim % self.n_heads == 0):
                raise ValueError(f"Config: dim={self.dim} is not divisible by n_heads={self.n_heads}; "
                                 f"give head_dim explicitly or change them")
            self.head_dim = self.dim // self.n_heads
        if self.ffn_dim is None:
            self.ffn_dim = ffn_dim_for(self.dim)
        self.validate()

    def validate(self) -> "Config":
        """Raise ValueError with a clear message if the fields do not fit together."""
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "head_dim",
                     "ffn_dim", "max_seq_len"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v <= 0:
                raise ValueError(f"Config: {name} must be a positive integer, got {v!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"Config: n_heads={self.n_heads} must be a multiple of "
                             f"n_kv_heads={self.n_kv_heads} (grouped-query attention)")
        if self.head_dim % 2:
            raise ValueError(f"Config: head_dim={self.head_dim} must be even (RoPE rotates pairs)")
        if not self.rope_theta > 0:
            raise ValueError(f"Config: rope_theta must be > 0, got {self.rope_theta}")
        if not self.norm_eps > 0:
            raise ValueError(f"Config: norm_eps must be > 0, got {self.norm_eps}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"Config: dropout must be in [0, 1), got {self.dropout}")
        if self.attention not in ("composed", "flash"):
            raise ValueError(f"Config: attention must be 'composed' or 'flash', got {self.attention!r}")
        return self

    def replace(self, **changes) -> "Config":
        """A validated copy with some fields changed: `PRESETS["tiny"].replace(vocab_size=8000)`."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain JSON-serialisable dict (all fields)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "Config":
        """Inverse of to_dict; unknown keys are an error (a typo must not pass silently)."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"Config.from_dict: unknown keys {unknown}; known: {sorted(names)}")
        return cls(**d)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    @classmethod
    def from_json(cls, text: str) -> "Config":
        return cls.from_dict(json.loads(text))

    def n_params(self) -> int:
        """Number of scalars in the model this config describes."""
        d, hd = self.dim, self.head_dim
        attn = d * self.n_heads * hd + 2 * d * self.n_kv_heads * hd + self.n_heads * hd * d
        mlp = 3 * d * self.ffn_dim
        norms = 2 * d + (2 * hd if self.qk_norm else 0)
        return 2 * self.vocab_size * d + d + self.n_layers * (attn + mlp + norms)


PRESETS: dict[str, Config] = {
    # the default of `xtrain train`: 3.34M parameters at vocab 4096 (vocab is overridden from
    # the tokenizer). Forward+backward at batch 16 x 128: ~0.5 s on 2 idle CPU cores
    # (0.8 s of CPU time on one core; torch float32 on the same model: 0.67 s)
    "tiny": Config(vocab_size=4096, dim=192, n_layers=4, n_heads=4, n_kv_heads=4, head_dim=48,
                   ffn_dim=512, rope_theta=10000.0, max_seq_len=256, qk_norm=True),
    # ~20M parameters (21.1M at the bench's vocab 2048, 23.2M at 4096): the larger shape of
    # `xtrain bench train --preset 20m` (T07); too slow to train in the course's minutes on a CPU
    "20m": Config(vocab_size=4096, dim=512, n_layers=6, n_heads=8, n_kv_heads=8, head_dim=64,
                  ffn_dim=1376, rope_theta=10000.0, max_seq_len=512, qk_norm=True),
    # GPT-2-small's shape (124M at vocab 50257; 111M at 32768): the largest shape `xtrain bench train
    # --device cuda` measures the GPU engine at (8 x 1024 tokens a step); far too slow for a CPU
    "gpt2-small": Config(vocab_size=32768, dim=768, n_layers=12, n_heads=12, n_kv_heads=12, head_dim=64,
                         ffn_dim=2048, rope_theta=10000.0, max_seq_len=1024, qk_norm=True),
    # very small, for unit tests: GQA (4 query heads share 2 kv heads), runs in milliseconds
    "test": Config(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                   ffn_dim=64, rope_theta=10000.0, max_seq_len=32, qk_norm=True),
}


class KVCache:
    """Per-layer keys and values already computed, for decoding without recomputing the prefix.

    k[i], v[i]: arrays (B, max_len, n_kv_heads, head_dim) of layer i; positions < `pos` are
    filled. Plain arrays, used under no_grad only.
    """

    def __init__(self, config: Config, batch: int = 1, max_len: int | None = None,
                 dtype=np.float32, xp=np):
        self.max_len = max_len or config.max_seq_len
        shape = (batch, self.max_len, config.n_kv_heads, config.head_dim)
        self.k = [xp.zeros(shape, dtype=dtype) for _ in range(config.n_layers)]
        self.v = [xp.zeros(shape, dtype=dtype) for _ in range(config.n_layers)]
        self.pos = 0


class Model:
    """The Qwen3-style transformer. `model(ids)` -> logits Tensor (B, T, V)."""
    def __init__(self, config: Config, seed: int = 0, dtype=np.float32):
        self.config = config.validate()
        self.dtype = np.dtype(dtype)
        self.params: dict[str, Tensor] = {}
        rng = np.random.default_rng(seed)
        c = config
        std, std_out = 0.02, 0.02 / math.sqrt(2 * c.n_layers)
        q_out, kv_out = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim

        def normal(name, shape, s):
            w = rng.standard_normal(shape, dtype=np.float32) * np.float32(s)
            self.params[name] = Tensor(w.astype(self.dtype), requires_grad=True)

        def ones(name, n):
            self.params[name] = Tensor(np.ones(n, dtype=self.dtype), requires_grad=True)

        normal("model.embed_tokens.weight", (c.vocab_size, c.dim), std)
        for i in range(c.n_layers):
            p = f"model.layers.{i}."
            ones(p + "input_layernorm.weight", c.dim)
            normal(p + "self_attn.q_proj.weight", (q_out, c.dim), std)
            normal(p + "self_attn.k_proj.weight", (kv_out, c.dim), std)
            normal(p + "self_attn.v_proj.weight", (kv_out, c.dim), std)
            if c.qk_norm:
                ones(p + "self_attn.q_norm.weight", c.head_dim)
                ones(p + "self_attn.k_norm.weight", c.head_dim)
            normal(p + "self_attn.o_proj.weight", (c.dim, q_out), std_out)
            ones(p + "post_attention_layernorm.weight", c.dim)
            normal(p + "mlp.gate_proj.weight", (c.ffn_dim, c.dim), std)
            normal(p + "mlp.up_proj.weight", (c.ffn_dim, c.dim), std)
            normal(p + "mlp.down_proj.weight", (c.dim, c.ffn_dim), std_out)
        ones("model.norm.weight", c.dim)
        normal("lm_head.weight", (c.vocab_size, c.dim), std)
        cos, sin = rope_tables(c.max_seq_len, c.head_dim, c.rope_theta, self.dtype)
        self.rope_cos, self.rope_sin = cos, sin  # (max_seq_len, head_dim)
        # T18 dropout: train()/eval() switch; masks from the counter-based RNG keyed by
        # dropout_seed, stream offset = dropout_step * 2 * n_layers + site (see _forward)
        self.training = True
        self.dropout_seed = seed
        self.dropout_step = 0  # training-mode forwards with dropout so far
        # a step captured as a CUDA graph: offsets from this uint64 device array [seed, base offset]
        # (opset.DeviceKey), which the host rewrites before each replay (training/loop/cuda_graph.py)
        self.dropout_key = None
        # T12: "bf16"/"fp16" run __call__/loss with low-precision compute on float32 masters
        # (xtrain_lessons.model.precision); decoding with a KV cache stays float32
        self.compute_dtype = "float32"

    def __repr__(self):
        c = self.config
        return (f"Model({self.n_params() / 1e6:.2f}M params: vocab {c.vocab_size}, dim {c.dim}, "
                f"{c.n_layers} layers, {c.n_heads} heads ({c.n_kv_heads} kv) x {c.head_dim}, "
                f"ffn {c.ffn_dim}, qk_norm {c.qk_norm}, {self.dtype.name})")

    # -- parameters ------------------------------------------------------------------------
    def named_parameters(self) -> dict[str, Tensor]:
        """name -> Tensor, in a fixed order (embedding, layers, final norm, lm_head)."""
        return dict(self.params)

    def parameters(self) -> list[Tensor]:
        return list(self.params.values())

    def n_params(self) -> int:
        return sum(int(p.size) for p in self.params.values())

    def to(self, device: str) -> "Model":
        """Move the parameters (in place, same Tensor objects) to "cpu" (NumPy) or "cuda"
        (CuPy). Do it before creating the optimizer; gradients are dropped."""
        if device not in ("cpu", "cuda"):
            raise ValueError(f"Model.to: device must be 'cpu' or 'cuda', got {device!r}")
        conv = lambda a: move_to(a, device)  # noqa: E731
        for p in self.params.values():
            p.data, p.grad = conv(p.data), None
        self.rope_cos, self.rope_sin = conv(self.rope_cos), conv(self.rope_sin)
        return self

    def train(self, mode: bool = True) -> "Model":
        """Training mode (the default): dropout is applied when config.dropout > 0."""
        self.training = bool(mode)
        return self

    def eval(self) -> "Model":
        """Evaluation mode: dropout is the identity."""
        return self.train(False)

    def zero_grad(self):
        for p in self.params.values():
            p.grad = None

    def state_dict(self) -> dict[str, np.ndarray]:
        """name -> a NumPy copy of the parameter (copied from the GPU if it lives there)."""
        return {k: np.array(p.numpy(), copy=True) for k, p in self.params.items()}

    def load_state_dict(self, state: dict, strict: bool = True):
        """Copy arrays into the parameters (in place: optimizers keep their references).

        strict=True: missing and unexpected names are an error. Shapes must always match.
        Returns (missing, unexpected) lists of names.
        """
        missing = [k for k in self.params if k not in state]
        unexpected = [k for k in state if k not in self.params]
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys {unexpected}")
        bad = [f"{k}: checkpoint {tuple(np.shape(state[k]))} vs model {self.params[k].shape}"
               for k in self.params if k in state and tuple(np.shape(state[k])) != self.params[k].shape]
        if bad:
            raise ValueError("load_state_dict: shape mismatch: " + "; ".join(bad))
        for k, p in self.params.items():
            if k in state:
                xp = array_module(p.data)
                p.data[...] = xp.asarray(state[k], dtype=p.dtype)
        return missing, unexpected

    # -- forward ---------------------------------------------------------------------------
    def __call__(self, ids) -> Tensor:
        """ids: int array (B, T) with T <= max_seq_len -> logits Tensor (B, T, V)."""
        if self.compute_dtype in ("bf16", "fp16"):  # T12 mixed precision
            return forward_lowp(self, ids, self.compute_dtype)
        return self._forward(ids)

    forward = __call__

    def loss(self, ids, targets, ignore_index: int = -100) -> Tensor:
        """Mean cross-entropy of the next-token logits against `targets` (B, T); positions
        whose target is `ignore_index` do not count."""
        if self.compute_dtype in ("bf16", "fp16"):  # T12: float32 loss from bf16/fp16 logits
            return loss_lowp(self, ids, targets, ignore_index, self.compute_dtype)
        # the lm_head and the loss as one node: the (B, T, V) logits are never kept (T07)
        return linear_cross_entropy(self._forward(ids, head=False), self.params["lm_head.weight"],
                                    targets, ignore_index)

    def new_cache(self, batch: int = 1) -> KVCache:
        """An empty KVCache for this model (its dtype and array module), max_seq_len long."""
        return KVCache(self.config, batch, dtype=self.dtype,
                       xp=array_module(self.params["lm_head.weight"].data))

    def forward_cached(self, ids, cache: KVCache, start_pos: int):
        """Decoding step: logits array (B, T, V) for tokens `ids` (B, T) at positions
        start_pos .. start_pos+T-1, reading the keys/values of positions < start_pos from
        `cache` and appending their own. Runs under no_grad. Equals the last T rows of a
        full forward over the whole prefix."""
        if start_pos != cache.pos:
            raise ValueError(f"forward_cached: start_pos={start_pos} but the cache holds "
                             f"{cache.pos} positions")
        with no_grad():
            logits = self._forward(ids, cache, start_pos)
        cache.pos = start_pos + np.shape(ids)[1]
        return logits.data

    def _layers(self) -> SimpleNamespace:
        """The layer functions of the float32 forward (looked up at call time, so a test can
        patch one). T12's bf16 path passes its own set with the same signatures."""
        attend = flash_attention if self.config.attention == "flash" else causal_attention  # T14
        return SimpleNamespace(rmsnorm=ops.rmsnorm, linear=linear, rope=rope, attention=attend,
                               swiglu=swiglu, dropout=dropout)

    def _forward(self, ids, cache: KVCache | None = None, start_pos: int = 0, *,
                 layers: SimpleNamespace | None = None, params: dict | None = None,
                 head: bool = True) -> Tensor:
        """The forward pass. `layers`/`params` replace the layer functions and the weights
        (T12 passes bf16 layers and bf16 weight copies); by default float32 and self.params.
        head=False: the final normed hidden state (B, T, dim), without the lm_head."""
        c = self.config
        P = self.params if params is None else params
        L = self._layers() if layers is None else layers
        checked = isinstance(ids, HostChecked)  # on the device, checked before the copy
        ids = ids.data if isinstance(ids, (Tensor, HostChecked)) else ids
        if not checked:
            ids = check_ids(ids, c.vocab_size)  # on the host: free for a host batch
        B, T = ids.shape
        end = start_pos + T
        limit = cache.max_len if cache is not None else c.max_seq_len
        if end > min(limit, c.max_seq_len):
            raise ValueError(f"Model: positions up to {end} exceed max_seq_len={c.max_seq_len} "
                             f"(crop the context to the last max_seq_len tokens)")
        H, Hkv, D = c.n_heads, c.n_kv_heads, c.head_dim
        weights = P["lm_head.weight"].data  # the tables follow the weights' device (moved once)
        self.rope_cos, self.rope_sin = to_device_of(self.rope_cos, weights), to_device_of(self.rope_sin, weights)
        cos, sin = self.rope_cos[start_pos:end], self.rope_sin[start_pos:end]  # (T, D)

        x = ops.embedding(P["model.embed_tokens.weight"], ids, checked=True)  # (B, T, dim)
        # T18: dropout on what each sublayer adds to the residual stream, in training mode.
        # Site s (2i: attention, 2i+1: MLP of block i) of training forward number `step` draws
        # from Philox stream offset = step * 2 * n_layers + s: fresh per site and step, and
        # fixed here, so a block recomputed in backward (T13) draws the same mask.
        drop_base = None
        if c.dropout > 0 and self.training and cache is None:
            drop_base, self.dropout_step = self.dropout_step * 2 * c.n_layers, self.dropout_step + 1
            if self.dropout_key is not None:  # read on the device: key[1] + drop_base + site
                drop_base = DeviceKey(self.dropout_key, drop_base)

        def resid(t, site):
            return t if drop_base is None else L.dropout(t, c.dropout, self.dropout_seed, drop_base + site)

        def block(x, i):  # transformer block i: x -> x + attention, then + MLP
            p = f"model.layers.{i}."
            # attention
            h = L.rmsnorm(x, P[p + "input_layernorm.weight"], c.norm_eps)
            q = L.linear(h, P[p + "self_attn.q_proj.weight"]).reshape(B, T, H, D)
            k = L.linear(h, P[p + "self_attn.k_proj.weight"]).reshape(B, T, Hkv, D)
            v = L.linear(h, P[p + "self_attn.v_proj.weight"]).reshape(B, T, Hkv, D)
            if c.qk_norm:  # per-head RMSNorm over head_dim, before RoPE (Qwen3)
                q = L.rmsnorm(q, P[p + "self_attn.q_norm.weight"], c.norm_eps)
                k = L.rmsnorm(k, P[p + "self_attn.k_norm.weight"], c.norm_eps)
            q, k = L.rope(q, cos, sin), L.rope(k, cos, sin)  # (B, T, H|Hkv, D)
            if cache is not None:  # store this step's keys/values, attend over the prefix
                cache.k[i][:, start_pos:end] = k.data
                cache.v[i][:, start_pos:end] = v.data
                k, v = Tensor(cache.k[i][:, :end]), Tensor(cache.v[i][:, :end])
            a = L.attention(q, k, v).reshape(B, T, H * D)  # (B, T, H*D)
            x = x + resid(L.linear(a, P[p + "self_attn.o_proj.weight"]), 2 * i)
            # MLP
            h = L.rmsnorm(x, P[p + "post_attention_layernorm.weight"], c.norm_eps)
            g = L.swiglu(L.linear(h, P[p + "mlp.gate_proj.weight"]), L.linear(h, P[p + "mlp.up_proj.weight"]))
            x = x + resid(L.linear(g, P[p + "mlp.down_proj.weight"]), 2 * i + 1)  # (B, T, dim)
            return x

        recompute = c.recompute and cache is None  # T13: keep only the block inputs
        for i in range(c.n_layers):
            x = checkpoint(block, x, i) if recompute else block(x, i)
        x = L.rmsnorm(x, P["model.norm.weight"], c.norm_eps)
        return L.linear(x, P["lm_head.weight"]) if head else x  # (B, T, V) or (B, T, dim)
