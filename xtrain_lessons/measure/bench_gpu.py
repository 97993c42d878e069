"""`xtrain bench train --device cuda`: the GPU engine against PyTorch on the same GPU (phase T07b).

    xtrain bench train --device cuda --dtype bf16 --cuda-graph --against sdpa,compile,reduce-overhead,cuda-graph
                       [--preset tiny|20m|gpt2-small] [--batch-size B] [--seq-len T] [--attention composed|flash]

The steppers, each from the same weights and on the same batches:
- ``engine``: the training loop's GPU step: the model on the device, AdamW over flat buffers
  with the norm, the clip (and fp16's unscale, skip and loss-scale update) on the device, no host
  synchronisation inside a step;
- ``engine+graph`` (``--cuda-graph``): that step captured once as a CUDA graph and replayed
  (training/loop/cuda_graph.py), checked bit for bit against the eager step at the capture;
- the torch baselines named in ``--against`` (measure/torch_twin.py; default DEFAULT_AGAINST):
  ``sdpa`` (eager, SDPA, fused AdamW, pinned batches copied without blocking, autocast in bf16/fp16),
  ``compile`` (torch.compile, default mode: forward + loss + their backward, and the optimizer step
  apart), ``reduce-overhead`` (the same with CUDA graphs), ``cuda-graph`` (the whole step in
  torch.cuda.graph with AdamW(fused, capturable)), ``eager`` (composed attention), ``amp``.
A baseline that cannot be built or fails (torch.compile without a compiler, a capture that fails)
prints one line, ``torch NAME: not measured: REASON``, and the others go on.

Same work: every stepper's first step runs on the same warm-up batch from the same weights, and its
loss must be the engine's (within LOSS_TOLERANCE, relative: float32 to its rounding, bf16 / fp16 to
that of the logits); one that is not is marked LOSS MISMATCH and the exit code is 1.

Timing: `--rounds` blocks of 1 untimed + `--steps` timed steps per stepper; a block is timed between
two synchronisations (device.Timer; torch.cuda.synchronize), as a training loop runs between two
logging points, and the per-step time is the block's over its steps: launches overlap the GPU's
work, which is the point. The median over rounds is reported, with the host's time to issue one
step into an idle device (the untimed step, right after a synchronisation): about the step's time
when it is launch-bound (what a CUDA graph would remove), well under it when the GPU is the bottleneck.

MFU: the FLOPs the model needs (bench.train_flops_per_token) per second — achieved TFLOP/s, printed
beside it — over the card's dense spec peak for the compute dtype (measure/gpu_specs.py: float32
without TF32 on the CUDA cores; bf16 / fp16 on the tensor cores with float32 accumulation). A card
not in that table is named as such, and MFU is then against the measured matmul peak (one large
cuBLAS product through CuPy in the dtype), which is printed either way.

Memory: each stepper's peak device memory over one step = what it holds between steps (weights,
gradients, optimizer state, graph pools: the growth of the memory in use across its construction
and first steps) + the most one step allocates beyond that (CuPy's pool, through an allocator hook,
for the engine; torch.cuda.max_memory_allocated for torch).

Last line:

    throughput vs torch: sdpa R.RRx, reduce-overhead R.RRx ... (engine E tok/s, A TFLOP/s, MFU M% of P TFLOP/s (dtype) ...)

Without a real GPU (the tests' CuPy stand-in) the engine side runs and the numbers mean nothing;
the torch side needs torch with CUDA and is skipped otherwise, with a message.
"""

from __future__ import annotations

import time

import numpy as np

from xtrain_lessons.measure.bench import _batches, parse_against, train_flops_per_token
from xtrain_lessons.measure.gpu_specs import spec_peak
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.runtime import cublas_direct
from xtrain_lessons.runtime.device import Timer, describe, get_xp, synchronize
from xtrain_lessons.training.loop.cuda_graph import CudaGraphStep
from xtrain_lessons.training.optim import AdamW
from xtrain_lessons.training.optim.grad_scaler import GradScaler

__all__ = ["run_train_bench_gpu", "gpu_matmul_peak", "engine_stepper_gpu", "DEFAULT_AGAINST", "LOSS_TOLERANCE"]

DEFAULT_AGAINST = "sdpa,reduce-overhead,cuda-graph"
LOSS_TOLERANCE = {"float32": 1e-4, "bf16": 2.0 ** -6, "fp16": 2.0 ** -6}
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


def one_line(e: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0][:240]}" if text else type(e).__name__


