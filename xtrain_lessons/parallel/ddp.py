"""Data parallelism (T08) and gradient accumulation (T16).

One replica of the model per process. At the start every replica receives rank 0's
parameters (broadcast), so they start equal; after each backward the gradients are averaged
over the ranks (all-reduce), so every replica applies the same update and they stay equal.

    from xtrain_lessons.parallel import collectives
    from xtrain_lessons.parallel.ddp import DDP, accumulate_gradients, shard
    collectives.init_from_env()                      # started by `xtrain launch` or torchrun
    ddp = DDP(model)                          # broadcast from rank 0, gradient buckets
    loss = accumulate_gradients(model, micro_batches, ddp)   # N micro-steps, one all-reduce
    opt.step(lr)

Same data, same result: the *global* batch of a step is drawn by every rank from the same
generator and rank r keeps rows [r·b, (r+1)·b) (``shard``). The mean loss over the global
batch is the mean of the ranks' mean losses (equal shard sizes), so the averaged gradient is the
gradient of the global batch — 2 ranks × b equals 1 rank × 2b up to float rounding.

Buckets. Gradients are copied into a few flat float32 buffers of about ``bucket_bytes`` each
and every buffer is all-reduced in one call: one large message costs much less than one per
parameter (latency per message). A real DDP also overlaps these all-reduces with the
backward; this one runs them after it (simpler, same numbers).

Accumulation. ``accumulate_gradients`` runs N micro-batches, each loss scaled by 1/N, the
gradients adding up in ``.grad``; the all-reduce happens once, at the accumulation boundary.

The experiments the T08/T17 notebooks launch live in ``xtrain_lessons.measure.ddp_experiments``.
"""

from __future__ import annotations

import os

import numpy as np

from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.parallel import collectives
from xtrain_lessons.runtime.device import array_module, get_device, import_cupy

__all__ = ["DDP", "shard", "micro_batches", "accumulate_gradients", "average_scalar", "agree_any", "agree_max",
           "setup_from_env"]


class DDP:
    """Keeps the replicas of ``params`` (a model, or a dict name -> Tensor) equal across ranks.

    ``dist``: the collective layer (default ``xtrain_lessons.parallel.collectives``, initialised).
    ``bucket_bytes``: target size of one flat gradient buffer.
    """

    def __init__(self, params, dist=None, bucket_bytes: int = 1 << 22, broadcast: bool = True):
        dist = collectives if dist is None else dist
        self.dist = dist
        if hasattr(params, "named_parameters"):
            params = params.named_parameters()
        self.params = dict(params)
        self.world_size = dist.world_size()
        self.rank = dist.rank()
        # buckets: consecutive parameters until the bucket holds >= bucket_bytes
        self.buckets: list[list[str]] = [[]]
        size = 0
        for name, p in self.params.items():
            if size >= bucket_bytes and self.buckets[-1]:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(name)
            size += p.data.size * 4
        # the buffers live where the parameters do (NumPy here; CuPy with the NCCL backend)
        xp = array_module(next(iter(self.params.values())).data) if self.params else np
        self._flat = [xp.zeros(sum(self.params[n].data.size for n in b), np.float32) for b in self.buckets]
        if broadcast and self.world_size > 1:
            self.broadcast_parameters()

    def broadcast_parameters(self, src: int = 0) -> None:
        """Every rank's parameters become rank ``src``'s (one broadcast per bucket)."""
        for names, flat in zip(self.buckets, self._flat):
            self._gather(names, flat, lambda p: p.data)
            self.dist.broadcast(flat, src)
            self._scatter(names, flat, "data")

    def sync_gradients(self) -> None:
        """Average ``.grad`` over the ranks (one all-reduce per bucket); a parameter without a
        gradient counts as zero and gets one."""
        if self.world_size == 1:
            return
        inv = np.float32(1.0 / self.world_size)  # exact for 2, 4, 8 ... ranks
        for names, flat in zip(self.buckets, self._flat):
            self._gather(names, flat, lambda p: p.grad)
            self.dist.all_reduce(flat, "sum")
            flat *= inv
            self._scatter(names, flat, "grad")

    def _gather(self, names, flat, get):
        i = 0
        for n in names:
            p = self.params[n]
            k = p.data.size
            a = get(p)
            if a is None:
                flat[i:i + k] = 0.0
            else:
                flat[i:i + k] = a.reshape(-1)  # cast to float32 on the copy
            i += k

    def _scatter(self, names, flat, attr):
        i = 0
        for n in names:
            p = self.params[n]
            k = p.data.size
            part = flat[i:i + k].reshape(p.data.shape)
            if attr == "data":
                p.data[...] = part
            elif p.grad is None:
                p.grad = part.astype(p.data.dtype, copy=True)
            else:
                p.grad[...] = part
            i += k


