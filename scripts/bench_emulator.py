"""Benchmark the CUDA CPU emulator: compile times and kernel run times, printed as a table.

    python scripts/bench_emulator.py             # also compares fibers, ucontext and threads
    python scripts/bench_emulator.py --quick     # skip the slow threads mode

Compile times are measured in a fresh temporary cache; run times are the best of a few runs
(wall clock, or the process's CPU time with --cpu-time: steadier on a loaded machine; use it
with XTRAIN_EMULATOR_WORKERS=1). The load average is printed with the table: compare numbers
only between runs on an idle machine, or alternate the versions you compare within one run.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
TEST_KERNELS = ROOT / "tests" / "cuda_kernels"


CLOCK = time.perf_counter

NAIVE_MATMUL = r'''
extern "C" __global__ void matmul_naive(const float* A, const float* B, float* C, int M, int N, int K) {
    int row = blockIdx.y * blockDim.y + threadIdx.y, col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row < M && col < N) {
        float acc = 0.0f;
        for (int k = 0; k < K; k++) acc += A[row * K + k] * B[k * N + col];
        C[row * N + col] = acc;
    }
}
'''


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = CLOCK()
        fn()
        times.append(CLOCK() - t0)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="skip threads mode")
    parser.add_argument("--cpu-time", action="store_true", help="time with the process's CPU time, not the wall clock")
    args = parser.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.cpu_time else time.perf_counter

    tmp = tempfile.mkdtemp(prefix="xtrain-bench-")
    os.environ["XTRAIN_CACHE_DIR"] = tmp
    from xtrain_lessons.runtime.cuda import Kernel
    from xtrain_lessons.runtime.cuda import emulator

    rows: list[tuple[str, str, float]] = []
    try:
        t0 = time.perf_counter()
        emulator.runtime_library()
        rows.append(("compile emulator runtime (once per machine)", "-", time.perf_counter() - t0))
        t0 = time.perf_counter()
        add = Kernel(ROOT / "xtrain_lessons" / "kernels" / "vector_add.cu", "vector_add", backend="cpu")
        rows.append(("first compile: vector_add.cu", "-", time.perf_counter() - t0))
        t0 = time.perf_counter()
        mm = Kernel(TEST_KERNELS / "matmul_tiled.cu", "matmul_tiled", backend="cpu")
        rows.append(("first compile: matmul_tiled.cu", "-", time.perf_counter() - t0))
        sm = Kernel(TEST_KERNELS / "softmax_warp.cu", "softmax_rows", backend="cpu")
        naive = Kernel(NAIVE_MATMUL, "matmul_naive", backend="cpu")
        red = Kernel(TEST_KERNELS / "shared_memory.cu", "block_sum", backend="cpu")
        mm_san = Kernel(TEST_KERNELS / "matmul_tiled.cu", "matmul_tiled", backend="cpu", sanitize=True)
        red_san = Kernel(TEST_KERNELS / "shared_memory.cu", "block_sum", backend="cpu", sanitize=True)
        emulator._libs.clear()  # forget the loaded libraries: measure hash + cache lookup + dlopen
        t0 = time.perf_counter()
        Kernel(TEST_KERNELS / "matmul_tiled.cu", "matmul_tiled", backend="cpu")
        rows.append(("cached load: matmul_tiled.cu", "-", time.perf_counter() - t0))

        rng = np.random.default_rng(0)
        n = 1 << 20
        a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
        c = np.empty_like(a)
        M = N = K = 256
        A, B = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
        C = np.empty((M, N), np.float32)
        R, L = 512, 1024
        X = rng.standard_normal((R, L), dtype=np.float32)
        Y = np.empty_like(X)

        os.environ["XTRAIN_EMULATOR_MODE"] = "fibers"
        rows.append(("vector_add 2^20 (fast path: no barriers)", "fibers", best_of(
            lambda: add(((n + 255) // 256,), (256,), (a, b, c, np.int32(n))))))
        mm_args = (A, B, C, np.int32(M), np.int32(N), np.int32(K))
        sums = np.empty(n // 256, np.float32)
        t_tiled = best_of(lambda: mm((N // 16, M // 16), (16, 16), mm_args))
        rows.append(("tiled matmul 256^3, 16x16 tiles (2 barriers a tile)", "fibers", t_tiled))
        rows.append(("naive matmul 256^3 (fast path: no barriers)", "fibers", best_of(
            lambda: naive((N // 16, M // 16), (16, 16), mm_args))))
        t_red = best_of(lambda: red((n // 256,), (256,), (a, sums, np.int32(n))))
        rows.append(("shared-memory block sum 2^20, block 256 (9 barriers)", "fibers", t_red))
        t = best_of(lambda: mm_san((N // 16, M // 16), (16, 16), mm_args))
        rows.append((f"  the tiled matmul, sanitized ({t / t_tiled:.1f}x)", "fibers", t))
        t = best_of(lambda: red_san((n // 256,), (256,), (a, sums, np.int32(n))))
        rows.append((f"  the block sum, sanitized ({t / t_red:.1f}x)", "fibers", t))
        rows.append(("softmax 512x1024, block 256, warp shuffles", "fibers", best_of(
            lambda: sm((R,), (256,), (X, Y, np.int32(R), np.int32(L))))))

        # The three ways of running a block's threads, on smaller problems (threads mode is slow).
        m = 64
        a64, b64, c64 = A[:m, :m].copy(), B[:m, :m].copy(), np.empty((m, m), np.float32)
        modes = ["fibers", "ucontext"] if args.quick else ["fibers", "ucontext", "threads"]
        for label, launch in [
            ("tiled matmul 64^3",
             lambda: mm((m // 16, m // 16), (16, 16), (a64, b64, c64, np.int32(m), np.int32(m), np.int32(m)))),
            ("softmax 32x1024, block 256", lambda: sm((32,), (256,), (X, Y, np.int32(32), np.int32(L))))]:
            base = None
            for mode in modes:
                os.environ["XTRAIN_EMULATOR_MODE"] = mode
                t = best_of(launch, repeat=3 if mode != "threads" else 1)
                base = base or t
                rows.append((f"{label}" + ("" if mode == "fibers" else f" ({t / base:.0f}x fibers)"), mode, t))
        os.environ.pop("XTRAIN_EMULATOR_MODE")
        rows.append(("numpy: a + b, 2^20", "numpy", best_of(lambda: np.add(a, b, out=c))))
        rows.append(("numpy: A @ B, 256^3", "numpy", best_of(lambda: np.matmul(A, B, out=C))))
        assert np.allclose(C, A @ B, atol=1e-3)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    width = max(len(r[0]) for r in rows)
    print(f"{'what':<{width}}  {'mode':<8}  {'time':>10}")
    print("-" * (width + 22))
    for what, mode, t in rows:
        print(f"{what:<{width}}  {mode:<8}  {t * 1e3:>8.1f} ms")
    print(f"\n{os.cpu_count()} cores; emulator workers: {emulator.emulator_workers()} "
          f"(sanitized kernels: 1); clock: {'CPU time' if args.cpu_time else 'wall'}; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
