"""`train()`: one run (or its continuation) from a config, around the Trainer's named steps (phase T06).

    result = train(TrainConfig(preset="test", steps=50, data="my.txt", out="runs/demo"))
    result = train(resume="runs/demo", overrides={"steps": 80})     # continue the same run

What surrounds the steps: the run directory's lock (one writer), the threads, a GPU allocation
that fails anywhere (one line saying what to try), and Ctrl-C / SIGTERM deferred to the next
step boundary (a checkpoint, then a clean return).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from pathlib import Path

from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.device import is_out_of_memory
from xtrain_lessons.training.config import RESUME_FIXED_FIELDS, ConfigError, TrainConfig
from xtrain_lessons.training.loop.report import TrainResult
from xtrain_lessons.training.loop.trainer import Trainer
from xtrain_lessons.training.rundir import RunDir, RunLock, default_run_dir

__all__ = ["train", "resolve_config", "OutOfDeviceMemory"]


class OutOfDeviceMemory(RuntimeError):
    """The GPU ran out of memory: the message names what did not fit and what to try."""


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
