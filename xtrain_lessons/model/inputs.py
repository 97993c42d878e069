"""The model's inputs: token ids and targets, checked on the host before they meet the device
(phases T05, T07).

    ids = check_ids(ids, vocab_size)                  # host ints in [0, V): free for a host batch
    t, n_valid = host_targets(targets, (B, T), V, -100)
    model.loss(HostChecked(ids_dev), HostChecked(t_dev, n_valid))   # already checked: taken as they are

A bad token id would silently wrap around (NumPy indexing) or read out of bounds (a GPU gather), so
the model checks ids and targets where they are cheap to read: on the host, before the copy. Ids
already on a device are copied back for the check (one synchronisation); `HostChecked` says it was
done before they were copied, which a step captured as a CUDA graph needs (training/loop/cuda_graph.py:
a capture cannot wait for the GPU).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.device import to_host

__all__ = ["HostChecked", "check_ids", "host_targets"]


class HostChecked:
    """Token ids or targets already on the device, checked on the host before they were copied
    there (ids in [0, vocab), targets too or ignore_index; `n_valid` of the targets count): the
    model and the loss take them as they are."""

    __slots__ = ("data", "n_valid")

    def __init__(self, data, n_valid: int | None = None):
        self.data, self.n_valid = data, n_valid


def check_ids(ids, vocab_size: int):
    """`ids` (B, T) as they are, after checking on the host that they are integers in [0, vocab_size)."""
    host = to_host(ids)
    if host.ndim != 2:
        raise ValueError(f"Model: ids must be (B, T), got shape {host.shape}")
    if host.dtype.kind not in "iu":
        raise TypeError(f"Model: ids must be integers, got {host.dtype}")
    if host.size and (int(host.min()) < 0 or int(host.max()) >= vocab_size):
        raise ValueError(f"Model: token ids must lie in [0, {vocab_size}), got [{int(host.min())}, "
                         f"{int(host.max())}] (is vocab_size set from the tokenizer?)")
    return ids if hasattr(ids, "shape") else host  # a list: the host array


def host_targets(targets, lead_shape, V: int, ignore_index: int):
    """(targets as int64 (N,), the number of valid ones): checked on the host (opset.check_targets);
    HostChecked targets were checked before their copy and stay on the device."""
    if isinstance(targets, HostChecked):
        if tuple(targets.data.shape) != tuple(lead_shape) or targets.data.dtype != np.int64:
            raise ValueError(f"cross_entropy: checked targets must be int64 of shape {tuple(lead_shape)}, got "
                             f"{targets.data.dtype} {tuple(targets.data.shape)}")
        return targets.data.reshape(-1), targets.n_valid
    return opset.check_targets(targets.data if isinstance(targets, Tensor) else targets, lead_shape, V, ignore_index)
