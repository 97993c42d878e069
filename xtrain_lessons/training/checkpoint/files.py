"""A checkpoint on disk: its directory and files, the pointers to it, and their integrity (phase T06).

    <root>/step_00000500/{model,optimizer}.safetensors, state.json     one checkpoint
    <root>/latest, <root>/best                                       one line each: a step directory's name

Every file is written to a temporary name, fsync'ed and renamed into place; `verify_checkpoint`
checks the sizes and SHA-256 recorded at save time. The errors here say what is wrong and where.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import uuid
from pathlib import Path

import numpy as np
from safetensors import SafetensorError
import safetensors.numpy

__all__ = ["FORMAT_VERSION", "CheckpointError", "CheckpointNotFoundError", "CheckpointCorruptError",
           "CheckpointMismatchError", "CheckpointVersionError", "CheckpointWriteError", "is_disk_full", "step_dir_name",
           "list_checkpoints", "latest_checkpoint", "inside", "resolve_checkpoint", "set_pointer", "read_state",
           "verify_checkpoint", "previous_intact", "check_identity"]


FORMAT_VERSION = 1


MODEL_FILE = "model.safetensors"


OPTIM_FILE = "optimizer.safetensors"


STATE_FILE = "state.json"


LATEST = "latest"


class CheckpointError(Exception):
    """Any problem loading a checkpoint."""


class CheckpointNotFoundError(CheckpointError, FileNotFoundError):
    """No checkpoint at the path, or one of its files is missing."""


class CheckpointCorruptError(CheckpointError):
    """A file is truncated, altered or unreadable."""


class CheckpointMismatchError(CheckpointError):
    """The checkpoint does not belong to this model / tokenizer."""


class CheckpointVersionError(CheckpointError):
    """Written by an incompatible version of the format."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (a full disk); nothing of it was kept."""


def is_disk_full(exc: BaseException) -> bool:
    """An ENOSPC/EDQUOT OSError, or safetensors' wrapping of one ("os error 28")."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(exc, SafetensorError) and ("os error 28" in str(exc) or "No space left" in str(exc))


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _write_json(path: Path, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=False)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())


def _jsonable(obj):
    """Round-trip through JSON now, so an unserialisable value fails at save, not at load."""
    return json.loads(json.dumps(obj))


def step_dir_name(step: int) -> str:
    return f"step_{int(step):08d}"


def list_checkpoints(root: str | os.PathLike) -> list[Path]:
    """Complete-looking checkpoint directories under ``root``, oldest step first."""
    root = Path(root)
    if not root.is_dir():
        return []
    out = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith("step_") and (p / STATE_FILE).exists():
            try:
                out.append((int(p.name[5:]), p))
            except ValueError:
                continue
    return [p for _, p in sorted(out)]


def latest_checkpoint(root: str | os.PathLike) -> Path | None:
    """The checkpoint ``<root>/latest`` names, or None if there is none."""
    root = Path(root)
    ptr = root / LATEST
    if ptr.exists():
        name = ptr.read_text(encoding="utf-8", errors="replace").strip()
        if name and (root / name / STATE_FILE).exists():
            return inside(root, name, ptr)
    return None


def inside(root: Path, name: str, what: Path | str) -> Path:
    """`root / name` when it is a step directory directly inside `root` (not a path that leaves
    it, through `..`, an absolute path or a symbolic link); else CheckpointMismatchError."""
    p = root / name
    if (not name.startswith("step_") or Path(name).name != name
            or p.resolve().parent != root.resolve()):
        raise CheckpointMismatchError(
            f"{what} names {name!r}, which is not a step directory inside {root}: a run resumes "
            f"only its own checkpoints")
    return p


def resolve_checkpoint(path: str | os.PathLike) -> Path:
    """A checkpoint directory from: itself, a checkpoints root (``latest``), or a run directory
    (``<run>/checkpoints/latest``)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointNotFoundError(f"no checkpoint: {path} does not exist")
    if (path / STATE_FILE).exists() or path.name.startswith("step_"):
        return path
    for root in (path, path / "checkpoints"):
        if (root / LATEST).exists():
            p = latest_checkpoint(root)
            if p is None:
                name = (root / LATEST).read_text(encoding="utf-8", errors="replace").strip()
                inside(root, name, root / LATEST)
                raise CheckpointNotFoundError(
                    f"{root / LATEST} names {name!r}, but {root / name / STATE_FILE} is missing")
            return p
    raise CheckpointNotFoundError(
        f"no checkpoint under {path}: expected {STATE_FILE}, a '{LATEST}' file, or checkpoints/{LATEST}")


