"""Saving and loading a checkpoint: the model, the optimizer, the RNG and the run's identity (phase T06).

See the package doc (training/checkpoint/__init__.py) for the format and its guarantees.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import safetensors.numpy

from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.runtime.device import to_host
from xtrain_lessons.training.checkpoint.files import (
    FORMAT_VERSION,
    LATEST,
    MODEL_FILE,
    OPTIM_FILE,
    STATE_FILE,
    CheckpointCorruptError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    _config_diff,
    check_identity,
    _fsync_dir,
    _fsync_file,
    _jsonable,
    _load_tensors,
    _sha256,
    _write_json,
    list_checkpoints,
    read_state,
    resolve_checkpoint,
    set_pointer,
    step_dir_name,
)

__all__ = ["Checkpoint", "save_checkpoint", "load_checkpoint", "load_model_tensors", "rng_from_state"]


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


def _to_host(a) -> np.ndarray:
    """An engine Tensor's or an array's values as a C-contiguous NumPy array."""
    return np.ascontiguousarray(to_host(a.data if isinstance(a, Tensor) else a))


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


# Model-config fields that choose how the same weights are computed, not what they are:
# a run may be resumed with recompute (T13) or flash attention (T14) switched on or off.
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
