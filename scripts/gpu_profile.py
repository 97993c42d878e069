"""Where a GPU training step's time goes: the engine's step (bench_gpu.engine_stepper_gpu) under
torch.profiler, whose CUPTI tracing sees every kernel in the process, CuPy's and cuBLAS's included.

    python scripts/gpu_profile.py --preset 20m --dtype bf16 [--batch-size 32 --seq-len 512 --vocab-size 8192]

Prints, per step: the wall time (steps issued back to back, as in training), the host's time to issue
one step into an idle device, the GPU's busy time (the kernels' total), the kernels grouped by name,
largest first, the CUDA runtime calls the host made (a synchronising one -- cudaStreamSynchronize,
cudaMemcpy, cudaFree -- shows up here), and with --python the Python functions the host's time went
to (cProfile). A step whose busy time is well under its wall time is bound by the launches.
Needs a GPU, CuPy and torch with CUDA.
"""

from __future__ import annotations

import argparse
import collections
import time


from xtrain_lessons.measure.bench import _batches
from xtrain_lessons.measure.bench_gpu import engine_stepper_gpu
from xtrain_lessons.model.qwen3 import PRESETS
from xtrain_lessons.runtime import device


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="20m")
    ap.add_argument("--dtype", default="bf16")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seq-len", type=int, default=512)
    ap.add_argument("--vocab-size", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--top", type=int, default=18)
    ap.add_argument("--python", action="store_true", help="also profile the host's Python (cProfile)")
    args = ap.parse_args(argv)
    import torch  # noqa: PLC0415
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    device.set_device("cuda")
    base = PRESETS[args.preset]
    config = base.replace(vocab_size=args.vocab_size, max_seq_len=max(base.max_seq_len, args.seq_len))
    batches = _batches(config.vocab_size, args.batch_size, args.seq_len, 3 + 2 * args.steps)
    step, _ = engine_stepper_gpu(config, args.dtype)
    for b in batches[:2]:
        step(b)
    device.synchronize()
    host = step(batches[2])[1]  # issued into an idle device
    device.synchronize()
    t0 = time.perf_counter()
    for b in batches[3:3 + args.steps]:
        step(b)
    device.synchronize()
    wall = (time.perf_counter() - t0) / args.steps
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for b in batches[3 + args.steps:]:
            step(b)
        device.synchronize()
    kernels, counts = collections.Counter(), collections.Counter()
    api, api_counts = collections.Counter(), collections.Counter()
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name[:90]
            kernels[name] += e.device_time
            counts[name] += 1
        elif e.name.startswith("cuda") or e.name.startswith("cu"):
            api[e.name] += e.cpu_time_total
            api_counts[e.name] += 1
    busy = sum(kernels.values()) / 1e3 / args.steps
    print(f"{args.preset} {args.dtype} {args.batch_size} x {args.seq_len}: wall {wall * 1e3:.1f} ms/step, host "
          f"{host * 1e3:.1f} ms to issue one, GPU busy {busy:.1f} ms/step, {sum(counts.values()) // args.steps} "
          f"kernels/step")
    for name, us in kernels.most_common(args.top):
        print(f"  {us / 1e3 / args.steps:7.2f} ms  {counts[name] // args.steps:4d}x  {name}")
    print("CUDA runtime calls (host time per step):")
    for name, us in api.most_common(10):
        print(f"  {us / 1e3 / args.steps:7.2f} ms  {api_counts[name] / args.steps:6.1f}x  {name}")
    if args.python:
        python_profile(step, batches[3:3 + args.steps])
    return 0


def python_profile(step, batches) -> None:
    """The host's Python time over a few steps issued back to back (cProfile), by own time."""
    import cProfile  # noqa: PLC0415
    import pstats  # noqa: PLC0415

    pr = cProfile.Profile()
    pr.enable()
    for b in batches:
        step(b)
    device.synchronize()
    pr.disable()
    pstats.Stats(pr).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    raise SystemExit(main())