class _Memory:
    """Device memory in use by the engine (CuPy's default pool) and torch (its caching allocator)."""

    def __init__(self, torch):
        self.cupy, self.torch = get_xp(), torch
        self.pool = self.cupy.get_default_memory_pool()

    def sync(self) -> None:
        synchronize()
        if self.torch is not None:
            self.torch.cuda.synchronize()

    def in_use(self) -> int:
        self.sync()
        return self.pool.used_bytes() + (self.torch.cuda.memory_allocated() if self.torch is not None else 0)

    def step_extra(self, step, batch) -> int:
        """The most one step allocates beyond what was in use when it began (bytes)."""
        self.sync()
        pool_before = self.pool.used_bytes()
        peak = [pool_before]

        def malloc(size):  # every allocation of the step passes here: the pool's high-water mark
            mem = self.pool.malloc(size)
            peak[0] = max(peak[0], self.pool.used_bytes())
            return mem

        if self.torch is not None:
            self.torch.cuda.reset_peak_memory_stats()
            torch_before = self.torch.cuda.memory_allocated()
        with self.cupy.cuda.using_allocator(malloc):
            step(batch)
            self.sync()
        extra = max(peak[0], self.pool.used_bytes()) - pool_before
        if self.torch is not None:
            extra += self.torch.cuda.max_memory_allocated() - torch_before
        return extra


def _timed_blocks(steppers: dict, batches: list, rounds: int, steps: int, torch) -> tuple[dict, dict]:
    """(name -> per-step seconds of each round's block, name -> the host's seconds to issue one step
    into an idle device): 1 untimed step, then `steps` timed ones between two synchronisations.
    The untimed step follows a synchronisation, so nothing holds the host back while it issues the
    work: about the step's time when the step is launch-bound (what a CUDA graph removes), well under
    it when the GPU is the bottleneck. (The timed steps' own host times say nothing: once the
    device's queue of launches is full, the host waits at the GPU's pace either way.) A stepper that
    fails is reported in one line and dropped from `steppers`."""
    def sync():
        synchronize()
        if torch is not None:
            torch.cuda.synchronize()

    times = {name: [] for name in steppers}
    host = {name: [] for name in steppers}
    for r in range(rounds):
        block = batches[r * (steps + 1):(r + 1) * (steps + 1)]
        for name, step in list(steppers.items()):
            try:
                sync()
                host[name].append(step(block[0])[1])
                sync()
                t0 = time.perf_counter()
                for b in block[1:]:
                    step(b)
                sync()
            except Exception as e:  # noqa: BLE001 - one line, the others go on
                if name == "engine":
                    raise
                print(f"{_what(name)}: not measured: failed while timed: {one_line(e)}")
                del steppers[name], times[name], host[name]
                continue
            times[name].append((time.perf_counter() - t0) / steps)
    return times, host


def _what(name: str) -> str:
    return name if name.startswith("engine") else f"torch {name}"


def _device_name() -> str:
    cupy = get_xp()
    name = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def _gib(n) -> str:
    if n is None:
        return "n/a"
    return f"{n / 2 ** 30:.2f} GiB" if abs(n) >= 2 ** 30 else f"{n / 2 ** 20:.1f} MiB"


def _build(make, warm, memory: _Memory):
    """(step, first loss, bytes it holds between steps): make() the stepper, take its first step on
    `warm` (compilation, capture) and its `warmup_steps` more, measuring the memory they keep."""
    before = memory.in_use()
    step = make()
    first = float(step(warm)[0])
    for _ in range(getattr(step, "warmup_steps", 0)):
        step(warm)
    held = memory.in_use() - before
    pool = getattr(getattr(step, "graph_step", None), "_pool", None)  # the engine graph's own pool
    if pool is not None and hasattr(pool, "total_bytes"):
        held += pool.total_bytes()
    return step, first, held


