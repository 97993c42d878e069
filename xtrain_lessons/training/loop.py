"""The training loop: data -> model -> loss -> backward -> clip -> AdamW, with everything around it.

    from xtrain_lessons.training.config import TrainConfig
    from xtrain_lessons.training.loop import train
    result = train(TrainConfig(preset="test", steps=50, data="my.txt", out="runs/demo"))
    result = train(resume="runs/demo", overrides={"steps": 80})     # continue the same run

One step (``step`` counts the optimizer steps already taken, from 0):

    lr   = lr_at(step + 1, max_lr, min_lr, warmup, steps) # warmup, then cosine to min_lr at the end
    x, y = train_data.get_batch(batch_size, seq_len, rng) # random windows, y = x shifted by 1
    loss = model.loss(x, y); loss.backward()
    norm = clip_grad_norm(params, grad_clip)              # global L2 norm, before clipping
    optimizer.step(lr)

With ``dtype="fp16"`` (T12) the loss is multiplied by the GradScaler's scale before backward,
and ``scaler.unscale_`` (once per optimizer step, all ranks agreeing) divides the gradients
before clipping; a step with an inf/NaN gradient is skipped and the scale halved
(``scaler.update``); ``metrics.jsonl`` gets ``loss_scale`` and ``skipped_steps``. Every record
has ``tokens_per_s`` (all ranks) and ``tokens_per_s_per_rank``.

A run is a short sequence of named steps, the methods of `Trainer`: ``setup`` (process group,
tokenizer, data, model, optimizer), ``resume`` or ``start``, then per step ``train_step``
and, at a logging point, ``log`` (with ``evaluate``, ``sample``, ``checkpoint`` when due),
and ``finish`` (last checkpoint, plot, summary).

Around it: a tqdm bar (loss, lr, tokens/s); every ``eval_every`` steps the validation loss
and perplexity on ``eval_batches`` fixed batches; every ``sample_every`` steps a sample
decoded to text; every ``checkpoint_every`` steps a checkpoint; ``metrics.jsonl`` (one JSON
object per step); ``loss.png``; at the end a summary (``summary.json``). The run directory's
layout is `rundir.RunDir`'s.

The default run (``xtrain train`` with no arguments): the "tiny" preset (2.6M parameters at
the 2048-token vocabulary), 500 steps of 16 × 128 tokens (about 2 passes over the shipped
corpus), AdamW lr 3e-3 → 3e-4 after 30 warmup steps, on every core. The command line gives
this default schedule a time limit (``DEFAULT_RUN_TIME_LIMIT``, 540 s) that stops it early,
with a checkpoint, on a slower or busier machine, so the 10-minute budget holds either way.

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
Ctrl-C aborts at once); SIGTERM (a scheduler, `docker stop`, the launcher) does the same.

A loss spike (``spike_factor`` times the lowest training loss so far) stops the run like a
NaN. Each checkpoint records its loss; ``checkpoints/best`` names the one with the lowest
(validation loss where one was computed at that step, else training loss), which pruning
keeps, and on a divergence ``latest`` is pointed at it, so what a resume continues is from
before the divergence. A run directory has one writer (``rundir.RunLock``); checkpoints record
the run id and config hash, and resume refuses those of another run. A corrupt latest
checkpoint names the previous intact one, which ``from_checkpoint`` resumes.
"""

from __future__ import annotations

import contextlib
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
from tqdm import tqdm

from xtrain_lessons.model.qwen3 import Config, Model
from xtrain_lessons.parallel import collectives
from xtrain_lessons.parallel.ddp import (
    DDP,
    accumulate_gradients,
    agree_max,
    average_scalar,
    micro_batches,
    setup_from_env,
)
from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.allocator import keep_freed_memory
from xtrain_lessons.runtime.device import array_module, default_log_every, get_device, is_out_of_memory
from xtrain_lessons.training.bpe_hf import load_tokenizer_impl, train_tokenizer_impl
from xtrain_lessons.training.checkpoint import (
    CheckpointCorruptError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointWriteError,
    inside,
    is_disk_full,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    previous_intact,
    read_state,
    save_checkpoint,
    set_pointer,
    step_dir_name,
)
from xtrain_lessons.training.config import RESUME_FIXED_FIELDS, ConfigError, TrainConfig, model_config
from xtrain_lessons.training.data import TokenDataset, default_corpus_path, prepare
from xtrain_lessons.training.deferred import PendingSteps, TrainingDiverged
from xtrain_lessons.training.metrics import last_sample, plot_metrics, read_metrics, truncate_after
from xtrain_lessons.training.optim import AdamW
from xtrain_lessons.training.optim.grad_scaler import GradScaler
from xtrain_lessons.training.optim.schedule import lr_at
from xtrain_lessons.training.rundir import RunDir, RunLock, config_hash, default_run_dir, new_run_id
from xtrain_lessons.training.tokenizer import save_tokenizer, tokenizer_hash
from xtrain_lessons.training.validation import evaluate, sample_text

