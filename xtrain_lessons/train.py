"""The training loop: data -> model -> loss -> backward -> clip -> AdamW, with everything around it.

    from xtrain_lessons.train import TrainConfig, train
    result = train(TrainConfig(preset="test", steps=50, data="my.txt", out="runs/demo"))
    result = train(resume="runs/demo", overrides={"steps": 80})     # continue the same run

One step (``step`` counts the optimizer steps already taken, from 0):

    lr   = lr_at(step + 1, max_lr, min_lr, warmup, steps) # warmup, then cosine to min_lr at the end
    x, y = train_data.get_batch(batch_size, seq_len, rng) # random windows, y = x shifted by 1
    loss = model.loss(x, y); loss.backward()
    norm = clip_grad_norm(params, grad_clip)              # global L2 norm, before clipping
    optimizer.step(lr)

Around it: a tqdm bar (loss, lr, tokens/s); every ``eval_every`` steps the validation loss
and perplexity on ``eval_batches`` fixed batches; every ``sample_every`` steps a sample
decoded to text; every ``checkpoint_every`` steps a checkpoint; ``metrics.jsonl`` (one JSON
object per step); ``loss.png``; at the end a summary (``summary.json``).

The default run (``xtrain train`` with no arguments): the "tiny" preset (2.6M parameters at
the 2048-token vocabulary), 500 steps of 16 × 128 tokens (about 2 passes over the shipped
corpus), AdamW lr 3e-3 → 3e-4 after 30 warmup steps, one BLAS thread. It takes roughly 5–8
minutes on 2 CPU cores; the command line gives this default schedule a time limit
(``DEFAULT_RUN_TIME_LIMIT``, 540 s) that stops it early, with a checkpoint, on a slower or
busier machine, so the 10-minute budget holds either way.

Exact resume. Everything random that the *training* trajectory depends on is the one
data Generator, whose ``bit_generator.state`` goes into each checkpoint; evaluation and
sampling use their own, freshly seeded generators. So ``k steps, stop, resume to N`` gives
bit-for-bit the parameters of ``N steps straight`` on the same machine.

Failure handling. A NaN/inf loss or gradient norm stops the run before the bad update is
applied, with a message; nothing is saved, so the last good checkpoint stays ``latest``.
With ``log_every`` N > 1 (the default on a GPU) the step has no host synchronisation: loss
and gradient norm stay on the device, clipping and the finite check run there, and a bad
step's update (and every later one) is skipped on the device; the values are read every N
steps (and before evaluating, sampling or saving), where the run stops the same way, with
the weights of the last good step. On the CPU reading a value is free, so N = 1 there.
Ctrl-C finishes the step in progress, saves a checkpoint and returns cleanly (a second
Ctrl-C aborts at once).

The run directory::

    runs/<name>/config.json        train config + model config + tokenizer hash
                tokenizer.json     the tokenizer (trained on --data unless one is given)
                data/              the prepared token streams (train/val)
                checkpoints/       step_XXXXXXXX/ + latest
                metrics.jsonl      {"step", "train_loss", "lr", "grad_norm", "tokens_per_s", ...}
                samples.txt        periodic samples
                loss.png           the loss curves
                summary.json       the final numbers
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .checkpoint import load_checkpoint, save_checkpoint
from .autograd import array_module
from . import rowwise
from .optim import AdamW, clip_grad_norm, global_grad_norm
from .schedule import lr_at

__all__ = ["TrainConfig", "TrainResult", "train", "TrainingDiverged", "load_run", "evaluate",
           "plot_metrics", "read_metrics"]


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
                                    # rowwise.set_blas_threads): N, or 0 = as the process has
                                    # them (a new process: every core, up to 8). The same bits
                                    # with any count (tests/test_rowwise.py); `xtrain bench
                                    # train --threads N` measures the speed
    dtype: str = "float32"          # T12 compute dtype: "float32" or "bf16" (float32 master
                                    # weights and AdamW state either way; xtrain_lessons.amp)

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
            import tomllib  # noqa: PLC0415

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
        if self.dtype not in ("float32", "bf16"):
            raise ValueError(f"TrainConfig: dtype must be 'float32' or 'bf16', got {self.dtype!r}")
        return self


#: the time limit `xtrain train` applies to its default schedule (no --steps, no --config), so
#: the default run keeps its 10-minute budget on a slower or busier machine
DEFAULT_RUN_TIME_LIMIT = 540.0


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became NaN/inf."""


