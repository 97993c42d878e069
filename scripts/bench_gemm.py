"""Benchmark the hand GEMM kernels (xtrain_lessons/runtime/kernels/gemm.cu) against BLAS / cuBLAS.

    python scripts/bench_gemm.py                      # n = 64 128 256, all versions, default tiles
    python scripts/bench_gemm.py --sizes 512 1024     # bigger (use a GPU: the emulator is slow)
    python scripts/bench_gemm.py --device cuda        # CuPy arrays: real kernels and cuBLAS

Prints, per square size n, the best time of a few runs and GFLOP/s (2n³ / time) for versions
1-3 and for the library matmul, and checks each result against the float64 reference with the
bound `gemm_tolerance` (so a fast wrong kernel cannot win). On the CPU the kernels run on the
emulator: their speed measures the emulator (fiber switches at barriers), not a GPU.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def best_time(fn, sync, min_runs: int = 3, budget: float = 0.5, max_runs: int = 100) -> float:
    fn()  # warm up: compiles the kernel variant the first time
    best, total, runs = float("inf"), 0.0, 0
    while runs < min_runs or (total < budget and runs < max_runs):
        t0 = time.perf_counter()
        fn()
        sync()
        dt = time.perf_counter() - t0
        best, total, runs = min(best, dt), total + dt, runs + 1
    return best


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--versions", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    args = parser.parse_args()

    from xtrain_lessons.runtime import device
    from xtrain_lessons.runtime.kernels.gemm import flops, gemm, gemm_reference, gemm_tolerance

    device.set_device(args.device)
    xp = device.get_xp()
    lib = "cuBLAS" if xp is not np else "BLAS"
    print(f"{device.describe()}; GFLOP/s (best of several runs), ok = within the float32 bound")
    print(f"{'n':>6} {'kernel':>10} {'time':>12} {'GFLOP/s':>10} {'ok':>5}")
    failed = 0
    for n in args.sizes:
        rng = np.random.default_rng(n)
        a = rng.standard_normal((n, n)).astype(np.float32)
        b = rng.standard_normal((n, n)).astype(np.float32)
        ref, tol = gemm_reference(a, b), gemm_tolerance(a, b)
        da, db = device.to_device(a), device.to_device(b)
        runs = [(f"v{v}", (lambda v=v: gemm(da, db, version=v))) for v in args.versions]
        runs.append((lib, lambda: da @ db))
        for name, fn in runs:
            seconds = best_time(fn, device.synchronize)
            ok = bool(np.all(np.abs(device.to_host(fn()).astype(np.float64) - ref) <= tol))
            failed += not ok
            print(f"{n:6d} {name:>10} {seconds * 1e3:10.3f} ms {flops(n, n, n) / seconds / 1e9:10.3f} {str(ok):>5}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
