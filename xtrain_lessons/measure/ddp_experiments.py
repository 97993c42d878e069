"""The data-parallel experiments the T08/T17 notebooks and the tests run under `xtrain launch`.

    xtrain launch --nproc 2 -- python -m xtrain_lessons.measure.ddp_experiments equiv --out r.npz
    from xtrain_lessons.measure.ddp_experiments import load_result
    load_result("r.npz")["losses"]

Modes: ``ring`` (the hand ring all-reduce against the library's), ``equiv`` (a tiny model
trained N steps: the same numbers on 1 or W ranks; ``--die-rank`` makes one rank exit on
purpose), ``scaling`` (tokens/s per world size). Rank 0 writes the result (.npz, no pickle).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

from xtrain_lessons.model.qwen3 import PRESETS, Config, Model
from xtrain_lessons.parallel import collectives as dist
from xtrain_lessons.parallel.ddp import DDP, accumulate_gradients, average_scalar, micro_batches
from xtrain_lessons.parallel.ring import ring_all_reduce
from xtrain_lessons.runtime.cpu_threads import set_blas_threads
from xtrain_lessons.training.optim import AdamW, clip_grad_norm


def _tiny_model(seed=0, dtype="float32"):
    cfg = Config(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8,
                 ffn_dim=64, max_seq_len=32)
    return Model(cfg, seed=seed, dtype=dtype)


def run_equivalence(steps: int, batch: int, seq: int, accum: int = 1, seed: int = 0,
                    die_rank: int | None = None, die_step: int | None = None,
                    lr: float = 1e-3, dtype: str = "float32") -> dict:
    """Train the tiny model ``steps`` AdamW steps on random tokens; per-rank micro-batch
    ``batch``, ``accum`` micro-steps; the global batch per step is accum·W·batch rows, drawn
    identically on every rank. Returns losses (global mean) and final parameters.
    dtype "float64": the same run in double precision (the same initial values), the exact answer
    float32 runs are measured against (T16)."""
    W, r = (dist.world_size(), dist.rank()) if dist.is_initialized() else (1, 0)
    model = _tiny_model(seed=seed + r, dtype=dtype)  # different inits on purpose: the broadcast fixes them
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
    p = argparse.ArgumentParser(prog="python -m xtrain_lessons.measure.ddp_experiments", description=__doc__.splitlines()[0])
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
    p.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                   help="equiv: float64 gives the exact answer the float32 runs are compared with")
    a = p.parse_args(argv)
    if a.threads:
        set_blas_threads(a.threads)
    cfg = dist.init_from_env(timeout=float(os.environ.get("XTRAIN_DIST_TIMEOUT", "60")))
    rank = cfg["rank"] if cfg else 0
    try:
        if a.mode == "ring":
            res = run_ring_check([int(s) for s in a.sizes.split(",")])
        elif a.mode == "equiv":
            res = run_equivalence(a.steps, a.batch, a.seq, a.accum, die_rank=a.die_rank, die_step=a.die_step,
                                  dtype=a.dtype)
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
