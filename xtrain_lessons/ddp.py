"""Data parallelism (T08) and gradient accumulation (T16).

One replica of the model per process. At the start every replica receives rank 0's
parameters (broadcast), so they start equal; after each backward the gradients are averaged
over the ranks (all-reduce), so every replica applies the same update and they stay equal.

    from xtrain_lessons import distributed as dist
    from xtrain_lessons.ddp import DDP, accumulate_gradients, shard
    dist.init_from_env()                      # started by `xtrain launch` or torchrun
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

``python -m xtrain_lessons.ddp ring|equiv|scaling|die ...`` are the experiments the T08/T17
notebooks and the tests start with ``xtrain launch`` (never inside a notebook's kernel).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np

__all__ = ["DDP", "shard", "micro_batches", "accumulate_gradients", "average_scalar", "agree_any",
           "setup_from_env"]


class DDP:
    """Keeps the replicas of ``params`` (a model, or a dict name -> Tensor) equal across ranks.

    ``dist``: the collective layer (default ``xtrain_lessons.distributed``, initialised).
    ``bucket_bytes``: target size of one flat gradient buffer.
    """

    def __init__(self, params, dist=None, bucket_bytes: int = 1 << 22, broadcast: bool = True):
        if dist is None:
            from . import distributed as dist  # noqa: PLC0415
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
        from .device import array_module  # noqa: PLC0415

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


def accumulate_gradients(model, batches, ddp: DDP | None = None) -> float:
    """Zero the gradients, then for each of the N (x, y) micro-batches: loss / N, backward
    (gradients add up in ``.grad``); all-reduce once at the end (when ``ddp`` is given).
    Returns this rank's mean loss over the micro-batches (unscaled)."""
    model.zero_grad()
    n = len(batches)
    total = 0.0
    for x, y in batches:
        loss = model.loss(x, y)
        total += float(loss.item())
        (loss * (1.0 / n)).backward() if n > 1 else loss.backward()
        del loss
    if ddp is not None:
        ddp.sync_gradients()
    return total / n


def average_scalar(value: float, dist=None) -> float:
    """The mean of ``value`` over the ranks (one all-reduce of one float64)."""
    if dist is None:
        from . import distributed as dist  # noqa: PLC0415
    if dist.world_size() == 1:
        return float(value)
    a = np.array([value], dtype=np.float64)
    dist.all_reduce(a, "sum")
    return float(a[0] / dist.world_size())


def agree_any(flags, dist=None) -> list[bool]:
    """Each flag True on every rank when it is True on any rank (one all-reduce): so that all
    ranks stop at the same step (Ctrl-C, time limit) instead of leaving the others waiting."""
    if dist is None:
        from . import distributed as dist  # noqa: PLC0415
    a = np.array([float(bool(f)) for f in flags], dtype=np.float32)
    if dist.world_size() > 1:
        dist.all_reduce(a, "max")
    return [bool(v) for v in a]


def setup_from_env(timeout: float | None = None):
    """For ``xtrain train`` under ``xtrain launch``/torchrun: init the group from the
    environment and return (rank, world_size), or None when not launched (or WORLD_SIZE=1)."""
    from . import distributed as dist  # noqa: PLC0415

    cfg = dist.env_rank_config()
    if cfg is None or cfg["world_size"] == 1:
        return None
    if not dist.is_initialized():
        t = timeout if timeout is not None else float(os.environ.get("XTRAIN_DIST_TIMEOUT", "120"))
        dist.init(cfg["rank"], cfg["world_size"], cfg["master_addr"], cfg["master_port"], t)
    return cfg["rank"], cfg["world_size"]


# ----- experiments (run under `xtrain launch`; rank 0 writes --out) -------------------------

def _tiny_model(seed=0):
    from .model import Config, Model  # noqa: PLC0415

    cfg = Config(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                 ffn_dim=64, max_seq_len=32)
    return Model(cfg, seed=seed)


