"""The run directory: the one owner of its layout, its config.json, and loading or saving a run.

`xtrain train` writes it; `xtrain sample`, `xtrain export`, `--resume` and the notebooks read
it through `load_run` and `RunDir`::

    runs/<name>/config.json        {"train": TrainConfig, "model": Config, "tokenizer_hash", ...}
                tokenizer.json     the tokenizer (trained on --data unless one is given)
                data/              the prepared token streams (train/val)
                checkpoints/       step_XXXXXXXX/ + latest
                metrics.jsonl      one JSON object per step
                samples.txt        periodic samples
                loss.png           the loss curves
                summary.json       the final numbers
                .lock              the pid of the process writing the run (one writer at a time)

A run has an identity: a run id (config.json "run_id") and a config hash (the model config and
the fields that define the model and data); every checkpoint records both, and resume refuses
a checkpoint from another run.

    from xtrain_lessons.training.rundir import load_run
    model, tok, ckpt = load_run("runs/demo")       # ckpt: a checkpoint.Checkpoint (.path, .step)
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from xtrain_lessons.model.qwen3 import Config, Model
from xtrain_lessons.training.checkpoint import (
    Checkpoint,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointNotFoundError,
    load_checkpoint,
    previous_intact,
    read_state,
    resolve_checkpoint,
    save_checkpoint,
)
from xtrain_lessons.training.config import check_fields
from xtrain_lessons.training.tokenizer import atomic_write_bytes, load_tokenizer, tokenizer_hash

__all__ = ["RunDir", "RunDirError", "RunLock", "LoadedRun", "load_run", "save_run", "default_run_dir",
           "write_json_atomic", "new_run_id", "config_hash"]


class RunDirError(CheckpointError):
    """A run directory is missing something it needs, or holds something unreadable."""


def write_json_atomic(path: Path, obj) -> None:
    """`obj` as indented JSON, so that a reader sees the old file or the new one."""
    atomic_write_bytes(Path(path), (json.dumps(obj, indent=2) + "\n").encode("utf-8"))


def default_run_dir() -> Path:
    return Path("runs") / time.strftime("%Y%m%d-%H%M%S")


def new_run_id() -> str:
    return uuid.uuid4().hex[:16]


# model-config fields that change how, not what, is computed (checkpoint.EXECUTION_ONLY_FIELDS)
_EXECUTION_ONLY = ("recompute", "attention")


def config_hash(train: dict, model: dict, fixed_fields) -> str:
    """SHA-256 of what defines the run's model and data: the model config (without the
    execution-only switches) and the train fields in `fixed_fields`."""
    ident = {"model": {k: v for k, v in model.items() if k not in _EXECUTION_ONLY},
             "train": {k: train.get(k) for k in sorted(fixed_fields) if k != "model"}}
    return hashlib.sha256(json.dumps(ident, sort_keys=True).encode("utf-8")).hexdigest()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


class RunLock:
    """`<run>/.lock` holding the writer's pid: a second writer gets a RunDirError naming it.
    A lock whose process is gone (a kill -9) is stale and taken over."""

    def __init__(self, run_dir: str | os.PathLike):
        self.path = Path(run_dir) / ".lock"
        self.held = False

    def acquire(self) -> "RunLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = f"{os.getpid()} {socket.gethostname()}\n"
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                if not self._stale():
                    continue
                self.path.unlink(missing_ok=True)
                continue
            with os.fdopen(fd, "w") as f:
                f.write(me)
            self.held = True
            return self
        raise RunDirError(self._busy_message())

    def _holder(self) -> tuple[int | None, str]:
        try:
            pid, _, host = self.path.read_text(encoding="utf-8").strip().partition(" ")
            return int(pid), host
        except (OSError, ValueError):
            return None, ""

    def _stale(self) -> bool:
        pid, host = self._holder()
        if pid is None:  # being written right now, or garbage: garbage only if old
            try:
                return time.time() - self.path.stat().st_mtime > 10
            except FileNotFoundError:
                return False
        return host == socket.gethostname() and not _pid_alive(pid)

    def _busy_message(self) -> str:
        pid, host = self._holder()
        who = f"process {pid}" + (f" on {host}" if host and host != socket.gethostname() else "")
        return (f"{self.path.parent} is in use by {who} ({self.path}): wait for it to finish or stop "
                f"it; if that process is gone, delete {self.path}")

    def release(self) -> None:
        if self.held:
            pid, _ = self._holder()
            if pid == os.getpid():
                self.path.unlink(missing_ok=True)
            self.held = False

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()
        return False


@dataclass(frozen=True)
class RunDir:
    """The paths of one run directory, and its config.json."""

    path: Path

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))

    config = property(lambda self: self.path / "config.json")
    tokenizer = property(lambda self: self.path / "tokenizer.json")
    data = property(lambda self: self.path / "data")
    checkpoints = property(lambda self: self.path / "checkpoints")
    metrics = property(lambda self: self.path / "metrics.jsonl")
    samples = property(lambda self: self.path / "samples.txt")
    loss_plot = property(lambda self: self.path / "loss.png")
    summary = property(lambda self: self.path / "summary.json")

    def exists(self) -> bool:
        return self.config.is_file()

    def has_checkpoints(self) -> bool:
        return (self.checkpoints / "latest").exists()

    def read_config(self) -> dict:
        """config.json as a dict; RunDirError naming the file when it is missing or invalid."""
        if not self.config.is_file():
            raise RunDirError(f"{self.path} is not a run directory (no config.json)")
        try:
            conf = json.loads(self.config.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise RunDirError(f"{self.config} is not valid JSON ({e})") from e
        if not isinstance(conf, dict):
            raise RunDirError(f"{self.config} does not hold a JSON object")
        return conf

    def write_config(self, conf: dict) -> None:
        write_json_atomic(self.config, conf)

    def write_summary(self, summary: dict) -> None:
        write_json_atomic(self.summary, summary)


class LoadedRun(NamedTuple):
    model: Any
    tokenizer: Any
    checkpoint: Checkpoint


def _model_config_of(ckpt: Path, run: Path) -> dict:
    """The model config a checkpoint records, else the one in its run's config.json."""
    cfg = read_state(ckpt).get("model_config")
    for d in (ckpt.parent.parent, run):
        if cfg is None and RunDir(d).exists():
            cfg = RunDir(d).read_config().get("model")
    if cfg is None:
        raise RunDirError(f"{ckpt / 'state.json'} records no model_config (nor does the run's "
                          f"config.json): cannot rebuild the model")
    return cfg


