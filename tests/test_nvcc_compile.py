"""Every kernel is real CUDA: nvcc compiles each .cu file to PTX (skipped without nvcc).

This keeps g++-only constructs out of the kernels the CPU emulator runs. GPU tests (marked
`gpu`, skipped without a GPU) run the same kernels through CuPy against NumPy.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCES = [*sorted((ROOT / "xtrain_lessons" / "runtime" / "kernels").glob("*.cu")),
           *sorted((ROOT / "tests" / "cuda_kernels").glob("*.cu"))]
NVCC = shutil.which("nvcc") or ("/usr/local/bin/nvcc" if Path("/usr/local/bin/nvcc").exists() else None)


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_nvcc_compiles(source, tmp_path):
    res = subprocess.run([NVCC, "--ptx", "-arch=sm_80", str(source), "-o", str(tmp_path / "out.ptx")],
                         capture_output=True, text=True)
    assert res.returncode == 0, f"nvcc rejected {source.name}:\n{res.stderr}"
    ptx = (tmp_path / "out.ptx").read_text()
    assert ".entry" in ptx


def _gpu() -> bool:
    from xtrain_lessons.runtime.device import gpu_available
    return gpu_available()


gpu = pytest.mark.skipif(not _gpu(), reason="needs CuPy and an NVIDIA GPU")


@pytest.mark.gpu
@gpu
def test_vector_add_on_gpu():
    import cupy as cp
    from xtrain_lessons.runtime.kernels.vector_add import vector_add, vector_add_reference
    a = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    b = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    c = vector_add(cp.asarray(a), cp.asarray(b))
    np.testing.assert_array_equal(cp.asnumpy(c), vector_add_reference(a, b))


@pytest.mark.gpu
@gpu
def test_test_kernels_on_gpu():
    import cupy as cp
    from xtrain_lessons.runtime.cuda import Kernel
    kdir = ROOT / "tests" / "cuda_kernels"
    M, K, N = 37, 53, 29
    rng = np.random.default_rng(0)
    A, B = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    C = cp.zeros((M, N), cp.float32)
    Kernel(kdir / "matmul_tiled.cu", "matmul_tiled", backend="gpu")(
        ((N + 15) // 16, (M + 15) // 16), (16, 16),
        (cp.asarray(A), cp.asarray(B), C, np.int32(M), np.int32(N), np.int32(K)))
    np.testing.assert_allclose(cp.asnumpy(C), A @ B, rtol=1e-4, atol=1e-4)

    x = rng.standard_normal((7, 1000), dtype=np.float32)
    y = cp.zeros_like(cp.asarray(x))
    softmax = Kernel(kdir / "softmax_warp.cu", "softmax_rows", backend="gpu")
    softmax((7,), (128,), (cp.asarray(x), y, np.int32(7), np.int32(1000)))
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(cp.asnumpy(y), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)

    values = rng.integers(0, 37, 10000).astype(np.int32)
    counts = cp.zeros(37, cp.int32)
    histogram = Kernel(kdir / "atomics.cu", "histogram", backend="gpu")
    histogram((40,), (256,), (cp.asarray(values), counts, np.int32(10000)))
    np.testing.assert_array_equal(cp.asnumpy(counts), np.bincount(values, minlength=37))


@pytest.mark.gpu
@gpu
def test_warp_ops_bf16_and_dynamic_shared_on_gpu():
    """The kernels whose CPU results test_cuda_emulator checks give the same results on a GPU."""
    import cupy as cp
    import ml_dtypes
    from xtrain_lessons.runtime.cuda import Kernel
    kdir = ROOT / "tests" / "cuda_kernels"
    k = lambda f, n: (Kernel(kdir / f, n, backend="cpu"), Kernel(kdir / f, n, backend="gpu"))  # noqa: E731

    cpu, gpu_k = k("warp_ops.cu", "warp_ops")
    x = np.random.default_rng(2).integers(-20, 100, 64).astype(np.int32)
    out_cpu, out_gpu = np.zeros(8 * 64, np.int32), cp.zeros(8 * 64, cp.int32)
    cpu((1,), (64,), (x, out_cpu, np.int32(64)))
    gpu_k((1,), (64,), (cp.asarray(x), out_gpu, np.int32(64)))
    np.testing.assert_array_equal(cp.asnumpy(out_gpu), out_cpu)

    cpu, gpu_k = k("bf16.cu", "to_bf16")
    v = np.random.default_rng(3).integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    y = cp.zeros(v.size, cp.uint16)
    gpu_k(((v.size + 255) // 256,), (256,), (cp.asarray(v), y, np.int32(v.size)))
    ok = ~np.isnan(v)
    with np.errstate(invalid="ignore"):
        ref = v.astype(ml_dtypes.bfloat16).view(np.uint16)
    np.testing.assert_array_equal(cp.asnumpy(y)[ok], ref[ok])

    cpu, gpu_k = k("shared_memory.cu", "reverse_blocks")
    n, block = 1000, 128
    xs = np.arange(n, dtype=np.float32)
    y_cpu, y_gpu = np.zeros(n, np.float32), cp.zeros(n, cp.float32)
    cpu((8,), (block,), (xs, y_cpu, np.int32(n)), shared_mem=block * 4)
    gpu_k((8,), (block,), (cp.asarray(xs), y_gpu, np.int32(n)), shared_mem=block * 4)
    np.testing.assert_array_equal(cp.asnumpy(y_gpu), y_cpu)