def shard(arr, rank: int, world_size: int):
    """Rows [rank·b, (rank+1)·b) of a global batch of world_size·b rows."""
    n = arr.shape[0]
    if n % world_size:
        raise ValueError(f"a global batch of {n} rows does not split into {world_size} equal shards")
    b = n // world_size
    return arr[rank * b:(rank + 1) * b]


def micro_batches(x, y, accum_steps: int, rank: int = 0, world_size: int = 1):
    """Split a step's global batch (accum_steps · world_size · b rows) into this rank's
    ``accum_steps`` micro-batches: micro-step k, rank r gets rows [(k·W + r)·b, (k·W + r + 1)·b).
    With accum_steps = 1 that is ``shard``; with world_size = 1, consecutive slices."""
    n = x.shape[0]
    parts = accum_steps * world_size
    if n % parts:
        raise ValueError(f"{n} rows do not split into {accum_steps} micro-steps x {world_size} ranks")
    b = n // parts
    out = []
    for k in range(accum_steps):
        lo = (k * world_size + rank) * b
        out.append((x[lo:lo + b], y[lo:lo + b]))
    return out


def accumulate_gradients(model, batches, ddp: DDP | None = None, scale=None, sync: bool = True):
    """Zero the gradients, then for each of the N (x, y) micro-batches: loss / N, backward
    (gradients add up in ``.grad``); all-reduce once at the end (when ``ddp`` is given).
    ``scale`` (T12b fp16): a function applied to loss / N before backward (GradScaler.scale).
    Returns this rank's mean loss over the micro-batches (unscaled): a float, or with
    ``sync=False`` a float64 device scalar of the same value, summed where the losses are (T07b: no
    host synchronisation per micro-step; a step captured as a CUDA graph can make none)."""
    model.zero_grad()
    n = len(batches)
    total = 0.0
    for x, y in batches:
        loss = model.loss(x, y)
        total += float(loss.item()) if sync else loss.data.astype(np.float64)  # the same float64 sum
        # 1/n made on the device by a fill, not copied from the host: a CUDA graph can record it
        part = loss * Tensor(array_module(loss.data).full((), 1.0 / n, loss.dtype)) if n > 1 else loss
        (scale(part) if scale is not None else part).backward()
        del loss
    if ddp is not None:
        ddp.sync_gradients()
    return total / n


def average_scalar(value: float, dist=None) -> float:
    """The mean of ``value`` over the ranks (one all-reduce of one float64)."""
    dist = collectives if dist is None else dist
    if dist.world_size() == 1:
        return float(value)
    a = np.array([value], dtype=np.float64)
    dist.all_reduce(a, "sum")
    return float(a[0] / dist.world_size())


def agree_any(flags, dist=None) -> list[bool]:
    """Each flag True on every rank when it is True on any rank (one all-reduce): so that all
    ranks stop at the same step (Ctrl-C, time limit) instead of leaving the others waiting."""
    dist = collectives if dist is None else dist
    a = np.array([float(bool(f)) for f in flags], dtype=np.float32)
    if dist.world_size() > 1:
        dist.all_reduce(a, "max")
    return [bool(v) for v in a]


def agree_max(values, dist=None) -> list[float]:
    """Each value replaced by its maximum over the ranks (one all-reduce of float64): flags
    (True on any rank) and small numbers such as a signal's, agreed in one message."""
    dist = collectives if dist is None else dist
    a = np.array([float(v) for v in values], dtype=np.float64)
    if dist.world_size() > 1:
        dist.all_reduce(a, "max")
    return [float(v) for v in a]


def setup_from_env(timeout: float | None = None):
    """For ``xtrain train`` under ``xtrain launch``/torchrun: init the group from the
    environment and return (rank, world_size), or None when not launched (or WORLD_SIZE=1)."""
    cfg = collectives.env_rank_config()
    if cfg is None or cfg["world_size"] == 1:
        return None
    if not collectives.is_initialized():
        t = timeout if timeout is not None else float(os.environ.get("XTRAIN_DIST_TIMEOUT", "120"))
        use_local_gpu(cfg["local_rank"])
        collectives.init(cfg["rank"], cfg["world_size"], cfg["master_addr"], cfg["master_port"], t,
                         backend=collectives.pick_backend(cfg["world_size"]))
    return cfg["rank"], cfg["world_size"]


def use_local_gpu(local_rank: int) -> None:
    """On a GPU, rank `local_rank` of this machine works on GPU local_rank % (number of GPUs):
    one GPU each when there are enough, several ranks sharing one otherwise."""
    if get_device() == "cuda":
        cupy = import_cupy()
        cupy.cuda.Device(local_rank % cupy.cuda.runtime.getDeviceCount()).use()