@dataclass
class TrainResult:
    run_dir: Path
    step: int                       # optimizer steps completed
    status: str                     # "done", "interrupted", "diverged", "stopped", "time_limit"
    model: Any
    optimizer: Any
    tokenizer: Any
    summary: dict
    losses: list = field(default_factory=list)


# ----- run directory ----------------------------------------------------------------------

def _default_run_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


def _model_config(cfg: TrainConfig, vocab_size: int):
    from .model import PRESETS  # noqa: PLC0415

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


def _write_json_atomic(path: Path, obj) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _vocab_size(tok) -> int:
    return int(tok.get_vocab_size())


def _prepare_data(cfg: TrainConfig, run_dir: Path, tok, log, reuse: bool):
    """Tokenize the corpus into run_dir/data (a resumed run reuses it)."""
    from .data import TokenDataset, prepare  # noqa: PLC0415

    data_dir = run_dir / "data"
    if reuse:
        try:
            return TokenDataset(data_dir, "train", tokenizer=tok), TokenDataset(data_dir, "val", tokenizer=tok)
        except FileNotFoundError:  # not there (deleted?): prepare it
            pass
        except ValueError as e:  # stale or damaged: prepare again
            log(f"data: {e}; preparing again")
        if cfg.data is None or not Path(cfg.data).exists():
            raise FileNotFoundError(f"{data_dir} is missing or damaged and the source text {cfg.data} "
                                    f"is not there to prepare it again")
    t0 = time.perf_counter()
    prepare(cfg.data, data_dir, tok, val_fraction=cfg.val_fraction, seed=cfg.seed)
    log(f"data: tokenized {cfg.data} into {data_dir} in {time.perf_counter() - t0:.1f}s")
    return TokenDataset(data_dir, "train", tokenizer=tok), TokenDataset(data_dir, "val", tokenizer=tok)


def _dataset_tokens(ds) -> int | None:
    for attr in ("n_tokens", "num_tokens"):
        if hasattr(ds, attr):
            v = getattr(ds, attr)
            return int(v() if callable(v) else v)
    for attr in ("tokens", "data", "ids"):
        if hasattr(ds, attr):
            try:
                return int(len(getattr(ds, attr)))
            except TypeError:
                pass
    try:
        return int(len(ds))
    except TypeError:
        return None


def load_run(run_dir: str | os.PathLike):
    """(model, tokenizer, checkpoint) of a run directory's latest checkpoint, for sampling."""
    from .model import Config, Model  # noqa: PLC0415
    from .tokenizer import load_tokenizer, tokenizer_hash  # noqa: PLC0415

    run_dir = Path(run_dir)
    if not (run_dir / "config.json").exists():
        raise FileNotFoundError(f"{run_dir} is not a run directory (no config.json)")
    conf = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    tok = load_tokenizer(str(run_dir / "tokenizer.json"))
    model = Model(Config.from_dict(conf["model"]), seed=0)
    ck = load_checkpoint(run_dir, model, expected_tokenizer_hash=tokenizer_hash(tok))
    return model, tok, ck


# ----- evaluation, samples, plot ---------------------------------------------------------

def evaluate(model, dataset, batch_size: int, seq_len: int, n_batches: int, seed: int = 0) -> float:
    """Mean loss over the first ``n_batches`` batches of non-overlapping windows of ``dataset``
    (the same tokens every time, so successive evaluations are comparable). Datasets without
    ``iter_batches`` are sampled with a fresh ``Generator(seed)`` instead."""
    from .autograd import no_grad  # noqa: PLC0415

    if hasattr(dataset, "iter_batches"):
        batches = dataset.iter_batches(batch_size, seq_len, max_batches=n_batches)
    else:
        rng = np.random.default_rng(seed)
        batches = (dataset.get_batch(batch_size, seq_len, rng) for _ in range(n_batches))
    total, count = 0.0, 0
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()  # dropout (T18) is the identity while evaluating
    try:
        with no_grad():
            for x, y in batches:
                n = x.shape[0] * x.shape[1]
                total += float(model.loss(x, y).item()) * n
                count += n
    finally:
        if hasattr(model, "train"):
            model.train(was_training)
    if count == 0:
        raise ValueError("evaluate: the validation split is empty")
    return total / count


