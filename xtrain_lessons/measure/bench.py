"""Benchmarks: training throughput of the engine against PyTorch, MFU and step memory.

    xtrain bench train [--preset tiny] [--batch-size 16] [--seq-len 128] [--steps 3] [--rounds 3]
                       [--against eager,sdpa,compile]

Times full training steps (forward, backward, gradient clipping, AdamW) of the engine's
model and of PyTorch twins (`torch_twin`: same config, weights, batches and thread count) in
one run. Baselines (`--against`, default ``eager``): ``eager`` (attention composed from
matmul + mask + softmax as in the engine), ``sdpa`` (`F.scaled_dot_product_attention`),
``compile`` (the sdpa model's forward and loss under `torch.compile`, and its clip + AdamW step
compiled apart), ``amp`` (sdpa under autocast bf16); ``reduce-overhead`` and ``cuda-graph`` are CUDA
graphs, for `--device cuda` (measure/bench_gpu.py); a baseline that cannot run prints one line
and the others go on. Every stepper first takes one step on a
warm-up batch (same weights: the first losses agree; for compile this step is the
compilation, reported and excluded), then `--rounds` rounds of one block per stepper
(`--steps` timed steps each, after one untimed step), so that all see the same machine load
without one's idle worker threads slowing the other's step. Reports the median tokens/s of
each, their FLOP/s against the machine's measured float32 matmul peak (the best of a large
``np.matmul`` and of the engine's own matmul, before and after), i.e. the model FLOPs utilisation (MFU), and the peak memory
of one more step as the growth of the process's resident set (`peak_rss_delta`). The first
and the last line give the load average (timings taken beside other work are not comparable).
Last line:

    throughput vs torch: eager R.RRx, sdpa R.RRx, compile R.RRx (engine E tok/s, MFU M%; load average now L1 L5 L15)

FLOPs per trained token = 6 × (matmul parameters: every weight matrix except the
embedding, whose forward is a gather) + 12 × n_layers × T × n_heads × head_dim (scores
and weighted sum, forward 2×, backward 4×, over the full T×T square the composed
attention computes; the same count for every baseline).

Threads: ``--threads N`` sets the engine's threads (``cpu_threads.set_blas_threads``: its
matmuls and row blocks are split over them, the BLAS single-threaded inside: MKL when
installed, else OpenBLAS, runtime/blas.py), NumPy's OpenBLAS for the sgemm peak, and torch's;
default: the CPU count.
"""

from __future__ import annotations

import ctypes
import gc
import math
import os
import time

import numpy as np

from xtrain_lessons.measure.torch_twin import KINDS, BaselineUnavailable, torch_stepper
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.runtime import blas, cpu_threads
from xtrain_lessons.runtime.allocator import keep_freed_memory
from xtrain_lessons.runtime.cpu_threads import blas_threads, set_blas_threads
from xtrain_lessons.training.optim import AdamW, clip_grad_norm

# ----- measurements ----------------------------------------------------------------------