def run_equivalence(steps: int, batch: int, seq: int, accum: int = 1, seed: int = 0,
                    die_rank: int | None = None, die_step: int | None = None,
                    lr: float = 1e-3) -> dict:
    """Train the tiny model ``steps`` AdamW steps on random tokens; per-rank micro-batch
    ``batch``, ``accum`` micro-steps; the global batch per step is accum·W·batch rows, drawn
    identically on every rank. Returns losses (global mean) and final parameters."""
    from . import distributed as dist  # noqa: PLC0415
    from .optim import AdamW, clip_grad_norm  # noqa: PLC0415

    W, r = (dist.world_size(), dist.rank()) if dist.is_initialized() else (1, 0)
    model = _tiny_model(seed=seed + r)  # different inits on purpose: the broadcast fixes them
    ddp = DDP(model) if W > 1 else None
    params = model.named_parameters()
    opt = AdamW(params, lr=lr, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(seed + 1000)
    losses = []
    for step in range(steps):
        if die_rank == r and die_step == step:
            print(f"rank {r}: exiting on purpose at step {step}", file=sys.stderr, flush=True)
            os._exit(3)
        x = rng.integers(0, 64, size=(accum * W * batch, seq))
        y = rng.integers(0, 64, size=(accum * W * batch, seq))
        loss = accumulate_gradients(model, micro_batches(x, y, accum, r, W), ddp)
        losses.append(average_scalar(loss) if W > 1 else loss)
        clip_grad_norm(params, 1.0)
        opt.step()
    return {"losses": losses, "params": {k: p.data.copy() for k, p in params.items()},
            "grads": {k: p.grad.copy() for k, p in params.items()}, "world_size": W}


def run_scaling(batch: int, seq: int, steps: int, seed: int = 0) -> dict:
    """Tokens/s of DDP training with per-rank batch ``batch``: global tokens of a step over the
    median step time (robust to a busy machine), after one warm-up step."""
    from . import distributed as dist  # noqa: PLC0415
    from .model import PRESETS, Model  # noqa: PLC0415
    from .optim import AdamW  # noqa: PLC0415

    W, r = (dist.world_size(), dist.rank()) if dist.is_initialized() else (1, 0)
    model = Model(PRESETS["test"].replace(vocab_size=256, dim=128, n_heads=4, n_kv_heads=2, head_dim=32,
                                          ffn_dim=384, max_seq_len=seq), seed=seed)
    ddp = DDP(model) if W > 1 else None
    opt = AdamW(model.named_parameters(), lr=1e-3)
    rng = np.random.default_rng(seed)
    times = []
    for step in range(steps + 1):
        if W > 1:
            dist.barrier()
        t0 = time.perf_counter()
        x = rng.integers(0, 256, size=(W * batch, seq))
        accumulate_gradients(model, micro_batches(x, x, 1, r, W), ddp)
        opt.step()
        times.append(time.perf_counter() - t0)
    dt = float(np.median(times[1:]))
    return {"world_size": W, "batch_per_rank": batch, "global_batch": W * batch, "seq": seq,
            "step_s": dt, "tokens_per_s": W * batch * seq / dt}


def run_ring_check(sizes, dtype="float32", seed: int = 0) -> dict:
    """Hand ring all-reduce vs the library's all_reduce on random arrays of each size."""
    from . import distributed as dist  # noqa: PLC0415
    from .ring import ring_all_reduce  # noqa: PLC0415

    r = dist.rank()
    out = {}
    for n in sizes:
        a = np.random.default_rng([seed, r, n]).standard_normal(n).astype(dtype)
        ring, lib = a.copy(), a.copy()
        before = dist.collective_counts().get("send", 0)
        ring_all_reduce(ring)
        sends = dist.collective_counts().get("send", 0) - before
        dist.all_reduce(lib, "sum")
        out[str(n)] = {"max_abs_diff": float(np.abs(ring.astype(np.float64) - lib).max()) if n else 0.0,
                       "max_abs": float(np.abs(lib).max()) if n else 0.0, "sends": sends}
    return out


def _save(path, obj):
    arrays = {}
    def pull(o, prefix):
        if isinstance(o, dict):
            return {k: pull(v, f"{prefix}{k}/") for k, v in o.items()}
        if isinstance(o, np.ndarray):
            arrays[prefix.rstrip("/")] = o
            return {"__array__": prefix.rstrip("/")}
        return o
    meta = pull(obj, "")
    tmp = str(path) + ".tmp.npz"
    np.savez(tmp, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8), **arrays)
    os.replace(tmp, path)


def load_result(path) -> dict:
    """Read what an experiment's rank 0 wrote with ``--out``."""
    z = np.load(path)
    meta = json.loads(bytes(z["__meta__"]).decode())
    def push(o):
        if isinstance(o, dict):
            if set(o) == {"__array__"}:
                return z[o["__array__"]]
            return {k: push(v) for k, v in o.items()}
        return o
    return push(meta)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m xtrain_lessons.ddp", description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["ring", "equiv", "scaling"])
    p.add_argument("--out", required=True, help="rank 0 writes the result here (.npz)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--accum", type=int, default=1)
    p.add_argument("--sizes", default="0,1,2,3,5,7,1000,12345")
    p.add_argument("--die-rank", type=int, default=None)
    p.add_argument("--die-step", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args(argv)
    from . import distributed as dist  # noqa: PLC0415

    if a.threads:
        from .bench import set_blas_threads  # noqa: PLC0415

        set_blas_threads(a.threads)
    cfg = dist.init_from_env(timeout=float(os.environ.get("XTRAIN_DIST_TIMEOUT", "60")))
    rank = cfg["rank"] if cfg else 0
    try:
        if a.mode == "ring":
            res = run_ring_check([int(s) for s in a.sizes.split(",")])
        elif a.mode == "equiv":
            res = run_equivalence(a.steps, a.batch, a.seq, a.accum, die_rank=a.die_rank, die_step=a.die_step)
            res["collectives"] = dist.collective_counts()
        else:
            res = run_scaling(a.batch, a.seq, a.steps)
        if rank == 0:
            _save(a.out, res)
    finally:
        dist.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main())
