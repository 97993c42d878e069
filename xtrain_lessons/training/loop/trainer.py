"""The Trainer: one run as named steps — setup, resume or start — with the step (loop/step.py) and the
logging point (loop/report.py) beside them (phase T06).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import numpy as np

from xtrain_lessons.model.qwen3 import Config, Model
from xtrain_lessons.parallel import collectives
from xtrain_lessons.parallel.ddp import DDP, setup_from_env
from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.allocator import keep_freed_memory
from xtrain_lessons.runtime.device import array_module, get_device
from xtrain_lessons.training.checkpoint import (
    CheckpointCorruptError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    inside,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    previous_intact,
    read_state,
    set_pointer,
    step_dir_name,
)
from xtrain_lessons.training.config import RESUME_FIXED_FIELDS, ConfigError, TrainConfig, model_config
from xtrain_lessons.training.data import TokenDataset, default_corpus_path, prepare
from xtrain_lessons.training.loop.report import ReportSteps
from xtrain_lessons.training.loop.step import TrainSteps
from xtrain_lessons.training.metrics import truncate_after
from xtrain_lessons.training.optim import AdamW
from xtrain_lessons.training.optim.grad_scaler import GradScaler
from xtrain_lessons.training.rundir import RunDir, config_hash, new_run_id
from xtrain_lessons.training.tokenizer import save_tokenizer, tokenizer_hash
from xtrain_lessons.training.tokenizer.bpe_hf import load_tokenizer_impl, train_tokenizer_impl

__all__ = ["Trainer", "make_optimizer", "run_identity"]


def run_identity(conf: dict | None) -> str:
    """The run id of a resumed run's config.json, or a new one."""
    return (conf or {}).get("run_id") or new_run_id()


def make_optimizer(params, cfg: TrainConfig):
    """AdamW for the run, over flat buffers (one kernel call per step on either device: T07b). Its
    state_dict is the same on both devices, so checkpoints move between them."""
    return AdamW(params, lr=cfg.max_lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps, weight_decay=cfg.weight_decay)


class Trainer(TrainSteps, ReportSteps):
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
        self.scaler = None  # T12b: fp16 loss scaling, dynamic unless a fixed --loss-scale is given
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
