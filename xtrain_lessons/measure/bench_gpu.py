"""`xtrain bench train --device cuda`: the GPU engine against PyTorch on the same GPU (phase T07).

    xtrain bench train --device cuda --against eager,sdpa,compile,amp [--dtype float32|bf16|fp16]
                       [--preset tiny|20m|gpt2-small] [--batch-size B] [--seq-len T]

The engine's step is the training loop's on a GPU: the model on the device, AdamW over flat
buffers with the norm, the clip (and fp16's unscale, skip and loss-scale update) on the device, no
host synchronisation inside a step. The PyTorch twins (measure/torch_twin.py: eager, sdpa,
compile, and amp = sdpa under autocast bf16) run on the same GPU from the same weights and batches.
Each stepper runs `--rounds` blocks of 1 untimed + `--steps` timed steps; a block is timed between
two synchronisations (device.Timer; torch.cuda.synchronize), as a training loop runs between two
logging points, and the per-step time is the block's over its steps: launches overlap the GPU's
work, which is the point. The median over rounds is reported, with the host's time to issue one
step into an idle device (the untimed step, right after a synchronisation): about the step's time
when it is launch-bound (what a CUDA graph would remove), well under it when the GPU is the
bottleneck.

MFU is against the GPU's measured matmul peak of the compute dtype (a large float32, or bf16 /
fp16, cuBLAS product through CuPy; float32 without TF32, CuPy's default): the FLOPs the model needs
(bench.train_flops_per_token) per second over what this GPU's cuBLAS achieves on one big product.
Last line:

    throughput vs torch: eager R.RRx, amp R.RRx ... (engine E tok/s, MFU M% of P TFLOP/s (dtype))

Without a real GPU (the tests' CuPy stand-in) the engine side runs and the numbers mean nothing;
the torch side needs torch with CUDA and is skipped otherwise, with a message.
"""

from __future__ import annotations

import time

import numpy as np

from xtrain_lessons.measure.bench import _batches, parse_against, train_flops_per_token
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.runtime.device import Timer, describe, get_xp, synchronize
from xtrain_lessons.training.loop.cuda_graph import CudaGraphStep
from xtrain_lessons.training.optim import AdamW
from xtrain_lessons.training.optim.grad_scaler import GradScaler

__all__ = ["run_train_bench_gpu", "gpu_matmul_peak", "engine_stepper_gpu"]

_PEAK_DTYPES = {"float32": np.float32, "fp16": np.float16}


def gpu_matmul_peak(dtype: str = "float32", n: int = 8192, reps: int = 5) -> float:
    """FLOP/s of the best of `reps` (n x n) @ (n x n) products on the device in `dtype`
    ("float32", "bf16" or "fp16"): what cuBLAS achieves through CuPy on one large product."""
    xp = get_xp()
    if dtype == "bf16":
        import ml_dtypes  # noqa: PLC0415

        dt = ml_dtypes.bfloat16
    else:
        dt = _PEAK_DTYPES[dtype]
    a = xp.asarray(np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)).astype(dt)
    a @ a  # warm-up (cuBLAS picks its kernel)
    best = float("inf")
    for _ in range(reps):
        with Timer() as t:
            a @ a
        best = min(best, t.elapsed)
    return 2.0 * n ** 3 / best


