"""The settings of a training run (`TrainConfig`) and the model config they select.

    from xtrain_lessons.training.config import TrainConfig
    cfg = TrainConfig.from_file("run.toml").replace(steps=200)
    cfg.to_dict()   # what config.json records under "train"
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from xtrain_lessons.model.qwen3 import PRESETS, Config

__all__ = ["TrainConfig", "ConfigError", "DEFAULT_RUN_TIME_LIMIT", "model_config", "RESUME_FIXED_FIELDS",
           "check_fields"]


class ConfigError(ValueError):
    """A setting with an unknown name, a wrong type or a value out of range (a usage error)."""

#: fields that define the model and the data: a resumed run cannot change them
RESUME_FIXED_FIELDS = frozenset({"preset", "model", "data", "tokenizer", "vocab_size", "val_fraction",
                                 "seq_len", "seed"})


@dataclass
class TrainConfig:
    """Everything a run needs. Load from TOML/JSON with :meth:`from_file`; unknown keys are errors."""

    # model
    preset: str = "tiny"            # a key of model.PRESETS
    model: dict = field(default_factory=dict)  # overrides of preset fields, e.g. {"n_layers": 2}
    # data
    data: str | None = None         # UTF-8 text, documents separated by <|endoftext|> lines
    tokenizer: str | None = None    # a tokenizer.json to use instead of training one
    vocab_size: int = 2048          # when training the tokenizer (tokenizer.DEFAULT_VOCAB_SIZE)
    tokenizer_impl: str = "course"  # who trains and runs the BPE: "course" (bpe_*.py, phase T05b) or
                                    # "hf" (the tokenizers library); the same tokenizer.json either way
    val_fraction: float = 0.05
    # optimisation
    steps: int = 500                # default run: ~1M tokens; see the time_limit guard below
    batch_size: int = 16
    seq_len: int = 128
    max_lr: float = 3e-3
    min_lr: float = 3e-4
    warmup: int = 30
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0          # 0 disables clipping (the norm is still logged)
    spike_factor: float = 3.0       # stop (like a NaN) when a loss exceeds this x the lowest so
                                    # far (on the CPU path, log_every 1); 0: no spike guard
    accum_steps: int = 1            # T16: micro-batches of batch_size per optimizer step (loss / N
                                    # each, one update); under `xtrain launch` (T17) every rank
                                    # takes batch_size rows: global batch = batch_size*accum*ranks
    seed: int = 0
    # bookkeeping
    out: str | None = None          # run directory; default runs/<timestamp>
    eval_every: int = 100
    eval_batches: int = 8
    log_every: int = 0              # T07b: steps between host synchronisations. 1: the loss is read
                                    # every step and a NaN stops the run before its update; N > 1:
                                    # loss and gradient norm stay on the device, a non-finite step
                                    # skips its update (and every later one) on the device, and the
                                    # values are read (metrics, bar, the NaN check) every N steps.
                                    # 0: 1 on the CPU (reading is free), 10 on a GPU
    sample_every: int = 100
    sample_prompt: str = "Once upon a time"
    sample_tokens: int = 64
    sample_temperature: float = 0.8
    sample_top_k: int | None = 40
    checkpoint_every: int = 200
    keep_checkpoints: int = 2
    time_limit: float | None = None  # seconds of wall time; stop (with a checkpoint) when
                                     # exceeded. None or 0: no limit. `xtrain train` without
                                     # --steps/--config uses DEFAULT_RUN_TIME_LIMIT
    threads: int = 0                # CPU threads of the engine (its matmuls and row blocks,
                                    # cpu_threads.set_blas_threads): N, or 0 = as the process has
                                    # them (a new process: every core, up to 8). The same bits
                                    # with any count (tests/test_cpu_threads.py); `xtrain bench
                                    # train --threads N` measures the speed
    dtype: str = "float32"          # T12/T12b compute dtype: "float32", "bf16" or "fp16" (float32 master
                                    # weights and AdamW state either way; xtrain_lessons.model.precision;
                                    # fp16 adds dynamic loss scaling: training.optim.grad_scaler)
    loss_scale: float = 0.0         # T12b fp16: 0 = dynamic (2^16, halved on inf, doubled after 2000
                                    # clean steps); S > 0: a fixed scale S (1: no scaling)
    cuda_graph: bool = True         # T07b, on a GPU: capture the step once per batch shape as a CUDA
                                    # graph and replay it (training/loop/cuda_graph.py); False: eager steps

    # -- (de)serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        if not isinstance(d, dict):
            raise ConfigError(f"expected a table of TrainConfig settings, got {type(d).__name__}")
        check_fields(cls, d, "TrainConfig")
        return cls(**d).validate()

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "TrainConfig":
        """Read a ``.toml`` or ``.json`` file (a ``[train]`` table, if present, is used)."""
        path = Path(path)
        if path.is_dir():
            raise ConfigError(f"--config {path} is a directory, not a TOML or JSON file")
        try:
            text = path.read_text(encoding="utf-8")
            d = tomllib.loads(text) if path.suffix.lower() == ".toml" else json.loads(text)
        except FileNotFoundError:
            raise ConfigError(f"--config {path}: no such file") from None
        except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as e:
            kind = "TOML" if path.suffix.lower() == ".toml" else "JSON"
            raise ConfigError(f"{path} is not valid {kind}: {e}") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{path} must hold a table of TrainConfig settings")
        if "train" in d and isinstance(d["train"], dict):
            d = d["train"]
        try:
            return cls.from_dict(d)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    def replace(self, **changes) -> "TrainConfig":
        check_fields(type(self), changes, "TrainConfig")
        return dataclasses.replace(self, **changes).validate()

    def validate(self) -> "TrainConfig":
        """Types and ranges of every field (the one place settings are checked); ConfigError."""
        check_fields(type(self), self.to_dict(), "TrainConfig")
        check_fields(Config, self.model, "model")
        for name in ("steps", "batch_size", "seq_len", "eval_batches", "vocab_size", "accum_steps"):
            _require(getattr(self, name) > 0, name, "a positive integer", getattr(self, name))
        for name in ("warmup", "eval_every", "sample_every", "checkpoint_every", "keep_checkpoints",
                     "threads", "log_every"):
            zero = {"threads": "as the process has them", "log_every": "1 on the CPU, 10 on a GPU"}.get(name, "never")
            _require(getattr(self, name) >= 0, name, f"an integer >= 0 (0 = {zero})", getattr(self, name))
        for name in ("max_lr", "min_lr", "weight_decay", "grad_clip", "sample_temperature", "spike_factor"):
            _require(_finite(getattr(self, name)) and getattr(self, name) >= 0, name, "a finite number >= 0",
                     getattr(self, name))
        _require(self.time_limit is None or (_finite(self.time_limit) and self.time_limit >= 0),
                 "time_limit", "a finite number of seconds >= 0 (0: none)", self.time_limit)
        _require(self.spike_factor == 0 or self.spike_factor > 1, "spike_factor", "0 (off) or > 1",
                 self.spike_factor)
        _require(self.sample_top_k is None or self.sample_top_k > 0, "sample_top_k", "None or >= 1",
                 self.sample_top_k)
        for name in ("beta1", "beta2"):
            _require(0.0 <= getattr(self, name) < 1.0, name, "in [0, 1)", getattr(self, name))
        _require(_finite(self.eps) and self.eps > 0, "eps", "a finite number > 0", self.eps)
        _require(0.0 < self.val_fraction < 1.0, "val_fraction", "in (0, 1)", self.val_fraction)
        _require(self.dtype in ("float32", "bf16", "fp16"), "dtype", "'float32', 'bf16' or 'fp16'", self.dtype)
        _require(_finite(self.loss_scale) and self.loss_scale >= 0, "loss_scale", "a number >= 0 (0: dynamic)",
                 self.loss_scale)
        if self.loss_scale and self.dtype != "fp16":
            raise ConfigError(f"loss_scale is for dtype fp16 (got dtype {self.dtype!r}): "
                              f"add --dtype fp16 or drop --loss-scale")
        _require(self.tokenizer_impl in ("course", "hf"), "tokenizer_impl", "'course' or 'hf'",
                 self.tokenizer_impl)
        _require(self.preset in PRESETS, "preset", f"one of {sorted(PRESETS)}", self.preset)
        return self


def _finite(v) -> bool:
    return math.isfinite(v)


def _require(ok: bool, name: str, what: str, value) -> None:
    if not ok:
        raise ConfigError(f"{name} must be {what}, got {value!r}")


# annotation text -> the Python types a value of that field may have (bool is not a number here)
_KINDS = {"int": (int,), "float": (int, float), "str": (str,), "bool": (bool,), "dict": (dict,)}


def check_fields(cls, values: dict, what: str) -> None:
    """Every key of `values` is a field of dataclass `cls` and has its annotated type (ConfigError)."""
    fields = {f.name: str(f.type) for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown {what} key{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}; "
                          f"known: {', '.join(sorted(fields))}")
    for name, v in values.items():
        kinds = [k.strip() for k in fields[name].split("|")]
        if v is None and "None" in kinds:
            continue
        types = tuple(t for k in kinds for t in _KINDS.get(k, ()))
        if types and (not isinstance(v, types) or (isinstance(v, bool) and bool not in types)):
            raise ConfigError(f"{what} {name} must be {' or '.join(k for k in kinds)}, got {v!r}")


#: the time limit `xtrain train` applies to its default schedule (no --steps, no --config), so
#: the default run keeps its 10-minute budget on a slower or busier machine
DEFAULT_RUN_TIME_LIMIT = 540.0


def model_config(cfg: TrainConfig, vocab_size: int):
    if cfg.preset not in PRESETS:
        raise ValueError(f"unknown preset {cfg.preset!r}; choose one of {sorted(PRESETS)}")
    base = PRESETS[cfg.preset]
    changes = dict(cfg.model)
    changes.setdefault("vocab_size", vocab_size)
    changes.setdefault("max_seq_len", max(base.max_seq_len, cfg.seq_len))
    mc = base.replace(**changes)
    if mc.vocab_size < vocab_size:
        raise ValueError(f"model vocab_size {mc.vocab_size} < tokenizer vocabulary {vocab_size}")
    if cfg.seq_len > mc.max_seq_len:
        raise ValueError(f"seq_len {cfg.seq_len} > model max_seq_len {mc.max_seq_len}")
    return mc
