"""Expected failures as one line, `xtrain CMD: error: MESSAGE`, and the exit status they mean.

Exit 2: a usage error (a bad flag, value, config or path given). Exit 1: a runtime failure
(a corrupt checkpoint, a full disk, a dead peer, a download). Anything else is a bug and
keeps its traceback. `--debug` (or XTRAIN_DEBUG=1) re-raises every error, traceback and all.
"""

from __future__ import annotations

import os
import sys

from safetensors import SafetensorError

from xtrain_lessons.interop.hf import ExportError
from xtrain_lessons.parallel.collectives import DistributedError
from xtrain_lessons.training.checkpoint import CheckpointError, is_disk_full
from xtrain_lessons.training.loop.deferred import TrainingDiverged
from xtrain_lessons.training.data.fetch import FetchError
from xtrain_lessons.training.loop import OutOfDeviceMemory

USAGE, RUNTIME = 2, 1


class UsageError(ValueError):
    """A bad command-line argument (exit 2)."""


def debug_enabled() -> bool:
    return os.environ.get("XTRAIN_DEBUG", "") not in ("", "0")


def exit_code(exc: BaseException) -> int | None:
    """2 or 1 for an expected failure, None for a bug (which keeps its traceback)."""
    if is_disk_full(exc):
        return RUNTIME
    if isinstance(exc, (CheckpointError, ExportError, FetchError, DistributedError, TrainingDiverged,
                        SafetensorError, OutOfDeviceMemory)):
        return RUNTIME
    if isinstance(exc, (ValueError, FileNotFoundError, NotADirectoryError, IsADirectoryError)):
        return USAGE  # ConfigError, UsageError, bad JSON/TOML/UTF-8, a path that is not there
    if isinstance(exc, OSError):
        return RUNTIME  # permissions, I/O
    return None


def message(exc: BaseException) -> str:
    if is_disk_full(exc):
        where = f" writing {exc.filename}" if getattr(exc, "filename", None) else ""
        return (f"no space left on device{where}: free some space and run the command again "
                f"(what was written before is intact; a training run continues with --resume)")
    if isinstance(exc, OSError) and exc.filename and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return str(exc) or type(exc).__name__


def report(command: str, exc: BaseException, code: int | None = None) -> int:
    """Print the one line for `exc` and return its exit status; re-raise under --debug."""
    code = code if code is not None else exit_code(exc)
    if code is None or debug_enabled():
        raise exc
    print(f"xtrain {command}: error: {message(exc)}", file=sys.stderr, flush=True)
    return code