def sgemm_peak(n: int = 1536, reps: int = 5) -> float:
    """FLOP/s of the best of `reps` float32 (n×n)·(n×n) products (2n³ FLOPs each), the better
    of NumPy's np.matmul and the engine's own (`cpu_threads.matmul`: MKL when installed,
    runtime/blas.py): the fastest matmul this machine offers the engine."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    best = math.inf
    for product in (np.matmul, cpu_threads.matmul):
        product(a, b)  # warm-up
        for _ in range(reps):
            t0 = time.perf_counter()
            product(a, b)
            best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


def train_flops_per_token(config, seq_len: int) -> float:
    """Model FLOPs of one trained token (see the module docstring)."""
    c = config
    d, hd = c.dim, c.head_dim
    attn_w = d * c.n_heads * hd + 2 * d * c.n_kv_heads * hd + c.n_heads * hd * d
    mlp_w = 3 * d * c.ffn_dim
    matmul_params = c.n_layers * (attn_w + mlp_w) + c.vocab_size * d  # + lm_head
    return 6.0 * matmul_params + 12.0 * c.n_layers * seq_len * c.n_heads * hd


def _batches(vocab: int, batch: int, seq: int, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, size=(batch, seq + 1), dtype=np.int64) for _ in range(n)]


def engine_stepper(config, seed: int = 0):
    """(step(batch) -> (loss, seconds), initial state_dict) for the engine: one full training
    step (forward, backward, clip, AdamW) on a (B, T+1) token batch."""
    model = Model(config, seed=seed)
    params = model.named_parameters()
    opt = AdamW(params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)

    def step(b):
        t0 = time.perf_counter()
        loss = model.loss(b[:, :-1], b[:, 1:])
        model.zero_grad()
        loss.backward()
        clip_grad_norm(params, 1.0)
        opt.step()
        return float(loss.item()), time.perf_counter() - t0

    return step, model.state_dict()


def _rss_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status")


def peak_rss_delta(fn) -> float | None:
    """Bytes by which the process's resident set grew at its highest during `fn()`, over what
    it was before (Linux: free heap handed back with malloc_trim, the high-water mark reset
    through /proc/self/clear_refs). None where the kernel does not offer that."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # glibc: freed blocks back to the OS first
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM to the current RSS
        before = _rss_kib("VmRSS")
        fn()
        return 1024.0 * (_rss_kib("VmHWM") - before)
    except OSError:
        return None


