"""Checkpoints: everything needed to continue a run exactly, with no pickle anywhere.

A checkpoint is a directory::

    <root>/step_00000500/
        model.safetensors       the parameters (name -> array)
        optimizer.safetensors   the optimizer's arrays (AdamW: "<name>.exp_avg", "<name>.exp_avg_sq")
        state.json              step, run id, config hash, model config, train config,
                                optimizer scalars, RNG state (numpy Generator
                                ``bit_generator.state``), data position, tokenizer hash,
                                format version, and the SHA-256 of both files
    <root>/latest               one line: the name of the newest complete checkpoint (a step
                                directory inside <root>; any other name is refused)
    <root>/best                 one line: the checkpoint with the lowest loss (training keeps it)

Crash safety. A checkpoint is written into a temporary directory next to its final place
(``<root>/.tmp-step_…``), every file and the directory are fsync'ed, then the directory is
renamed into place (atomic on POSIX) and only then is ``latest`` replaced (written to a
temp file, fsync'ed, ``os.replace``'d). A crash at any moment therefore leaves ``latest``
naming a complete checkpoint: at worst an orphan ``.tmp-*`` directory remains, which the
next save removes. Older checkpoints are pruned after ``latest`` moves (``keep_last``).

Loading checks, with a clear message for each: missing files, truncated or corrupt
safetensors (size and SHA-256 recorded at save time), an unknown format version, a model
config that differs from the one expected, a tokenizer hash that differs, a step directory
whose name is not its recorded step, a run id or config hash of another run.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError
import safetensors.numpy

from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.runtime.device import to_host

__all__ = [
    "FORMAT_VERSION",
    "Checkpoint",
    "CheckpointError",
    "CheckpointNotFoundError",
    "CheckpointCorruptError",
    "CheckpointMismatchError",
    "CheckpointVersionError",
    "CheckpointWriteError",
    "is_disk_full",
    "save_checkpoint",
    "load_checkpoint",
    "resolve_checkpoint",
    "latest_checkpoint",
    "list_checkpoints",
    "rng_from_state",
    "set_pointer",
    "verify_checkpoint",
    "previous_intact",
]

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


@dataclass
class Checkpoint:
    """What ``load_checkpoint`` returns (model/optimizer arrays are already loaded into them)."""
    path: Path
    step: int
    model_config: dict | None
    train_config: dict | None
    rng_state: dict | None
    data_position: Any
    tokenizer_hash: str | None
    extra: dict = field(default_factory=dict)
    state: dict = field(default_factory=dict)  # the whole state.json

    def rng(self) -> np.random.Generator | None:
        """A numpy Generator in exactly the saved state (None if none was saved)."""
        return rng_from_state(self.rng_state) if self.rng_state is not None else None


def rng_from_state(state: dict) -> np.random.Generator:
    """Rebuild a ``np.random.Generator`` from ``gen.bit_generator.state``."""
    name = state["bit_generator"]
    bitgen_cls = getattr(np.random, name, None)
    if bitgen_cls is None:
        raise CheckpointCorruptError(f"unknown numpy bit generator {name!r} in checkpoint")
    bg = bitgen_cls()
    bg.state = state
    return np.random.Generator(bg)


# ----- helpers ---------------------------------------------------------------------------

def _to_host(a) -> np.ndarray:
    """An engine Tensor's or an array's values as a C-contiguous NumPy array."""
    return np.ascontiguousarray(to_host(a.data if isinstance(a, Tensor) else a))


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


# ----- save ------------------------------------------------------------------------------

def save_checkpoint(root: str | os.PathLike, step: int, model, optimizer=None, *,
                    model_config: dict | None = None, train_config: dict | None = None,
                    rng: np.random.Generator | None = None, data_position: Any = None,
                    tokenizer_hash: str | None = None, extra: dict | None = None,
                    keep_last: int | None = 2, run_id: str | None = None,
                    config_hash: str | None = None, keep: tuple[str, ...] = ()) -> Path:
    """Write ``<root>/step_<step>/`` atomically, point ``<root>/latest`` at it, prune old ones.

    ``model``: anything with ``state_dict() -> {name: array}`` (or such a dict itself).
    ``optimizer``: an ``xtrain_lessons.training.optim`` optimizer (or None). ``model_config`` defaults
    to ``model.config.to_dict()``. ``keep_last``: how many checkpoints to keep (None: all);
    ``keep``: names never pruned (the best-validation one). ``run_id`` / ``config_hash``: the
    run's identity, checked on resume. Returns the checkpoint directory. A failed write (a full
    disk) removes its temporary directory and leaves ``latest`` and older checkpoints as they were.
    """

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # leftovers of a crashed save
        shutil.rmtree(stale, ignore_errors=True)

    name = step_dir_name(step)
    final = root / name
    tmp = root / f".tmp-{name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        sd = model if isinstance(model, dict) else model.state_dict()
        tensors = {k: _to_host(v) for k, v in sd.items()}
        safetensors.numpy.save_file(tensors, str(tmp / MODEL_FILE), metadata={"format": "xtrain-lessons", "step": str(step)})
        files = {MODEL_FILE: None}
        optim_meta = None
        if optimizer is not None:
            osd = optimizer.state_dict()
            otensors = {k: _to_host(v) for k, v in osd["tensors"].items()}
            safetensors.numpy.save_file(otensors, str(tmp / OPTIM_FILE), metadata={"format": "xtrain-lessons"})
            optim_meta = osd["meta"]
            files[OPTIM_FILE] = None
        for fname in files:
            _fsync_file(tmp / fname)
            files[fname] = {"bytes": (tmp / fname).stat().st_size, "sha256": _sha256(tmp / fname)}
        if model_config is None and hasattr(model, "config") and hasattr(model.config, "to_dict"):
            model_config = model.config.to_dict()
        state = {
            "format": "xtrain-lessons-checkpoint",
            "format_version": FORMAT_VERSION,
            "step": int(step),
            "run_id": run_id,
            "config_hash": config_hash,
            "model_config": model_config,
            "train_config": train_config,
            "optimizer": optim_meta,
            "rng_state": rng.bit_generator.state if rng is not None else None,
            "data_position": data_position,
            "tokenizer_hash": tokenizer_hash,
            "extra": extra or {},
            "files": files,
        }
        _write_json(tmp / STATE_FILE, _jsonable(state))
        _fsync_dir(tmp)
        if final.exists():  # re-saving a step (e.g. after a resume): move the old one aside
            old = root / f".tmp-old-{name}-{uuid.uuid4().hex[:8]}"
            os.rename(final, old)
            os.rename(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, final)
        _fsync_dir(root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise

    set_pointer(root, LATEST, name)
    if keep_last is not None and keep_last > 0:
        for old in list_checkpoints(root)[:-keep_last]:
            if old.name != name and old.name not in keep:
                shutil.rmtree(old, ignore_errors=True)
    return final


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


# ----- load ------------------------------------------------------------------------------

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


def _config_diff(saved: dict, expected: dict) -> list[str]:
    keys = sorted((set(saved) | set(expected)) - EXECUTION_ONLY_FIELDS)
    return [f"{k}: checkpoint {saved.get(k)!r} vs expected {expected.get(k)!r}"
            for k in keys if saved.get(k) != expected.get(k)]


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


def load_checkpoint(path: str | os.PathLike, model=None, optimizer=None, *,
                    expected_model_config: dict | None = None,
                    expected_tokenizer_hash: str | None = None, expected_run_id: str | None = None,
                    expected_config_hash: str | None = None) -> Checkpoint:
    """Load a checkpoint (a step directory, a checkpoints root, or a run directory).

    If ``model`` is given its parameters are overwritten in place (its config is checked
    against the saved one first); likewise ``optimizer``. ``expected_model_config`` /
    ``expected_tokenizer_hash``, ``expected_run_id``, ``expected_config_hash``, when given,
    must match what was saved (a step directory must also be named after its step). Raises a subclass of
    :class:`CheckpointError` with a message naming the problem.
    """
    ckpt = resolve_checkpoint(path)
    state = read_state(ckpt)
    files = state.get("files") or {}
    check_identity(ckpt, state, None, None)  # the step; the run after the config diff below

    saved_cfg = state.get("model_config")
    if expected_model_config is None and model is not None and hasattr(model, "config") \
            and hasattr(model.config, "to_dict"):
        expected_model_config = model.config.to_dict()
    if expected_model_config is not None and saved_cfg is not None:
        diff = _config_diff(saved_cfg, _jsonable(expected_model_config))
        if diff:
            raise CheckpointMismatchError(
                f"checkpoint {ckpt} was saved for a different model config: " + "; ".join(diff))
    th = state.get("tokenizer_hash")
    if expected_tokenizer_hash is not None and th is not None and th != expected_tokenizer_hash:
        raise CheckpointMismatchError(
            f"checkpoint {ckpt} was trained with tokenizer {th[:16]}…, but the tokenizer given "
            f"hashes to {expected_tokenizer_hash[:16]}… (token ids would mean different things)")

    check_identity(ckpt, state, expected_run_id, expected_config_hash)

    if model is not None:
        tensors = _load_tensors(ckpt, MODEL_FILE, files.get(MODEL_FILE))
        try:
            if isinstance(model, dict):
                model.clear()
                model.update(tensors)
            else:
                model.load_state_dict(tensors)
        except (KeyError, ValueError) as e:
            raise CheckpointMismatchError(f"checkpoint {ckpt} does not fit the model: {e}") from e
    if optimizer is not None:
        if state.get("optimizer") is None:
            raise CheckpointNotFoundError(f"checkpoint {ckpt} holds no optimizer state")
        otensors = _load_tensors(ckpt, OPTIM_FILE, files.get(OPTIM_FILE))
        try:
            optimizer.load_state_dict({"tensors": otensors, "meta": state["optimizer"]})
        except (KeyError, ValueError) as e:
            raise CheckpointMismatchError(f"checkpoint {ckpt}: optimizer state does not fit: {e}") from e

    return Checkpoint(path=ckpt, step=int(state["step"]), model_config=saved_cfg,
                      train_config=state.get("train_config"), rng_state=state.get("rng_state"),
                      data_position=state.get("data_position"), tokenizer_hash=th,
                      extra=state.get("extra") or {}, state=state)


def load_model_tensors(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Just the parameters of a checkpoint (verified), e.g. for sampling or export."""
    ckpt = resolve_checkpoint(path)
    state = read_state(ckpt)
    return _load_tensors(ckpt, MODEL_FILE, (state.get("files") or {}).get(MODEL_FILE))