def _tokenizer_path(ckpt: Path, run: Path) -> Path:
    for d in (ckpt, ckpt.parent, ckpt.parent.parent, run, run / "data"):
        if (d / "tokenizer.json").is_file():
            return d / "tokenizer.json"
    raise RunDirError(f"no tokenizer.json found in {ckpt}, {ckpt.parent} or {ckpt.parent.parent}")


def load_run(path: str | os.PathLike) -> LoadedRun:
    """(model, tokenizer, checkpoint) of a run directory's latest checkpoint.

    `path`: a run directory, a checkpoints root or one step directory. The model config comes
    from the checkpoint (else the run's config.json); the tokenizer.json is looked for from the
    step directory up to the run directory and must be the one the checkpoint was trained with.
    """
    run = Path(path)
    if (run / "model.safetensors").is_file() and not (run / "state.json").is_file():
        raise RunDirError(f"{run} looks like a Hugging Face model folder, not a run directory: "
                          f"import it first with `xtrain import-hf {run} --out RUN_DIR`")
    ckpt = resolve_checkpoint(run)
    try:
        mc = _model_config_of(ckpt, run)
        check_fields(Config, mc, "model config")
        model = Model(Config.from_dict(mc), seed=0)
    except (TypeError, ValueError, AttributeError) as e:
        raise RunDirError(f"the model config of {ckpt} is invalid ({e})") from None
    try:
        tok = load_tokenizer(_tokenizer_path(ckpt, run))
    except ValueError as e:
        raise RunDirError(str(e)) from e
    try:
        loaded = load_checkpoint(ckpt, model, expected_tokenizer_hash=tokenizer_hash(tok))
    except (CheckpointCorruptError, CheckpointNotFoundError) as e:
        prev = previous_intact(ckpt.parent, ckpt)
        if prev is None:
            raise
        raise type(e)(f"{e}. The previous intact checkpoint is {prev}: give that path instead") from None
    return LoadedRun(model, tok, loaded)


def save_run(model, tokenizer, run_dir, step: int = 0, source: str | None = None) -> Path:
    """Write a run directory that `load_run`, `xtrain export` and `xtrain sample` read:
    `<run>/checkpoints/step_<step>/` (model only), `<run>/tokenizer.json` and
    `<run>/config.json` ({"model": ..., "tokenizer_hash": ...}, as `xtrain train` writes it).
    Returns the checkpoint directory."""
    run = RunDir(run_dir)
    if run.checkpoints.exists():
        raise RunDirError(f"{run.path} already holds checkpoints: choose a new run directory")
    run.path.mkdir(parents=True, exist_ok=True)
    th = tokenizer_hash(tokenizer)
    atomic_write_bytes(run.tokenizer, tokenizer.to_str(pretty=True).encode("utf-8"))
    run.write_config({"model": model.config.to_dict(), "tokenizer_hash": th,
                      "n_params": model.n_params(), "imported_from": source})
    return save_checkpoint(run.checkpoints, step, model, tokenizer_hash=th,
                           extra={"imported_from": source})