def parse_against(text: str) -> list[str] | None:
    """`--against eager,sdpa,compile` -> the list; None (with a message) for unknown names."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    bad = [n for n in names if n not in KINDS]
    if bad or not names:
        print(f"xtrain bench: unknown baseline {', '.join(bad) or repr(text)} in --against; "
              f"choose from {','.join(KINDS)}")
        return None
    return list(dict.fromkeys(names))


def _baselines(config, init, threads, against) -> dict:
    """name -> torch step function, or {} (with a message) when torch is not installed."""
    if not against:
        return {}
    try:
        import torch  # noqa: F401,PLC0415
    except ImportError:
        print("torch is not installed, so there is nothing to compare against "
              "(pip install torch --index-url https://download.pytorch.org/whl/cpu)")
        return {}
    steppers = {}
    for kind in against:
        try:
            steppers[kind] = torch_stepper(config, init, threads, kind)[0]
        except BaselineUnavailable as e:  # a GPU baseline named on the CPU: one line, the others go on
            print(f"torch {kind}: not measured: {e}")
    return steppers


def _timed_rounds(steppers: dict, batches: list, rounds: int, steps: int) -> dict:
    """name -> the step times of `rounds` rounds of one block per stepper (1 untimed step, then
    `steps` timed). Blocks, not single steps: one step of each in turn would charge each
    engine for the other's threads, which keep spinning on the cores for a while after a step
    (OpenBLAS's and OpenMP's workers wait for more work); rounds spread slow changes of load
    over all of them."""
    times = {name: [] for name in steppers}
    for r in range(rounds):
        block = batches[r * (steps + 1):(r + 1) * (steps + 1)]
        for name, step in steppers.items():
            times[name] += [step(b)[1] for b in block][1:]
    return times


def _mib(n) -> str:
    return "n/a" if n is None else f"{n / 2 ** 20:.1f} MiB"


def run_train_bench(args) -> int:
    """`xtrain bench train`: the report described in the module docstring; `args` holds the
    options of cli/bench.py. Returns the exit code."""
    if args.preset not in PRESETS:
        print(f"xtrain bench: unknown preset {args.preset!r}; choose one of {sorted(PRESETS)}")
        return 2
    if args.steps < 1 or args.rounds < 1:
        print("xtrain bench: --steps and --rounds must be at least 1")
        return 2
    against = [] if args.no_torch else parse_against(args.against or "eager")
    if against is None:
        return 2
    base = PRESETS[args.preset]
    config = base.replace(vocab_size=args.vocab_size, max_seq_len=max(base.max_seq_len, args.seq_len))
    B, T = args.batch_size, args.seq_len
    tokens = B * T
    warm, *batches = _batches(config.vocab_size, B, T, 1 + args.rounds * (args.steps + 1))
    print(f"bench train: preset {args.preset} ({config.n_params() / 1e6:.2f}M params, vocab "
          f"{config.vocab_size}), batch {B} x {T} = {tokens} tokens/step, {args.rounds} rounds x "
          f"{args.steps} timed steps, {os.cpu_count()} CPUs, load average {_load_average()}")
    threads = args.threads or os.cpu_count() or 1
    set_blas_threads(threads)
    keep_freed_memory()  # as xtrain train does; the torch baselines in this process get it too
    print(f"threads: {threads} (NumPy BLAS reports {blas_threads()}; torch gets the same)")
    peak = sgemm_peak((args.peak_n or 1536))
    print(f"engine matmuls: {blas.name()}; sgemm peak (float32 {(args.peak_n or 1536)}^3, best of np.matmul and "
          f"the engine's): {peak / 1e9:.1f} GFLOP/s")
    fpt = train_flops_per_token(config, T)
    print(f"model FLOPs per trained token: {fpt / 1e6:.1f} MFLOP")

    engine, init = engine_stepper(config)
    steppers = {"engine": engine, **_baselines(config, init, threads, against)}
    first = {}
    for name, step in list(steppers.items()):  # same weights: same loss
        try:
            first[name] = step(warm)
        except Exception as e:  # noqa: BLE001 - a baseline that fails (torch.compile without a compiler): one line
            if name == "engine":
                raise
            print(f"torch {name}: not measured: {type(e).__name__}: {str(e).strip().splitlines()[0][:240]}")
            del steppers[name]
    against = [n for n in against if n in steppers]
    times = _timed_rounds(steppers, batches, args.rounds, args.steps)
    memory = {name: peak_rss_delta(lambda s=step: s(batches[-1])) for name, step in steppers.items()}
    peak = max(peak, sgemm_peak((args.peak_n or 1536)))  # the best seen, before or after
    tps = {name: tokens / float(np.median(t)) for name, t in times.items()}
    mfu = {name: t * fpt / peak for name, t in tps.items()}
    eloss = first["engine"][0]
    print(f"engine: {tokens / tps['engine'] * 1e3:.0f} ms/step (median), {tps['engine']:,.0f} tok/s, "
          f"{tps['engine'] * fpt / 1e9:.1f} GFLOP/s, MFU {100 * mfu['engine']:.1f}% of "
          f"{peak / 1e9:.1f} GFLOP/s, first loss {eloss:.4f}, step peak RSS +{_mib(memory['engine'])}")
    for name in [n for n in steppers if n != "engine"]:
        loss, warm_s = first[name]
        print(f"torch {name} ({threads} threads): {tokens / tps[name] * 1e3:.0f} ms/step, "
              f"{tps[name]:,.0f} tok/s, MFU {100 * mfu[name]:.1f}%, first loss {loss:.4f} "
              f"(|Δ| {abs(loss - eloss):.1e}), first step {warm_s:.1f} s"
              f"{' (compilation, excluded)' if name == 'compile' else ''}, "
              f"step peak RSS +{_mib(memory[name])}")
    if len(steppers) == 1:
        why = "torch not run" if args.no_torch else "no torch baseline ran"
        print(f"throughput vs torch: n/a (engine {tps['engine']:,.0f} tok/s, {why}, "
              f"MFU {100 * mfu['engine']:.1f}%)")
        return 0
    ratios = ", ".join(f"{n} {tps['engine'] / tps[n]:.2f}x" for n in against)
    print(f"throughput vs torch: {ratios} (engine {tps['engine']:,.0f} tok/s, "
          f"MFU {100 * mfu['engine']:.1f}%; load average now {_load_average()})")
    return 0


def _load_average() -> str:
    """The 1, 5 and 15-minute load averages ('n/a' where the OS has none): timings taken while
    something else runs are not worth comparing."""
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"