def run_train_bench_gpu(args) -> int:
    """`xtrain bench train --device cuda`; returns the exit code."""
    if args.preset not in PRESETS:
        print(f"xtrain bench: unknown preset {args.preset!r}; choose one of {sorted(PRESETS)}")
        return 2
    against = [] if args.no_torch else parse_against(args.against or DEFAULT_AGAINST)
    if against is None:
        return 2
    dtype = getattr(args, "dtype", "float32")
    base = PRESETS[args.preset]
    config = base.replace(vocab_size=args.vocab_size, max_seq_len=max(base.max_seq_len, args.seq_len))
    if getattr(args, "attention", None):
        config = config.replace(attention=args.attention)
    B, T = args.batch_size, args.seq_len
    warm, *batches = _batches(config.vocab_size, B, T, 1 + args.rounds * (args.steps + 1))
    print(f"bench train on the GPU: {describe()}; preset {args.preset} ({config.n_params() / 1e6:.1f}M params, "
          f"vocab {config.vocab_size}, {config.attention} attention), {dtype}, batch {B} x {T} = {B * T} tokens/step, "
          f"{args.rounds} rounds x {args.steps} timed steps")
    fpt = train_flops_per_token(config, T)
    card = _device_name()
    spec = spec_peak(card, dtype)
    try:
        measured = gpu_matmul_peak(dtype, args.peak_n or 8192)
        of_spec = f" ({100 * measured / spec.flops:.0f}% of the spec)" if spec else ""
        print(f"matmul peak measured ({dtype}, one cuBLAS product through CuPy): {measured / 1e12:.1f} TFLOP/s"
              f"{of_spec}")
    except Exception as e:  # noqa: BLE001 - the spec peak may still serve
        measured = None
        print(f"matmul peak measured ({dtype}): not measured: {one_line(e)}")
    if spec:
        print(f"MFU against the {spec.card}'s dense {spec.dtype} peak, {spec.flops / 1e12:.1f} TFLOP/s ({spec.source})")
    else:
        print(f"{card} is not in the table of spec peaks (measure/gpu_specs.py): MFU against the measured matmul peak")
    peak = spec.flops if spec else measured
    basis = f"dense spec of the {spec.card}" if spec else "measured"
    print(f"model FLOPs per trained token: {fpt / 1e6:.1f} MFLOP")

    torch = _torch_cuda()
    memory = _Memory(torch)
    steppers, first, held = {}, {}, {}
    init = {}

    def engine():
        step, state = engine_stepper_gpu(config, dtype)
        init.update(state)
        return step

    makers = [("engine", engine)]
    if getattr(args, "cuda_graph", False):
        makers.append(("engine+graph", lambda: engine_stepper_gpu(config, dtype, graph=True)[0]))
    if against and torch is None:
        print("torch with CUDA is not available here: engine only")
    elif against:
        from xtrain_lessons.measure.torch_twin import torch_stepper  # noqa: PLC0415

        makers += [(k, lambda k=k: torch_stepper(config, init, None, k, device="cuda", precision=dtype)[0])
                   for k in against]
    for name, make in makers:
        try:
            steppers[name], first[name], held[name] = _build(make, warm, memory)
        except Exception as e:  # noqa: BLE001 - a baseline that cannot run here is one line
            if name == "engine":
                raise
            print(f"{_what(name)}: not measured: {one_line(e)}")
        if name == "engine" and cublas_direct.describe():
            print(f"matmuls: {cublas_direct.describe()}")
    for step in steppers.values():
        if hasattr(step, "prepare"):
            step.prepare([warm, *batches])  # pinned host memory, outside the timing
    times, host = _timed_blocks(steppers, batches, args.rounds, args.steps, torch)
    extra = {}
    for name, step in steppers.items():
        try:
            extra[name] = memory.step_extra(step, batches[-1])
        except Exception as e:  # noqa: BLE001
            print(f"{_what(name)}: memory not measured: {one_line(e)}")
    tps = {name: B * T / float(np.median(t)) for name, t in times.items()}
    if "engine+graph" in steppers:
        why = steppers["engine+graph"].graph_step.reason
        print("CUDA graph: the step is captured and replayed (checked bit for bit against the eager step)"
              if why is None else f"CUDA graph: not used, {why}")
    tol = LOSS_TOLERANCE[dtype]
    mismatched = [n for n in tps if abs(first[n] - first["engine"]) > tol * abs(first["engine"])]

    def mfu(rate):
        return f"{100 * rate * fpt / peak:.1f}%" if peak else "n/a"

    for name, rate in tps.items():
        delta = "" if name == "engine" else f" (|Δ| {abs(first[name] - first['engine']):.1e})"
        flag = f", LOSS MISMATCH: more than {tol:.0e} relative from the engine's" if name in mismatched else ""
        mem = _gib(held[name] + extra[name]) if name in extra else "n/a"
        print(f"{_what(name)}: {B * T / rate * 1e3:.1f} ms/step (host {np.median(host[name]) * 1e3:.1f} ms to "
              f"issue one), {rate:,.0f} tok/s, {rate * fpt / 1e12:.1f} TFLOP/s, MFU {mfu(rate)}, first loss {first[name]:.4f}"
              f"{delta}{flag}, step peak memory {mem}{_skips(name, torch)}")
    if "engine" in extra:
        mems = ", ".join(f"{_what(n)} {_gib(held[n] + extra[n])}" for n in extra)
        ratios = ", ".join(f"{_what(n)} {(held['engine'] + extra['engine']) / (held[n] + extra[n]):.2f}x"
                           for n in extra if not n.startswith("engine") and held[n] + extra[n] > 0)
        print(f"peak device memory of one step: {mems}" + (f" (engine / {ratios})" if ratios else ""))
    for mine in [n for n in tps if n.startswith("engine")][::-1]:  # the plain engine's line last
        ratios = ", ".join(f"{n} {tps[mine] / tps[n]:.2f}x" for n in tps if not n.startswith("engine")) or "n/a"
        of = f"of {peak / 1e12:.1f} TFLOP/s ({dtype}), {basis}" if peak else f"n/a ({dtype})"
        print(f"throughput vs torch{' (CUDA graph)' if mine != 'engine' else ''}: {ratios} ({mine} "
              f"{tps[mine]:,.0f} tok/s, {tps[mine] * fpt / 1e12:.1f} TFLOP/s, MFU {mfu(tps[mine])} {of})")
    return 1 if mismatched else 0


def _skips(name: str, torch) -> str:
    """For reduce-overhead: how often inductor declined a CUDA graph (then it is not one)."""
    if name != "reduce-overhead" or torch is None:
        return ""
    from torch._dynamo.utils import counters  # noqa: PLC0415

    n = counters["inductor"]["cudagraph_skips"]
    return f" (inductor skipped CUDA graphs {n} time(s): partly eager)" if n else ""