def set_pointer(root: Path, pointer: str, name: str) -> None:
    """Atomically make ``<root>/<pointer>`` (``latest``, ``best``) name checkpoint ``name``."""
    ptr_tmp = root / f".tmp-{pointer}-{uuid.uuid4().hex[:8]}"
    try:
        with open(ptr_tmp, "w", encoding="utf-8") as f:
            f.write(name + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(ptr_tmp, root / pointer)
    except BaseException:
        ptr_tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(root)


def read_state(ckpt: Path) -> dict:
    p = ckpt / STATE_FILE
    if not p.exists():
        raise CheckpointNotFoundError(f"checkpoint {ckpt} is incomplete: {STATE_FILE} is missing")
    try:
        state = json.loads(p.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointCorruptError(f"{p} is not valid JSON ({e}); the checkpoint is corrupt") from e
    if not isinstance(state, dict) or state.get("format") != "xtrain-lessons-checkpoint":
        raise CheckpointCorruptError(f"{p} is not an xtrain-lessons checkpoint state file")
    v = state.get("format_version")
    if v != FORMAT_VERSION:
        raise CheckpointVersionError(
            f"checkpoint {ckpt} has format version {v}, this xtrain-lessons reads version "
            f"{FORMAT_VERSION}; load it with the version that wrote it")
    return state


def _load_tensors(ckpt: Path, fname: str, info: dict | None) -> dict[str, np.ndarray]:

    p = ckpt / fname
    if not p.exists():
        raise CheckpointNotFoundError(f"checkpoint {ckpt} is incomplete: {fname} is missing")
    if info:
        size = p.stat().st_size
        if size != info["bytes"]:
            raise CheckpointCorruptError(
                f"{p} is truncated or altered: {size} bytes, {info['bytes']} were written")
        if _sha256(p) != info["sha256"]:
            raise CheckpointCorruptError(f"{p} is corrupt: its SHA-256 differs from the one recorded at save")
    try:
        return safetensors.numpy.load_file(str(p))
    except (SafetensorError, OSError, ValueError) as e:
        raise CheckpointCorruptError(f"{p} is not a readable safetensors file ({e})") from e


# Model-config fields that choose how the same weights are computed, not what they are:
# a run may be resumed with recompute (T13) or flash attention (T14) switched on or off.
EXECUTION_ONLY_FIELDS = frozenset({"recompute", "attention"})


def check_identity(ckpt: Path, state: dict, run_id: str | None, config_hash: str | None) -> None:
    """The checkpoint's step matches its directory name and it belongs to this run."""
    step = state.get("step")
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        raise CheckpointCorruptError(f"{ckpt / STATE_FILE} records no valid step ({step!r})")
    if ckpt.name.startswith("step_") and ckpt.name != step_dir_name(step):
        raise CheckpointMismatchError(
            f"{ckpt} records step {step}, but its directory is named {ckpt.name}: it was renamed or "
            f"copied from elsewhere; it cannot be resumed")
    saved = state.get("run_id")
    if run_id is not None and saved is not None and saved != run_id:
        raise CheckpointMismatchError(
            f"{ckpt} belongs to run {saved}, not to this run ({run_id}): it was copied from another "
            f"run; remove it, or resume the run it came from")
    saved = state.get("config_hash")
    if config_hash is not None and saved is not None and saved != config_hash:
        raise CheckpointMismatchError(
            f"{ckpt} was saved with a different model/data/seed configuration (config hash "
            f"{saved[:12]}…, this run {config_hash[:12]}…): it cannot continue this run")


def _config_diff(saved: dict, expected: dict) -> list[str]:
    keys = sorted((set(saved) | set(expected)) - EXECUTION_ONLY_FIELDS)
    return [f"{k}: checkpoint {saved.get(k)!r} vs expected {expected.get(k)!r}"
            for k in keys if saved.get(k) != expected.get(k)]


def verify_checkpoint(ckpt: Path) -> None:
    """Read state.json and check every file's size and SHA-256 (CheckpointError if not intact)."""
    state = read_state(ckpt)
    check_identity(ckpt, state, None, None)
    for fname, info in (state.get("files") or {}).items():
        p = ckpt / fname
        if not p.is_file():
            raise CheckpointNotFoundError(f"checkpoint {ckpt} is incomplete: {fname} is missing")
        if info and (p.stat().st_size != info["bytes"] or _sha256(p) != info["sha256"]):
            raise CheckpointCorruptError(f"{p} is truncated or altered (size or SHA-256 differs)")


def previous_intact(root: Path, before: Path) -> Path | None:
    """The newest intact checkpoint under ``root`` older than ``before`` (None if none)."""
    for ckpt in reversed(list_checkpoints(root)):
        if ckpt.name >= before.name:
            continue
        try:
            verify_checkpoint(ckpt)
            return ckpt
        except CheckpointError:
            continue
    return None