def _sample_text(model, tok, prompt: str, n_tokens: int, temperature: float, top_k, seed: int) -> str:
    from .generate import generate  # noqa: PLC0415
    from .tokenizer import eot_id  # noqa: PLC0415

    ids = tok.encode(prompt).ids
    if not ids:
        ids = [eot_id(tok)]
    new = generate(model, ids, max_new_tokens=n_tokens, temperature=temperature, top_k=top_k,
                   eos_id=eot_id(tok), seed=seed)
    return prompt + tok.decode(new)


def read_metrics(path: str | os.PathLike) -> list[dict]:
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a crash
    return out


def plot_metrics(metrics: list[dict], path: str | os.PathLike, title: str = "") -> None:
    """Train loss (raw and smoothed) and validation loss against step, as a PNG (Agg, no GUI)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    steps = [m["step"] for m in metrics if "train_loss" in m]
    loss = [m["train_loss"] for m in metrics if "train_loss" in m]
    fig = Figure(figsize=(7, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if loss:
        ax.plot(steps, loss, color="tab:blue", alpha=0.3, lw=0.8, label="train (per step)")
        k = max(1, len(loss) // 50)
        if k > 1:
            sm = np.convolve(loss, np.ones(k) / k, mode="valid")
            ax.plot(steps[k - 1:], sm, color="tab:blue", lw=1.6, label=f"train (mean of {k})")
    vs = [(m["step"], m["val_loss"]) for m in metrics if m.get("val_loss") is not None]
    if vs:
        ax.plot(*zip(*vs), "o-", color="tab:orange", lw=1.6, label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title or "loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(path))


# ----- the loop --------------------------------------------------------------------------

class _SigintDefer:
    """While active, the first Ctrl-C only sets a flag (the loop stops at the next step
    boundary); a second one raises KeyboardInterrupt at once."""

    def __init__(self):
        self.requested = False
        self._old = None

    def __enter__(self):
        try:
            self._old = signal.signal(signal.SIGINT, self._handler)
        except ValueError:  # not the main thread: leave Ctrl-C alone
            self._old = None
        return self

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc):
        if self._old is not None:
            signal.signal(signal.SIGINT, self._old)
        return False


def train(cfg: TrainConfig | None = None, *, resume: str | os.PathLike | None = None,
          overrides: dict | None = None, stop_at: int | None = None, progress: bool | None = None,
          log=None) -> TrainResult:
    """Run (or continue) a training run. Returns a :class:`TrainResult`.

    ``resume``: a run directory; its ``config.json`` is the config, ``overrides`` change
    fields of it (e.g. ``{"steps": 2000}`` to extend). ``stop_at``: stop after that many
    steps (with a checkpoint) without changing the schedule, which still spans ``steps``.
    ``log``: a function taking a line of text (default: print above the progress bar).
    """
    t_start = time.perf_counter()
    overrides = dict(overrides or {})
    if resume is not None:
        run_dir = Path(resume)
        conf_path = run_dir / "config.json"
        if not conf_path.exists():
            raise FileNotFoundError(f"--resume {run_dir}: not a run directory (no config.json)")
        conf = json.loads(conf_path.read_text(encoding="utf-8"))
        base = TrainConfig.from_dict(conf["train"])
        fixed = {"preset", "model", "data", "tokenizer", "vocab_size", "val_fraction", "seq_len", "seed"}
        changed = sorted(k for k in overrides if k in fixed and overrides[k] != getattr(base, k))
        if changed:
            raise ValueError(f"cannot change {changed} when resuming (they define the model/data)")
        cfg = base.replace(**{k: v for k, v in overrides.items() if k in {f.name for f in dataclasses.fields(TrainConfig)}})
        cfg = cfg.replace(out=str(run_dir))
    else:
        cfg = (cfg or TrainConfig()).replace(**overrides) if overrides else (cfg or TrainConfig())
        cfg.validate()
        run_dir = Path(cfg.out) if cfg.out else _default_run_dir()
        cfg = cfg.replace(out=str(run_dir))
    if progress is None:
        progress = sys.stderr.isatty()

    run_dir.mkdir(parents=True, exist_ok=True)
    threads = cfg.threads or _cores_per_process()
    if threads:
        from .bench import blas_threads, set_blas_threads  # noqa: PLC0415

        before = blas_threads()
        set_blas_threads(threads)
        try:
            return _run(cfg, run_dir, resume, conf if resume is not None else None, stop_at, progress, log, t_start)
        finally:
            if before:
                set_blas_threads(before)  # leave the process as we found it
    return _run(cfg, run_dir, resume, conf if resume is not None else None, stop_at, progress, log, t_start)


def make_optimizer(params, cfg: TrainConfig, device: str):
    """AdamW for the run: on a GPU the fused kernel (kernels/adamw.cu, one launch per step over
    flat buffers: T07), on the CPU optim.AdamW (the kernel would run on the emulator). Both
    take the same arguments and save the same state_dict, so checkpoints move between them."""
    kw = dict(lr=cfg.max_lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)
    if device == "cuda":
        from .kernels.adamw import FusedAdamW  # noqa: PLC0415

        return FusedAdamW(params, **kw)
    return AdamW(params, **kw)


def _read_pending(pending):
    """Read the losses and gradient norms of the pending steps in ONE host synchronisation.

    Returns (good, bad): the steps up to the first non-finite one, with Python floats, and
    that step (None if every value is finite)."""
    if not pending:
        return [], None
    from .device import to_host  # noqa: PLC0415

    values = [v for p in pending for v in p[2:4]]
    if any(not isinstance(v, (int, float)) for v in values):
        xp = next(array_module(v) for v in values if not isinstance(v, (int, float)))
        values = to_host(xp.stack([xp.asarray(v, dtype=np.float64) for v in values])).tolist()
    good = []
    for i, p in enumerate(pending):
        loss, norm = values[2 * i], values[2 * i + 1]
        row = (p[0], p[1], loss, norm, p[4], p[5])
        if not (math.isfinite(loss) and math.isfinite(norm)):
            return good, row
        good.append(row)
    return good, None


def _cores_per_process() -> int:
    """Under `xtrain launch` / torchrun (LOCAL_WORLD_SIZE > 1): this process's share of the
    cores, so that the processes do not fight over them. Otherwise 0 (threads as they are)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, (os.cpu_count() or 1) // local) if local > 1 else 0


