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

from xtrain_lessons.training.checkpoint.files import (
    FORMAT_VERSION,
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    CheckpointWriteError,
    check_identity,
    inside,
    is_disk_full,
    latest_checkpoint,
    list_checkpoints,
    previous_intact,
    read_state,
    resolve_checkpoint,
    set_pointer,
    step_dir_name,
    verify_checkpoint,
)
from xtrain_lessons.training.checkpoint.state import (
    Checkpoint,
    load_checkpoint,
    load_model_tensors,
    rng_from_state,
    save_checkpoint,
)

__all__ = ["FORMAT_VERSION", "Checkpoint", "CheckpointError", "CheckpointNotFoundError", "CheckpointCorruptError",
           "CheckpointMismatchError", "CheckpointVersionError", "CheckpointWriteError", "is_disk_full", "save_checkpoint",
           "load_checkpoint", "load_model_tensors", "resolve_checkpoint", "latest_checkpoint", "list_checkpoints",
           "rng_from_state", "set_pointer", "verify_checkpoint", "previous_intact", "inside", "read_state", "step_dir_name",
           "check_identity"]