def engine_stepper_gpu(config, dtype: str = "float32", seed: int = 0, graph: bool = False):
    """(step(batch) -> (loss, seconds), initial state_dict): the training loop's GPU step (see the
    module doc); the loss stays a device value. graph: the same step captured as a CUDA graph and
    replayed (training/loop/cuda_graph.py; float32 and bf16), `step.graph_step` says whether it was."""
    model = Model(config, seed=seed)
    init = model.state_dict()
    model.to("cuda")
    model.compute_dtype = dtype
    opt = AdamW(model.named_parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    if graph:
        if dtype == "fp16":
            raise ValueError("bench: --cuda-graph captures float32 and bf16 steps (fp16's loss scaling runs eagerly)")
        graphed = CudaGraphStep(model, opt, max_norm=1.0)

        def graph_step(b):
            t0 = time.perf_counter()
            loss = graphed(b)
            return loss, time.perf_counter() - t0

        graph_step.graph_step = graphed
        return graph_step, init
    scaler = GradScaler().to_device(get_xp()) if dtype == "fp16" else None
    state = scaler.state if scaler is not None else None

    def step(b):
        t0 = time.perf_counter()
        model.zero_grad()
        loss = model.loss(b[:, :-1], b[:, 1:])
        (scaler.scale(loss) if scaler is not None else loss).backward()
        opt.clip_grad_norm(1.0, scale_state=state)
        opt.step()
        if scaler is not None:
            scaler.update_from(opt.last_factors)
        return loss.data, time.perf_counter() - t0

    return step, init


def _torch_cuda():
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _timed_blocks(steppers: dict, batches: list, rounds: int, steps: int, torch) -> tuple[dict, dict]:
    """(name -> per-step seconds of each round's block, name -> the host's seconds to issue one step
    into an idle device): 1 untimed step, then `steps` timed ones between two synchronisations.
    The untimed step follows a synchronisation, so nothing holds the host back while it issues the
    work: about the step's time when the step is launch-bound (what a CUDA graph removes), well under
    it when the GPU is the bottleneck. (The timed steps' own host times say nothing: once the
    device's queue of launches is full, the host waits at the GPU's pace either way.)"""
    def sync():
        synchronize()
        if torch is not None:
            torch.cuda.synchronize()

    times = {name: [] for name in steppers}
    host = {name: [] for name in steppers}
    for r in range(rounds):
        block = batches[r * (steps + 1):(r + 1) * (steps + 1)]
        for name, step in steppers.items():
            sync()
            host[name].append(step(block[0])[1])
            sync()
            t0 = time.perf_counter()
            for b in block[1:]:
                step(b)
            sync()
            times[name].append((time.perf_counter() - t0) / steps)
    return times, host


def run_train_bench_gpu(args) -> int:
    """`xtrain bench train --device cuda`; returns the exit code."""
    if args.preset not in PRESETS:
        print(f"xtrain bench: unknown preset {args.preset!r}; choose one of {sorted(PRESETS)}")
        return 2
    against = [] if args.no_torch else parse_against(args.against)
    if against is None:
        return 2
    dtype = getattr(args, "dtype", "float32")
    base = PRESETS[args.preset]
    config = base.replace(vocab_size=args.vocab_size, max_seq_len=max(base.max_seq_len, args.seq_len))
    B, T = args.batch_size, args.seq_len
    warm, *batches = _batches(config.vocab_size, B, T, 1 + args.rounds * (args.steps + 1))
    print(f"bench train on the GPU: {describe()}; preset {args.preset} ({config.n_params() / 1e6:.1f}M params, "
          f"vocab {config.vocab_size}), {dtype}, batch {B} x {T} = {B * T} tokens/step, {args.rounds} rounds x "
          f"{args.steps} timed steps")
    peak = gpu_matmul_peak(dtype, args.peak_n or 8192)
    fpt = train_flops_per_token(config, T)
    print(f"matmul peak ({dtype}, cuBLAS through CuPy): {peak / 1e12:.1f} TFLOP/s; "
          f"model FLOPs per trained token: {fpt / 1e6:.1f} MFLOP")
    engine, init = engine_stepper_gpu(config, dtype)
    steppers = {"engine": engine}
    if getattr(args, "cuda_graph", False):
        steppers["engine+graph"] = engine_stepper_gpu(config, dtype, graph=True)[0]
    torch = _torch_cuda()
    if against and torch is None:
        print("torch with CUDA is not available here: engine only")
    elif against:
        from xtrain_lessons.measure.torch_twin import torch_stepper  # noqa: PLC0415

        steppers.update({k: torch_stepper(config, init, None, k, device="cuda")[0] for k in against})
    first = {name: float(step(warm)[0]) for name, step in steppers.items()}  # compile compiles here
    times, host = _timed_blocks(steppers, batches, args.rounds, args.steps, torch)
    tps = {name: B * T / float(np.median(t)) for name, t in times.items()}
    if "engine+graph" in steppers:
        why = steppers["engine+graph"].graph_step.reason
        print("CUDA graph: the step is captured and replayed (checked bit for bit against the eager step)"
              if why is None else f"CUDA graph: not used, {why}")
    for name, rate in tps.items():
        what = name if name.startswith("engine") else f"torch {name}"
        print(f"{what}: {B * T / rate * 1e3:.1f} ms/step (host {np.median(host[name]) * 1e3:.1f} ms to issue one), "
              f"{rate:,.0f} tok/s, MFU {100 * rate * fpt / peak:.1f}%, first loss {first[name]:.4f}")
    for mine in [n for n in steppers if n.startswith("engine")][::-1]:  # the plain engine's line last
        ratios = ", ".join(f"{n} {tps[mine] / tps[n]:.2f}x" for n in steppers if not n.startswith("engine")) or "n/a"
        print(f"throughput vs torch{' (CUDA graph)' if mine != 'engine' else ''}: {ratios} ({mine} "
              f"{tps[mine]:,.0f} tok/s, MFU {100 * tps[mine] * fpt / peak:.1f}% of {peak / 1e12:.1f} TFLOP/s ({dtype}))")
    return 0