def _run(cfg: TrainConfig, run_dir: Path, resume, conf, stop_at, progress, log, t_start) -> TrainResult:
    from tqdm.auto import tqdm  # noqa: PLC0415

    from .model import Config, Model  # noqa: PLC0415
    from .tokenizer import load_tokenizer, save_tokenizer, tokenizer_hash, train_tokenizer  # noqa: PLC0415

    bar = None

    def say(msg: str) -> None:
        if log is not None:
            log(msg)
        elif bar is not None:
            bar.write(msg)
        else:
            print(msg, flush=True)

    from .ddp import DDP, accumulate_gradients, agree_any, average_scalar, micro_batches, setup_from_env  # noqa: PLC0415

    from .distributed import is_initialized as _group_exists  # noqa: PLC0415

    group_existed = _group_exists()
    dp = setup_from_env()  # T17: (rank, world size) under `xtrain launch` / torchrun, else None
    dp_rank, dp_world = dp if dp else (0, 1)
    if dp_rank:  # only rank 0 logs, samples and checkpoints
        say = lambda msg: None  # noqa: E731
        progress = False
        from .distributed import barrier  # noqa: PLC0415

        barrier()  # rank 0 writes the tokenizer and the data first (its barrier is below)

    # --- tokenizer -------------------------------------------------------------------------
    tok_path = run_dir / "tokenizer.json"
    if resume is None and not dp_rank:
        if (run_dir / "checkpoints" / "latest").exists():
            raise ValueError(f"{run_dir} already holds a run with checkpoints: continue it with "
                             f"--resume {run_dir}, or choose another --out")
        if cfg.data is None:
            from .data import default_corpus_path  # noqa: PLC0415

            cfg = cfg.replace(data=str(default_corpus_path()))
        if not Path(cfg.data).exists():
            raise FileNotFoundError(f"training text not found: {cfg.data}")
    if resume is not None or dp_rank:
        tok = load_tokenizer(str(tok_path))
    else:
        if cfg.tokenizer:
            tok = load_tokenizer(str(cfg.tokenizer))
        else:
            t0 = time.perf_counter()
            tok = train_tokenizer([str(cfg.data)], cfg.vocab_size)
            say(f"tokenizer: trained a {_vocab_size(tok)}-token BPE on {cfg.data} "
                f"in {time.perf_counter() - t0:.1f}s")
        save_tokenizer(tok, str(tok_path))
    tok_hash = tokenizer_hash(tok)

    # --- data, model, optimizer --------------------------------------------------------------
    train_ds, val_ds = _prepare_data(cfg, run_dir, tok, say, reuse=resume is not None or bool(dp_rank))
    if dp and not dp_rank:
        from .distributed import barrier  # noqa: PLC0415

        barrier()  # the tokenizer and the data are ready for the other ranks
    mcfg = _model_config(cfg, _vocab_size(tok))
    if resume is not None:
        mcfg = Config.from_dict(conf["model"])
    model = Model(mcfg, seed=cfg.seed)
    model.compute_dtype = cfg.dtype  # T12: bf16 compute copies of the float32 masters
    from .device import get_device, to_device  # noqa: PLC0415

    device = get_device()  # $XTRAIN_DEVICE / --device; "auto" is the CPU on a machine without GPU
    if device == "cuda":  # parameters move once; batches are moved by the model itself
        for p in model.parameters():
            p.data = to_device(p.data)
    params = model.named_parameters()
    opt = make_optimizer(params, cfg, device)
    rng = np.random.default_rng([cfg.seed, 1])  # the data stream
    step = 0
    metrics_path = run_dir / "metrics.jsonl"
    samples_path = run_dir / "samples.txt"
    ddp = DDP(model) if dp else None  # T08: rank 0's parameters everywhere, gradients averaged
    if dp_rank:  # T17: the other ranks keep their metrics aside
        (run_dir / f".rank{dp_rank}").mkdir(exist_ok=True)
        metrics_path, samples_path = (run_dir / f".rank{dp_rank}" / n for n in ("metrics.jsonl", "samples.txt"))

    if resume is not None:
        ck = load_checkpoint(run_dir, model, opt, expected_model_config=mcfg.to_dict(),
                             expected_tokenizer_hash=tok_hash)
        step = ck.step
        rng = ck.rng()
        # metrics written after that checkpoint belong to steps that will be redone
        kept = [m for m in read_metrics(metrics_path) if m.get("step", 0) <= step]
        with open(metrics_path, "w", encoding="utf-8") as f:
            for m in kept:
                f.write(json.dumps(m) + "\n")
        if samples_path.exists():  # likewise for samples
            chunks = samples_path.read_text(encoding="utf-8").split("--- step ")
            keep = [c for c in chunks[1:] if c.split("\n", 1)[0].strip().isdigit()
                    and int(c.split("\n", 1)[0]) <= step]
            samples_path.write_text("".join("--- step " + c for c in keep), encoding="utf-8")
        say(f"resumed {run_dir} at step {step} (from {ck.path.name})")
    else:
        if metrics_path.exists():
            metrics_path.unlink()
        if samples_path.exists():
            samples_path.unlink()

    if not dp_rank:
        _write_json_atomic(run_dir / "config.json", {
            "train": cfg.to_dict(), "model": mcfg.to_dict(), "tokenizer_hash": tok_hash,
            "n_params": model.n_params(), "data": {"dir": "data", "source": cfg.data},
        })

    tokens_per_step = cfg.batch_size * cfg.accum_steps * dp_world * cfg.seq_len
    n_train_tokens = _dataset_tokens(train_ds)
    if n_train_tokens is not None and n_train_tokens < cfg.seq_len + 1:
        raise ValueError(f"the training split has {n_train_tokens} tokens, fewer than one window of "
                         f"seq_len + 1 = {cfg.seq_len + 1}: use more text or a shorter --seq-len")
    n_val = _dataset_tokens(val_ds)
    eval_every = cfg.eval_every
    if eval_every and n_val is not None and n_val < cfg.seq_len + 1:
        say(f"warning: the validation split has only {n_val} tokens (< seq_len + 1); "
            f"validation is skipped in this run")
        eval_every = 0
    on = f"{device}, {rowwise.get_threads()} thread(s)" if device == "cpu" else device
    say(f"run {run_dir} on {on}: {cfg.preset} model, {model.n_params() / 1e6:.2f}M parameters, "
        f"vocab {mcfg.vocab_size}; {cfg.steps} steps x {cfg.batch_size} x {cfg.seq_len} tokens"
        + (f"; {n_train_tokens:,} training tokens" if n_train_tokens else "")
        + (f"; time limit {cfg.time_limit:.0f}s" if cfg.time_limit else ""))

    def checkpoint(at_step: int, data_rng) -> None:
        if dp_rank:
            return
        save_checkpoint(run_dir / "checkpoints", at_step, model, opt, train_config=cfg.to_dict(),
                        rng=data_rng, tokenizer_hash=tok_hash, keep_last=cfg.keep_checkpoints or None,
                        data_position=None)

    def sample(at_step: int) -> str:
        if dp_rank:
            return ""
        text = _sample_text(model, tok, cfg.sample_prompt, cfg.sample_tokens, cfg.sample_temperature,
                            cfg.sample_top_k, seed=cfg.seed + at_step)
        with open(samples_path, "a", encoding="utf-8") as f:
            f.write(f"--- step {at_step}\n{text}\n")
        return text

    eval_seed = cfg.seed + 1_000_003
    end = cfg.steps if stop_at is None else min(cfg.steps, stop_at)
    status = "done"
    message = ""
    first_loss = None
    last_loss = None
    last_val = None
    losses = []
    ema_tps = None
    train_time = 0.0
    last_ckpt = None
    # T07: host synchronisations only at logging points (see TrainConfig.log_every)
    log_every = cfg.log_every or (10 if device == "cuda" else 1)
    deferred = log_every > 1
    healthy = True  # on the device once a deferred step ran: every step so far was finite
    pending = []  # (step, lr, loss, grad norm, seconds, elapsed) not yet read on the host
    bar = tqdm(total=cfg.steps, initial=step, disable=not progress, dynamic_ncols=True,
               desc="train", unit="step", file=sys.stderr)
    mf = open(metrics_path, "a", encoding="utf-8")

    def read_pending() -> list[dict]:
        """The metric records of the pending steps, read in one host synchronisation; raises
        TrainingDiverged (after writing the good ones) if one of them was not finite."""
        nonlocal ema_tps, first_loss, last_loss, step
        good, bad = _read_pending(pending)
        pending.clear()
        recs = []
        for rec_step, rec_lr, loss_val, gnorm, dt, elapsed in good:
            tps = tokens_per_step / dt
            ema_tps = tps if ema_tps is None else 0.9 * ema_tps + 0.1 * tps
            first_loss = loss_val if first_loss is None else first_loss
            last_loss = loss_val
            losses.append(loss_val)
            recs.append({"step": rec_step, "train_loss": round(loss_val, 6), "lr": rec_lr,
                         "grad_norm": round(gnorm, 6), "tokens_per_s": round(tps, 1),
                         "tokens": rec_step * tokens_per_step, "elapsed_s": round(elapsed, 3)})
        if good:
            bar.update(len(good))
            bar.set_postfix_str(f"loss {last_loss:.3f} lr {good[-1][1]:.2e} {ema_tps:,.0f} tok/s")
        if bad is not None:
            step = bad[0] - 1  # the steps from the bad one on were skipped on the device
            mf.write("".join(json.dumps(r) + "\n" for r in recs))
            what, value = ("loss", bad[2]) if not math.isfinite(bad[2]) else ("gradient norm", bad[3])
            raise TrainingDiverged(
                f"{what} is {value} at step {step} (lr {bad[1]:.3g}): its update and every later "
                f"one were skipped on the device (read at the logging point, log_every "
                f"{log_every}); the model holds the weights of step {step} and the last good "
                f"checkpoint is left as it was; lower --max-lr or --grad-clip and resume.")
        return recs

    try:
        with _SigintDefer() as sigint:
            while step < end:
                over_time = bool(cfg.time_limit) and time.perf_counter() - t_start > cfg.time_limit
                if ddp is not None:  # T17: every rank stops at the same step
                    sigint.requested, over_time = agree_any([sigint.requested, over_time])
                if sigint.requested:
                    status = "interrupted"
                    break
                if over_time:
                    status = "time_limit"
                    break
                rng_before = rng.bit_generator.state
                in_update = False
                try:
                    t0 = time.perf_counter()
                    # update k = step+1 of 1..steps: warmup ends at k = warmup, min_lr at k = steps
                    lr = lr_at(step + 1, cfg.max_lr, cfg.min_lr, cfg.warmup, cfg.steps)
                    x, y = train_ds.get_batch(cfg.batch_size * cfg.accum_steps * dp_world, cfg.seq_len, rng)
                    model.dropout_step = step  # T18: masks keyed by step, so resume redraws them
                    loss = None
                    if cfg.accum_steps > 1 or ddp is not None:  # T16/T08: this rank's micro-batches,
                        loss_val = average_scalar(accumulate_gradients(  # one all-reduce at the end
                            model, micro_batches(x, y, cfg.accum_steps, dp_rank, dp_world), ddp))
                    else:
                        loss = model.loss(x, y)
                        loss_val = loss.data if deferred else float(loss.item())  # .item(): a sync
                    if not deferred and not math.isfinite(loss_val):
                        raise TrainingDiverged(
                            f"loss is {loss_val} at step {step} (lr {lr:.3g}); stopping before the "
                            f"update. The last good checkpoint is left as it was; lower --max-lr "
                            f"or --grad-clip and resume.")
                    if loss is not None:
                        model.zero_grad()
                        loss.backward()
                        del loss
                    if cfg.grad_clip > 0:
                        gnorm = clip_grad_norm(params, cfg.grad_clip, sync=not deferred)
                    else:
                        gnorm = global_grad_norm(params, sync=not deferred)
                    if deferred:  # T07: checked on the device, read at the logging point
                        xp = array_module(gnorm)
                        healthy = healthy & xp.isfinite(loss_val) & xp.isfinite(gnorm)
                    elif not math.isfinite(gnorm):
                        raise TrainingDiverged(
                            f"gradient norm is {gnorm} at step {step} (loss {loss_val:.4f}); "
                            f"stopping before the update; the last good checkpoint is intact.")
                    in_update = True
                    opt.step(lr, where=healthy if deferred else None)  # skipped once a value is bad
                    in_update = False
                    model.zero_grad()
                except KeyboardInterrupt:
                    if in_update:
                        status = "interrupted"
                        message = ("interrupted in the middle of an optimizer update: the weights "
                                   "are inconsistent, so no checkpoint was written")
                        raise
                    rng.bit_generator.state = rng_before  # the step never happened
                    status = "interrupted"
                    break
                dt = time.perf_counter() - t0
                train_time += dt
                step += 1
                pending.append((step, lr, loss_val, gnorm, dt, time.perf_counter() - t_start))
                at_eval = bool(eval_every) and (step % eval_every == 0 or step == cfg.steps)
                at_sample = bool(cfg.sample_every) and (step % cfg.sample_every == 0 or step == cfg.steps)
                at_ckpt = bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0
                if step % log_every and step < end and not (at_eval or at_sample or at_ckpt):
                    continue  # values stay on the device until the logging point
                recs = read_pending()  # the logging point: one host synchronisation
                if at_eval:  # recs[-1] is this step's record
                    last_val = evaluate(model, val_ds, cfg.batch_size, cfg.seq_len, cfg.eval_batches,
                                        eval_seed)
                    recs[-1]["val_loss"] = round(last_val, 6)
                    recs[-1]["val_ppl"] = round(math.exp(min(last_val, 50.0)), 3)
                    say(f"step {step:>6}: train loss {last_loss:.4f}  val loss {last_val:.4f}  "
                        f"val ppl {recs[-1]['val_ppl']:.2f}  lr {lr:.2e}  {ema_tps:,.0f} tok/s")
                mf.write("".join(json.dumps(r) + "\n" for r in recs))
                mf.flush()
                if at_sample:
                    say(f"sample @ {step}: {sample(step)!r}")
                if at_ckpt:
                    checkpoint(step, rng)
                    last_ckpt = step
            if pending:  # stopped between logging points: read (and check) them before saving
                mf.write("".join(json.dumps(r) + "\n" for r in read_pending()))
    except TrainingDiverged as e:
        status = "diverged"
        message = str(e)
    finally:
        bar.close()
        mf.close()
        bar = None

    if status == "diverged":
        say(f"TRAINING STOPPED: {message}")
    else:
        if last_ckpt != step and step > 0:
            checkpoint(step, rng)
        if status == "done" and step < cfg.steps:
            status = "stopped"
        if status == "interrupted":
            say(f"interrupted: checkpoint saved at step {step}; continue with "
                f"`xtrain train --resume {run_dir}`")
        if status == "time_limit":
            say(f"time limit reached at step {step}; checkpoint saved")

    metrics = read_metrics(metrics_path)
    final_sample = None
    if status != "diverged" and step > 0 and not dp_rank:
        try:
            plot_metrics(metrics, run_dir / "loss.png",
                         title=f"{run_dir.name}: {cfg.preset}, {model.n_params() / 1e6:.2f}M params")
        except Exception as e:  # noqa: BLE001 - a plot must never lose a run
            say(f"(loss plot skipped: {e})")
        if cfg.sample_tokens > 0 and not (cfg.sample_every and step % cfg.sample_every == 0):
            final_sample = sample(step)
    elapsed = time.perf_counter() - t_start
    run_losses = [m["train_loss"] for m in metrics if "train_loss" in m]
    val_losses = [m["val_loss"] for m in metrics if m.get("val_loss") is not None]
    summary = {
        "status": status, "message": message, "step": step, "steps": cfg.steps,
        "n_params": model.n_params(), "tokens_seen": step * tokens_per_step,
        "loss_first": run_losses[0] if run_losses else first_loss,
        "loss_last": run_losses[-1] if run_losses else last_loss,
        "loss_last_mean10": float(np.mean(run_losses[-10:])) if run_losses else None,
        "val_loss": val_losses[-1] if val_losses else last_val,
        "val_ppl": math.exp(val_losses[-1]) if val_losses else None,
        "wall_s_this_session": round(elapsed, 2), "train_s_this_session": round(train_time, 2),
        "tokens_per_s_this_session": round(len(losses) * tokens_per_step / train_time, 1) if train_time else None,
        "sample": final_sample,
    }
    if summary["sample"] is None and samples_path.exists():
        chunks = samples_path.read_text(encoding="utf-8").split("--- step ")
        summary["sample"] = chunks[-1].split("\n", 1)[-1].strip() if len(chunks) > 1 else None
    if not dp_rank:
        _write_json_atomic(run_dir / "summary.json", summary)
    if status != "diverged":
        lf, ll = summary["loss_first"], summary["loss_last_mean10"]
        say(f"summary: {status} at step {step}/{cfg.steps}"
            + (f"; train loss {lf:.3f} -> {ll:.3f} (mean of last 10)" if lf is not None else "; no step taken")
            + (f"; val loss {summary['val_loss']:.3f} (ppl {summary['val_ppl']:.1f})"
               if summary["val_loss"] is not None and summary["val_ppl"] is not None else "")
            + f"; {elapsed:.0f}s, {summary['tokens_per_s_this_session'] or 0:,.0f} tok/s; run dir {run_dir}")
        if final_sample:
            say(f"final sample: {final_sample!r}")
    if dp is not None and not group_existed:
        # leave the group together: a rank whose process exits while gloo's group is still
        # alive (and a peer still talking) can abort in the C++ teardown
        from .distributed import barrier, destroy  # noqa: PLC0415

        barrier()
        destroy()
    return TrainResult(run_dir=run_dir, step=step, status=status, model=model, optimizer=opt,
                       tokenizer=tok, summary=summary, losses=losses)
