"""The settings of a training run (`TrainConfig`) and the model config they select.

    from xtrain_lessons.training.config import TrainConfig
    cfg = TrainConfig.from_file("run.toml").replace(steps=200)
    cfg.to_dict()   # what config.json records under "train"
"""

from __future__ import annotations

import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from xtrain_lessons.model.qwen3 import PRESETS

__all__ = ["TrainConfig", "DEFAULT_RUN_TIME_LIMIT", "model_config", "RESUME_FIXED_FIELDS"]

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
    accum_steps: int = 1            # T16: micro-batches of batch_size per optimizer step (loss / N
                                    # each, one update); under `xtrain launch` (T17) every rank
                                    # takes batch_size rows: global batch = batch_size*accum*ranks
    seed: int = 0
    # bookkeeping
    out: str | None = None          # run directory; default runs/<timestamp>
    eval_every: int = 100
    eval_batches: int = 8
    log_every: int = 0              # T07: steps between host synchronisations. 1: the loss is read
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
                                    # with any count (tests/test_rowwise.py); `xtrain bench
                                    # train --threads N` measures the speed
    dtype: str = "float32"          # T12 compute dtype: "float32", "bf16" or "fp16" (float32 master
                                    # weights and AdamW state either way; xtrain_lessons.model.precision;
                                    # fp16 adds dynamic loss scaling: training.grad_scaler)
    loss_scale: float = 0.0         # T12 fp16: 0 = dynamic (2^16, halved on inf, doubled after 2000
                                    # clean steps); S > 0: a fixed scale S (1: no scaling)

    # -- (de)serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise ValueError(f"TrainConfig: unknown keys {unknown}; known: {sorted(names)}")
        return cls(**d).validate()

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "TrainConfig":
        """Read a ``.toml`` or ``.json`` file (a ``[train]`` table, if present, is used)."""
        path = Path(path)
        text = path.read_text(encoding="utf-8")
        if path.suffix.lower() == ".toml":
            d = tomllib.loads(text)
        else:
            d = json.loads(text)
        if "train" in d and isinstance(d["train"], dict):
            d = d["train"]
        return cls.from_dict(d)

    def replace(self, **changes) -> "TrainConfig":
        return dataclasses.replace(self, **changes).validate()

    def validate(self) -> "TrainConfig":
        for name in ("steps", "batch_size", "seq_len", "eval_batches", "vocab_size", "accum_steps"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
                raise ValueError(f"TrainConfig: {name} must be a positive integer, got {v!r}")
        for name in ("warmup", "eval_every", "sample_every", "checkpoint_every", "keep_checkpoints",
                     "threads", "log_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                zero = {"threads": "as the process has them", "log_every": "1 on the CPU, 10 on a GPU"}.get(name, "never")
                raise ValueError(f"TrainConfig: {name} must be an integer >= 0 (0 = {zero}), got {v!r}")
        if not (self.max_lr >= 0 and self.min_lr >= 0):
            raise ValueError("TrainConfig: learning rates must be >= 0")
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"TrainConfig: val_fraction must be in (0, 1), got {self.val_fraction}")
        if self.dtype not in ("float32", "bf16", "fp16"):
            raise ValueError(f"TrainConfig: dtype must be 'float32', 'bf16' or 'fp16', got {self.dtype!r}")
        if not (isinstance(self.loss_scale, (int, float)) and self.loss_scale >= 0):
            raise ValueError(f"TrainConfig: loss_scale must be >= 0 (0: dynamic), got {self.loss_scale!r}")
        if self.loss_scale and self.dtype != "fp16":
            raise ValueError(f"TrainConfig: loss_scale is for dtype fp16 (got dtype {self.dtype!r}): "
                             f"add --dtype fp16 or drop --loss-scale")
        return self


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