__all__ = ["TrainResult", "train", "TrainingDiverged", "OutOfDeviceMemory", "make_optimizer", "Trainer"]


class OutOfDeviceMemory(RuntimeError):
    """The GPU ran out of memory: the message names what did not fit and what to try."""


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


def train(cfg: TrainConfig | None = None, *, resume: str | os.PathLike | None = None,
          overrides: dict | None = None, stop_at: int | None = None, progress: bool | None = None,
          log=None, from_checkpoint: str | None = None) -> TrainResult:
    """Run (or continue) a training run. Returns a :class:`TrainResult`.

    ``resume``: a run directory; its ``config.json`` is the config, ``overrides`` change
    fields of it (e.g. ``{"steps": 2000}`` to extend). ``stop_at``: stop after that many
    steps (with a checkpoint) without changing the schedule, which still spans ``steps``.
    ``log``: a function taking a line of text (default: print above the progress bar).
    ``from_checkpoint``: with ``resume``, the step directory (``step_00000400``) to continue
    from instead of ``latest`` (e.g. the previous intact one when ``latest`` is corrupt).
    """
    t_start = time.perf_counter()
    if stop_at is not None and (isinstance(stop_at, bool) or not isinstance(stop_at, int) or stop_at <= 0):
        raise ConfigError(f"--stop-at must be a positive number of steps, got {stop_at!r}")
    if from_checkpoint is not None and resume is None:
        raise ConfigError("--from-checkpoint needs --resume RUN_DIR")
    cfg, conf = resolve_config(cfg, resume, overrides)
    run = Trainer(cfg, conf, progress=sys.stderr.isatty() if progress is None else progress,
                  log=log, t_start=t_start)
    # one writer per run directory (rank 0 writes for a whole `xtrain launch` group)
    lock = RunLock(cfg.out) if os.environ.get("RANK", "0") == "0" else None
    with lock or _nothing(), opset.threads_set(cfg.threads or _cores_per_process()), \
            _out_of_memory_explained(run):
        run.setup()
        run.resume(from_checkpoint) if conf is not None else run.start()
        # Ctrl-C / SIGTERM deferred through the last checkpoint too: under `xtrain launch` a
        # rank told to stop by its peer may get its own signal only while it saves
        with _SigintDefer() as sigint:
            run.loop(cfg.steps if stop_at is None else min(cfg.steps, stop_at), sigint)
            return run.finish()


@contextlib.contextmanager
def _out_of_memory_explained(run: "Trainer"):
    """A GPU allocation that fails anywhere in the run becomes OutOfDeviceMemory: one line naming
    the model, the batch, the dtype and what to try. Nothing is written on the way out, so the
    last checkpoint stays the last good one."""
    try:
        yield
    except Exception as e:
        if not is_out_of_memory(e):
            raise
        cfg = run.cfg
        model = getattr(run, "model", None)
        size = f"{model.n_params() / 1e6:.2f}M-parameter " if model is not None else ""
        where = f"at step {run.step + 1}" if getattr(run, "looping", False) else "while setting up"
        resume = (f"; the last checkpoint is intact: continue with --resume {run.dir.path}"
                  if run.dir.has_checkpoints() else "")
        raise OutOfDeviceMemory(
            f"out of GPU memory {where}: the {size}{cfg.preset} model with a batch of {cfg.batch_size} x "
            f"{cfg.seq_len} tokens in {cfg.dtype} does not fit ({e}). Try a smaller --batch-size (with "
            f"--accum-steps to keep the batch), --recompute, --dtype bf16, or a shorter --seq-len{resume}") from None


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def resolve_config(cfg: TrainConfig | None, resume, overrides: dict | None):
    """(the run's TrainConfig with `out` set, the resumed run's config.json or None)."""
    overrides = dict(overrides or {})
    if resume is None:
        cfg = (cfg or TrainConfig()).replace(**overrides)
        return cfg.replace(out=str(Path(cfg.out) if cfg.out else default_run_dir())), None
    run = RunDir(resume)
    conf = run.read_config()
    try:
        base = TrainConfig.from_dict(conf.get("train"))
    except (ConfigError, TypeError) as e:
        raise ConfigError(f"{run.config}: {e}") from None
    changed = sorted(k for k in overrides if k in RESUME_FIXED_FIELDS and overrides[k] != getattr(base, k))
    if changed:
        raise ValueError(f"cannot change {changed} when resuming (they define the model/data)")
    known = set(base.to_dict())
    return base.replace(**{k: v for k, v in overrides.items() if k in known}, out=str(resume)), conf


def run_identity(conf: dict | None) -> str:
    """The run id of a resumed run's config.json, or a new one."""
    return (conf or {}).get("run_id") or new_run_id()


def make_optimizer(params, cfg: TrainConfig):
    """AdamW for the run, over flat buffers (one kernel call per step on either device: T07). Its
    state_dict is the same on both devices, so checkpoints move between them."""
    return AdamW(params, lr=cfg.max_lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)


def _cores_per_process() -> int:
    """Under `xtrain launch` / torchrun (LOCAL_WORLD_SIZE > 1): this process's share of the
    cores, so that the processes do not fight over them. Otherwise 0 (threads as they are)."""
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
    return max(1, (os.cpu_count() or 1) // local) if local > 1 else 0


class _SigintDefer:
    """While active, the first Ctrl-C or SIGTERM only sets a flag (the loop stops at the next
    step boundary, with a checkpoint); a second one raises KeyboardInterrupt at once.

    The flag is only ever set here: the loop reads it, never writes it. (It used to write back
    what the ranks agreed, and a signal whose handler ran just after that all-reduce and
    before the assignment was lost; or a rank told to stop by its peer took its own signal,
    arriving a moment later, for the second one.)"""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.requested = False
        self.signum = None
        self._old = {}

    def __enter__(self):
        for sig in self.SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread: leave the signals alone
                pass
        return self

    def _handler(self, signum, frame):
        if self.requested:
            raise KeyboardInterrupt
        self.requested, self.signum = True, signum

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


class Trainer:
    """One run, in named steps: setup, resume/start, loop (train_step, log), finish."""

    def __init__(self, cfg: TrainConfig, conf: dict | None, progress: bool, log, t_start: float):
        self.cfg, self.conf, self.progress, self._log, self.t_start = cfg, conf, progress, log, t_start
        self.dir = RunDir(cfg.out)
        self.bar = None
        self.rank = 0
        self.step = 0
        self.status, self.message = "done", ""
        self.last_val = None
        self.last_ckpt = None
        self.train_time = 0.0
        self.run_id = run_identity(conf)
        self.best = None  # (score, checkpoint name) of the best checkpoint
        self.min_loss = math.inf  # the spike guard's reference
        self.signum = None

    def say(self, msg: str) -> None:
        if self.rank:  # only rank 0 talks
            return
        if self._log is not None:
            self._log(msg)
        elif self.bar is not None:
            self.bar.write(msg)
        else:
            print(msg, flush=True)

    # ----- setup -------------------------------------------------------------------------
    def setup(self) -> None:
        """Process group, tokenizer, data, model and optimizer."""
        keep_freed_memory()  # the same buffers every step: no page faults for them (runtime/allocator)
        self.dir.path.mkdir(parents=True, exist_ok=True)
        self.group_existed = collectives.is_initialized()
        self.dp = setup_from_env()  # T17: (rank, world size) under `xtrain launch` / torchrun
        self.rank, self.world = self.dp if self.dp else (0, 1)
        if self.rank:
            self.progress = False
            collectives.barrier()  # rank 0 writes the tokenizer and the data first (its barrier is below)
        self.tok = self._setup_tokenizer()
        self.tok_hash = tokenizer_hash(self.tok)
        self.train_ds, self.val_ds = self._setup_data()
        if self.dp and not self.rank:
            collectives.barrier()  # the tokenizer and the data are ready for the other ranks
        self._setup_model()

    def _setup_tokenizer(self):
        cfg, fresh = self.cfg, self.conf is None and not self.rank
        if fresh:
            if self.dir.has_checkpoints():
                raise ValueError(f"{self.dir.path} already holds a run with checkpoints: continue it "
                                 f"with --resume {self.dir.path}, or choose another --out")
            if cfg.data is None:
                self.cfg = cfg = cfg.replace(data=str(default_corpus_path()))
            if Path(cfg.data).is_dir():
                raise ConfigError(f"--data {cfg.data} is a directory: give a UTF-8 text file")
            if not Path(cfg.data).exists():
                raise FileNotFoundError(f"training text not found: {cfg.data}")
        if not fresh:
            return load_tokenizer_impl(cfg.tokenizer_impl, self.dir.tokenizer)
        if cfg.tokenizer:
            tok = load_tokenizer_impl(cfg.tokenizer_impl, cfg.tokenizer)
        else:
            t0 = time.perf_counter()
            tok = train_tokenizer_impl(cfg.tokenizer_impl, [str(cfg.data)], cfg.vocab_size)
            self.say(f"tokenizer: trained a {tok.get_vocab_size()}-token BPE on {cfg.data} "
                     f"in {time.perf_counter() - t0:.1f}s")
        save_tokenizer(tok, self.dir.tokenizer)
        return tok

    def _setup_data(self):
        """Tokenize the corpus into <run>/data (a resumed run and the other ranks reuse it)."""
        cfg, data_dir, tok = self.cfg, self.dir.data, self.tok
        if self.conf is not None or self.rank:
            try:
                return TokenDataset(data_dir, "train", tokenizer=tok), TokenDataset(data_dir, "val", tokenizer=tok)
            except FileNotFoundError:  # not there (deleted?): prepare it
                pass
            except ValueError as e:  # stale or damaged: prepare again
                self.say(f"data: {e}; preparing again")
            if cfg.data is None or not Path(cfg.data).exists():
                raise FileNotFoundError(f"{data_dir} is missing or damaged and the source text {cfg.data} "
                                        f"is not there to prepare it again")
        t0 = time.perf_counter()
        prepare(cfg.data, data_dir, tok, val_fraction=cfg.val_fraction, seed=cfg.seed)
        self.say(f"data: tokenized {cfg.data} into {data_dir} in {time.perf_counter() - t0:.1f}s")
        return TokenDataset(data_dir, "train", tokenizer=tok), TokenDataset(data_dir, "val", tokenizer=tok)

    def _setup_model(self) -> None:
        cfg = self.cfg
        self.mcfg = (Config.from_dict(self.conf["model"]) if self.conf is not None
                     else model_config(cfg, self.tok.get_vocab_size()))
        self.model = Model(self.mcfg, seed=cfg.seed)
        self.cfg_hash = config_hash(cfg.to_dict(), self.mcfg.to_dict(), RESUME_FIXED_FIELDS)
        self.model.compute_dtype = cfg.dtype  # T12: bf16 compute copies of the float32 masters
        self.device = get_device()  # $XTRAIN_DEVICE / --device; "auto" is the CPU without a GPU
        self.model.to(self.device)  # parameters move once (if at all); batches are moved by the model itself
        self.params = self.model.named_parameters()
        self.opt = make_optimizer(self.params, cfg)
        self.ddp = DDP(self.model) if self.dp else None  # T08: rank 0's weights, averaged gradients
        self.scaler = None  # T12: fp16 loss scaling, dynamic unless a fixed --loss-scale is given
        if cfg.dtype == "fp16":
            self.scaler = GradScaler(cfg.loss_scale, dynamic=False) if cfg.loss_scale else GradScaler()
            self.scaler.to_device(array_module(self.opt.flat_param))  # its state beside the gradients: no sync
        self.rng = np.random.default_rng([cfg.seed, 1])  # the data stream
        self.metrics_path, self.samples_path = self.dir.metrics, self.dir.samples
        if self.rank:  # T17: the other ranks keep their metrics aside
            aside = self.dir.path / f".rank{self.rank}"
            aside.mkdir(exist_ok=True)
            self.metrics_path, self.samples_path = aside / "metrics.jsonl", aside / "samples.txt"
        self.tokens_per_step = cfg.batch_size * cfg.accum_steps * self.world * cfg.seq_len

    # ----- resume or start -----------------------------------------------------------------
    def resume(self, from_checkpoint: str | None = None) -> None:
        """Weights, optimizer state, step and data stream of the run's latest checkpoint (or of
        `from_checkpoint`); checkpoints newer than it are set aside (renamed .abandoned-*)."""
        ckpt = self._resume_point(from_checkpoint)
        try:
            ck = load_checkpoint(ckpt, self.model, self.opt, expected_model_config=self.mcfg.to_dict(),
                                 expected_tokenizer_hash=self.tok_hash, expected_run_id=self.run_id,
                                 expected_config_hash=self.cfg_hash)
        except (CheckpointCorruptError, CheckpointNotFoundError, CheckpointMismatchError) as e:
            raise type(e)(self._with_previous(str(e), ckpt)) from None
        if not self.rank:
            self._set_aside_newer(ck.path)
            self._restore_best(ck.step)
        self.step, self.rng = ck.step, ck.rng()
        if self.scaler is not None and "grad_scaler" in ck.extra:
            self.scaler.load_state_dict(ck.extra["grad_scaler"])
        truncate_after(self.step, self.metrics_path, self.samples_path)  # those steps are redone
        self.say(f"resumed {self.dir.path} at step {self.step} (from {ck.path.name})")
        self._announce()

    def _resume_point(self, from_checkpoint: str | None):
        root = self.dir.checkpoints
        if from_checkpoint is not None:
            ckpt = inside(root, Path(from_checkpoint).name, "--from-checkpoint")
            if not ckpt.is_dir():
                have = ", ".join(p.name for p in list_checkpoints(root)) or "none"
                raise CheckpointNotFoundError(f"--from-checkpoint: {ckpt} does not exist (checkpoints: {have})")
            return ckpt
        ptr = root / "latest"
        if not ptr.is_file():
            raise CheckpointNotFoundError(self._with_previous(
                f"{self.dir.path} has no checkpoint to resume ({ptr} is missing)", root / "step_99999999"))
        return inside(root, ptr.read_text(encoding="utf-8", errors="replace").strip(), ptr)

    def _with_previous(self, msg: str, bad) -> str:
        """`msg`, plus the previous intact checkpoint and how to resume from it."""
        prev = previous_intact(self.dir.checkpoints, Path(bad))
        if prev is None:
            return msg + "; no intact checkpoint is left before it"
        return (f"{msg}. The previous intact checkpoint is {prev.name}: continue from it with "
                f"`xtrain train --resume {self.dir.path} --from-checkpoint {prev.name}`")

    def _set_aside_newer(self, ckpt: Path) -> None:
        for newer in list_checkpoints(ckpt.parent):
            if newer.name > ckpt.name:
                os.rename(newer, newer.parent / f".abandoned-{newer.name}-{os.getpid()}")
                self.say(f"set aside {newer.name} (newer than {ckpt.name}) as .abandoned-{newer.name}-{os.getpid()}")
        if latest_checkpoint(ckpt.parent) != ckpt:
            set_pointer(ckpt.parent, "latest", ckpt.name)

    def _restore_best(self, step: int) -> None:
        ptr = self.dir.checkpoints / "best"
        try:
            best = inside(self.dir.checkpoints, ptr.read_text(encoding="utf-8").strip(), ptr)
            score = read_state(best)["extra"].get("score")
        except (OSError, ValueError, KeyError, AttributeError):
            return
        if score is not None and best.name <= step_dir_name(step):
            self.best = (score, best.name)

    def start(self) -> None:
        for path in (self.metrics_path, self.samples_path):
            path.unlink(missing_ok=True)
        self._announce()

    def _announce(self) -> None:
        """Write config.json, check the splits, and print the run's header line."""
        cfg, model = self.cfg, self.model
        if not self.rank:
            self.dir.write_config({"run_id": self.run_id, "train": cfg.to_dict(), "model": self.mcfg.to_dict(),
                                   "tokenizer_hash": self.tok_hash, "n_params": model.n_params(),
                                   "data": {"dir": "data", "source": cfg.data}})
        n_train = len(self.train_ds)
        if n_train < cfg.seq_len + 1:
            raise ValueError(f"the training split has {n_train} tokens, fewer than one window of "
                             f"seq_len + 1 = {cfg.seq_len + 1}: use more text or a shorter --seq-len")
        self.eval_every = cfg.eval_every
        if self.eval_every and len(self.val_ds) < cfg.seq_len + 1:
            self.say(f"warning: the validation split has only {len(self.val_ds)} tokens "
                     f"(< seq_len + 1); validation is skipped in this run")
            self.eval_every = 0
        self.say(f"run {self.dir.path} on {opset.placement(self.device)}: {cfg.preset} model, {model.n_params() / 1e6:.2f}M "
                 f"parameters, vocab {self.mcfg.vocab_size}; {cfg.steps} steps x {cfg.batch_size} x "
                 f"{cfg.seq_len} tokens; {n_train:,} training tokens"
                 + (f"; time limit {cfg.time_limit:.0f}s" if cfg.time_limit else ""))

    # ----- the loop ------------------------------------------------------------------------
    def loop(self, end: int, sigint: "_SigintDefer") -> None:
        """Steps until `end`, a stop request (`sigint`), the time limit or a divergence."""
        cfg = self.cfg
        # T07: host synchronisations only at logging points (see TrainConfig.log_every)
        self.log_every = cfg.log_every or default_log_every(self.device)
        self.deferred = self.log_every > 1
        self.healthy = True  # on the device once a deferred step ran: every step so far was finite
        self.pending = PendingSteps(self.tokens_per_step, self.log_every, self.world)  # tokens/s: all ranks
        # without a progress bar (no terminal: a notebook, a CI log) a line every 1/25 of the run
        self.print_every = max(1, cfg.steps // 25)
        self.bar = tqdm(total=cfg.steps, initial=self.step, disable=not self.progress,
                        dynamic_ncols=True, desc="train", unit="step", file=sys.stderr)
        self.mf = open(self.metrics_path, "a", encoding="utf-8")
        self.looping = True
        try:
            while self.step < end:
                if self._should_stop(sigint) or not self._guarded_step():
                    break
                if self._at_logging_point(end):
                    self.log()
            self._write(self._read_pending())  # stopped between logging points
            self.looping = False  # (left True by an exception: the run failed inside the loop)
        except TrainingDiverged as e:
            self.status, self.message = "diverged", str(e)
        finally:
            self.bar.close()
            self.mf.close()
            self.bar = None

    def _should_stop(self, sigint) -> bool:
        over_time = bool(self.cfg.time_limit) and time.perf_counter() - self.t_start > self.cfg.time_limit
        requested, signum = sigint.requested, sigint.signum or 0  # read once: a handler may run any time
        if self.ddp is not None:  # T17: every rank stops at the same step, naming the same signal
            requested, over_time, signum = agree_max([requested, over_time, signum])
        if requested or over_time:
            self.status = "interrupted" if requested else "time_limit"
            self.signum = int(signum) or None
            return True
        return False

    def _guarded_step(self) -> bool:
        """One step; False when Ctrl-C came before its update (the step never happened)."""
        rng_before = self.rng.bit_generator.state
        self.in_update = False
        try:
            self.train_step()
            return True
        except KeyboardInterrupt:
            self.status = "interrupted"
            if self.in_update:
                self.message = ("interrupted in the middle of an optimizer update: the weights "
                                "are inconsistent, so no checkpoint was written")
                raise
            self.rng.bit_generator.state = rng_before
            return False

    def train_step(self) -> None:
        """lr, batch, forward and backward (micro-batches and all-reduce), clip, update."""
        cfg, step = self.cfg, self.step
        t0 = time.perf_counter()
        # update k = step+1 of 1..steps: warmup ends at k = warmup, min_lr at k = steps
        lr = lr_at(step + 1, cfg.max_lr, cfg.min_lr, cfg.warmup, cfg.steps)
        x, y = self.train_ds.get_batch(cfg.batch_size * cfg.accum_steps * self.world, cfg.seq_len, self.rng)
        self.model.dropout_step = step  # T18: masks keyed by step, so resume redraws them
        loss_val = self._forward_backward(x, y, lr)
        extra = {}
        gnorm = self._update(lr, loss_val, extra)
        self._finish_step(t0, lr, loss_val, gnorm, extra)

    def _finish_step(self, t0, lr, loss_val, gnorm, extra) -> None:
        self.model.zero_grad()
        dt = time.perf_counter() - t0
        self.train_time += dt
        self.step += 1
        self.pending.add(self.step, lr, loss_val, gnorm, dt, time.perf_counter() - self.t_start, extra)

    def _update(self, lr, loss_val, extra):
        """The optimizer's part of the step: the global norm, the clip and fp16's unscale folded into
        one factor over the flat gradient buffer, the update (skipped where fp16's gradients
        overflowed), the loss scale's update (T12). Deferred (log_every > 1, T07): nothing is read
        on the host; a non-finite loss or norm skips this update and every later one on the device,
        and is read at the next logging point. Otherwise a non-finite norm stops the run before the
        update. Under DDP the gradients are already averaged: an inf on any rank is an inf on every
        rank, so the ranks skip together. Returns the norm (a device value when deferred)."""
        scaler = self.scaler
        state = scaler.state if scaler is not None else None
        if scaler is not None:
            extra["loss_scale"] = state[0].copy()  # the scale this step used
        gnorm = self.opt.clip_grad_norm(self.cfg.grad_clip, scale_state=state)
        where = None
        if self.deferred:  # T07: checked on the device, read at the logging point
            xp = array_module(gnorm)
            finite = xp.isfinite(loss_val) if scaler is not None else xp.isfinite(loss_val) & xp.isfinite(gnorm)
            self.healthy = where = self.healthy & finite
        elif scaler is None and not math.isfinite(float(gnorm)):
            raise TrainingDiverged(
                f"gradient norm is {float(gnorm)} at step {self.step} (loss {loss_val:.4f}); "
                f"stopping before the update; the last good checkpoint is intact.")
        self.in_update = True
        self.opt.step(lr, where=where)  # also skipped where the fp16 gradients overflowed
        self.in_update = False
        if scaler is not None:
            scaler.update_from(self.opt.last_factors)
            extra["skipped_steps"] = state[2].copy()
            extra["_skipped"] = self.opt.last_factors[2]  # read_steps: a skipped step has no norm
        return gnorm if self.deferred else float(gnorm)

    def _forward_backward(self, x, y, lr: float):
        """The loss of the step (a device value when deferred), gradients in .grad."""
        cfg, model = self.cfg, self.model
        scale = self.scaler.scale if self.scaler is not None else None  # T12 fp16
        if cfg.accum_steps > 1 or self.ddp is not None:  # T16/T08: this rank's micro-batches,
            loss_val = average_scalar(accumulate_gradients(   # one all-reduce at the end
                model, micro_batches(x, y, cfg.accum_steps, self.rank, self.world), self.ddp, scale))
            if not self.deferred:  # the same mean on every rank: they all stop together
                self._check_loss(loss_val, lr)
            return loss_val
        loss = model.loss(x, y)
        loss_val = loss.data if self.deferred else float(loss.item())  # .item(): a sync
        if not self.deferred:
            self._check_loss(loss_val, lr)
        model.zero_grad()
        (scale(loss) if scale is not None else loss).backward()
        return loss_val

    def _check_loss(self, loss_val: float, lr: float) -> None:
        """Stop before the update on a non-finite loss or a spike (spike_factor x the lowest)."""
        spike = self.cfg.spike_factor and loss_val > self.cfg.spike_factor * self.min_loss
        if not math.isfinite(loss_val) or spike:
            what = (f"loss {loss_val:.4g} is over {self.cfg.spike_factor:g} x the lowest so far "
                    f"({self.min_loss:.4g})") if math.isfinite(loss_val) else f"loss is {loss_val}"
            raise TrainingDiverged(
                f"{what} at step {self.step} (lr {lr:.3g}); stopping before the update. "
                f"Lower --max-lr or --grad-clip and resume.")
        self.min_loss = min(self.min_loss, loss_val)

    def _at_logging_point(self, end: int) -> bool:
        cfg, step = self.cfg, self.step
        self.at_eval = bool(self.eval_every) and (step % self.eval_every == 0 or step == cfg.steps)
        self.at_sample = bool(cfg.sample_every) and (step % cfg.sample_every == 0 or step == cfg.steps)
        self.at_ckpt = bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0
        return not (step % self.log_every and step < end) or self.at_eval or self.at_sample or self.at_ckpt

    # ----- logging point: metrics, evaluation, sample, checkpoint ----------------------------
    def log(self) -> None:
        """Read the pending steps (one host synchronisation), evaluate, sample, checkpoint."""
        recs = self._read_pending()
        if self.at_eval:  # recs[-1] is this step's record
            self.evaluate(recs[-1])
        self._write(recs)
        if self.at_sample:
            self.say(f"sample @ {self.step}: {self.sample(self.step)!r}")
        if self.at_ckpt:
            self.checkpoint()

    def _read_pending(self) -> list[dict]:
        """The records of the pending steps, read in one host synchronisation; on a
        divergence the good ones are written and the step set back before it propagates."""
        try:
            recs = self.pending.read()
        except TrainingDiverged as e:
            self.step = e.step
            self._write(e.records)
            raise
        if recs:
            self.bar.update(len(recs))
            self.bar.set_postfix_str(f"loss {self.pending.last_loss:.3f} lr {recs[-1]['lr']:.2e} "
                                     f"{self.pending.ema_tps:,.0f} tok/s")
            if not self.progress and not self.at_eval and any(r["step"] % self.print_every == 0 for r in recs):
                self.say(f"step {self.step:>6}/{self.cfg.steps}: train loss {self.pending.last_loss:.4f}  "
                         f"lr {recs[-1]['lr']:.2e}  {self.pending.ema_tps:,.0f} tok/s")
        return recs

    def _write(self, recs: list[dict]) -> None:
        self.mf.write("".join(json.dumps(r) + "\n" for r in recs))
        self.mf.flush()

    def evaluate(self, rec: dict) -> None:
        cfg = self.cfg
        self.last_val = evaluate(self.model, self.val_ds, cfg.batch_size, cfg.seq_len, cfg.eval_batches,
                                 cfg.seed + 1_000_003)
        self.val_step = self.step
        rec["val_loss"] = round(self.last_val, 6)
        rec["val_ppl"] = round(math.exp(min(self.last_val, 50.0)), 3)
        tps = self.pending.ema_tps
        speed = (f"{tps:,.0f} tok/s" if self.world == 1 else  # T17: as the seed's DDP logs show both
                 f"{tps / self.world:,.0f} tok/s per rank, {tps:,.0f} global")
        self.say(f"step {self.step:>6}: train loss {self.pending.last_loss:.4f}  val loss {self.last_val:.4f}  "
                 f"val ppl {rec['val_ppl']:.2f}  lr {rec['lr']:.2e}  {speed}")

    def sample(self, at_step: int) -> str:
        if self.rank:
            return ""
        cfg = self.cfg
        text = sample_text(self.model, self.tok, cfg.sample_prompt, cfg.sample_tokens, cfg.sample_temperature,
                           cfg.sample_top_k, seed=cfg.seed + at_step)
        with open(self.samples_path, "a", encoding="utf-8") as f:
            f.write(f"--- step {at_step}\n{text}\n")
        return text

    def checkpoint(self) -> None:
        self.last_ckpt = self.step
        if self.rank:
            return
        cfg, root, name = self.cfg, self.dir.checkpoints, step_dir_name(self.step)
        evaluated = getattr(self, "val_step", None) == self.step and self.last_val is not None
        score = self.last_val if evaluated else self.pending.last_loss
        try:
            save_checkpoint(root, self.step, self.model, self.opt, train_config=cfg.to_dict(),
                            rng=self.rng, tokenizer_hash=self.tok_hash, keep_last=cfg.keep_checkpoints or None,
                            data_position=None, run_id=self.run_id, config_hash=self.cfg_hash,
                            keep=(self.best[1],) if self.best else (),
                            extra={"score": score, "score_is": "val_loss" if evaluated else "train_loss",
                                   **({"grad_scaler": self.scaler.state_dict()} if self.scaler is not None else {})})
        except Exception as e:
            if not is_disk_full(e):
                raise
            prev = latest_checkpoint(root)
            raise CheckpointWriteError(
                f"no space left on device writing checkpoint {name} to {root}: nothing of it was kept, "
                f"`latest` still names {prev.name if prev else 'no checkpoint'}; free some space, then "
                f"`xtrain train --resume {self.dir.path}`") from None
        if score is not None and math.isfinite(score) and (self.best is None or score <= self.best[0]):
            self.best = (score, name)
            set_pointer(root, "best", name)

    # ----- finish --------------------------------------------------------------------------
    def finish(self) -> TrainResult:
        """The last checkpoint, the plot, a final sample, summary.json; leave the group."""
        self._final_checkpoint()
        metrics = read_metrics(self.metrics_path)
        final_sample = None
        if self.status != "diverged" and self.step > 0 and not self.rank:
            try:
                plot_metrics(metrics, self.dir.loss_plot, title=f"{self.dir.path.name}: {self.cfg.preset}, "
                             f"{self.model.n_params() / 1e6:.2f}M params")
            except Exception as e:  # noqa: BLE001 - a plot must never lose a run
                self.say(f"(loss plot skipped: {e})")
            if self.cfg.sample_tokens > 0 and not (self.cfg.sample_every and self.step % self.cfg.sample_every == 0):
                final_sample = self.sample(self.step)
        summary = self._summary(metrics, final_sample)
        if not self.rank:
            self.dir.write_summary(summary)
        if self.status != "diverged":
            self._say_summary(summary, final_sample)
        if self.dp is not None and not self.group_existed:
            # leave the group together: a rank whose process exits while gloo's group is still
            # alive (and a peer still talking) can abort in the C++ teardown
            collectives.barrier()
            collectives.destroy()
        return TrainResult(run_dir=self.dir.path, step=self.step, status=self.status, model=self.model,
                           optimizer=self.opt, tokenizer=self.tok, summary=summary,
                           losses=self.pending.losses)

    def _final_checkpoint(self) -> None:
        step = self.step
        if self.status == "diverged":
            self.say(f"TRAINING STOPPED: {self.message}")
            self._latest_to_best()
            return
        if self.last_ckpt != step and step > 0:
            self.checkpoint()
        if self.status == "done" and step < self.cfg.steps:
            self.status = "stopped"
        if self.status == "interrupted":
            by = f" by {signal.Signals(self.signum).name}" if self.signum else ""
            self.say(f"interrupted{by}: checkpoint saved at step {step}; continue with "
                     f"`xtrain train --resume {self.dir.path}`")
        if self.status == "time_limit":
            self.say(f"time limit reached at step {step}; checkpoint saved")

    def _latest_to_best(self) -> None:
        """After a divergence `latest` names the best checkpoint (lowest loss), from before it."""
        root = self.dir.checkpoints
        latest = latest_checkpoint(root) if not self.rank else None
        if latest is None or self.best is None or self.best[1] == latest.name:
            return
        set_pointer(root, "latest", self.best[1])
        self.say(f"latest now names {self.best[1]} (loss {self.best[0]:.4f}), the best checkpoint "
                 f"saved before the divergence; {latest.name} is kept beside it")

    def _summary(self, metrics: list[dict], final_sample) -> dict:
        run_losses = [m["train_loss"] for m in metrics if "train_loss" in m]
        val_losses = [m["val_loss"] for m in metrics if m.get("val_loss") is not None]
        p = self.pending
        return {
            "status": self.status, "message": self.message, "step": self.step, "steps": self.cfg.steps,
            "n_params": self.model.n_params(), "tokens_seen": self.step * self.tokens_per_step,
            "loss_first": run_losses[0] if run_losses else p.first_loss,
            "loss_last": run_losses[-1] if run_losses else p.last_loss,
            "loss_last_mean10": float(np.mean(run_losses[-10:])) if run_losses else None,
            "val_loss": val_losses[-1] if val_losses else self.last_val,
            "val_ppl": math.exp(min(val_losses[-1], 50.0)) if val_losses else None,
            "wall_s_this_session": round(time.perf_counter() - self.t_start, 2),
            "train_s_this_session": round(self.train_time, 2),
            "tokens_per_s_this_session": (round(len(p.losses) * self.tokens_per_step / self.train_time, 1)
                                          if self.train_time else None),
            "sample": final_sample if final_sample is not None else last_sample(self.samples_path),
        }

    def _say_summary(self, summary: dict, final_sample) -> None:
        lf, ll = summary["loss_first"], summary["loss_last_mean10"]
        self.say(f"summary: {self.status} at step {self.step}/{self.cfg.steps}"
                 + (f"; train loss {lf:.3f} -> {ll:.3f} (mean of last 10)" if lf is not None else "; no step taken")
                 + (f"; val loss {summary['val_loss']:.3f} (ppl {summary['val_ppl']:.1f})"
                    if summary["val_loss"] is not None and summary["val_ppl"] is not None else "")
                 + f"; {summary['wall_s_this_session']:.0f}s, "
                 f"{summary['tokens_per_s_this_session'] or 0:,.0f} tok/s; run dir {self.dir.path}")
        if final_sample:
            self.say(f"final sample: {final_sample!r}")
