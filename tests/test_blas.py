"""runtime/blas.py: MKL's sgemm when installed, NumPy's matmul otherwise (phase T07)."""

import os
import subprocess
import sys

import numpy as np
import pytest

from xtrain_lessons.runtime import blas, cpu_threads

needs_mkl = pytest.mark.skipif(not blas.mkl_loaded(), reason="MKL is not installed (pip install -e '.[fast]')")


def _randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("M,K,N", [(64, 48, 80), (1, 7, 3), (300, 192, 512), (5, 1, 9)])
@pytest.mark.parametrize("layout", ["nn", "tn", "nt", "tt"])
def test_gemm_is_the_product_for_every_layout(M, K, N, layout):
    a = _randn(K, M, seed=1).T if layout[0] == "t" else _randn(M, K, seed=1)
    b = _randn(N, K, seed=2).T if layout[1] == "t" else _randn(K, N, seed=2)
    out = np.empty((M, N), np.float32)
    assert blas.gemm(a, b, out) is out
    want = a.astype(np.float64) @ b.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5 * np.sqrt(K))


def test_gemm_into_row_slices_and_the_cases_mkl_does_not_take():
    a, b = _randn(40, 16, seed=3), _randn(16, 24, seed=4)
    out = np.zeros((50, 24), np.float32)
    blas.gemm(a[:30], b, out[5:35])
    np.testing.assert_allclose(out[5:35], a[:30] @ b, rtol=1e-5, atol=1e-5)
    assert not out[:5].any() and not out[35:].any()
    a64 = a.astype(np.float64)
    assert blas.gemm(a64, b.astype(np.float64), np.empty((40, 24))).dtype == np.float64
    strided = _randn(40, 32, seed=5)[:, ::2]  # no unit stride: NumPy's matmul
    np.testing.assert_allclose(blas.gemm(strided, b, np.empty((40, 24), np.float32)), strided @ b, rtol=1e-5)


def test_numpy_only_gives_numpys_bits():
    a, b = _randn(200, 192, seed=6), _randn(192, 64, seed=7)
    with blas.numpy_only():
        assert not blas.mkl_loaded()
        out = blas.gemm(a, b, np.empty((200, 64), np.float32))
    assert np.array_equal(out, a @ b)


@needs_mkl
def test_mkl_gives_the_same_bits_at_any_alignment_and_thread_count():
    a, b = _randn(2048, 192, seed=8), _randn(192, 512, seed=9)
    first = blas.gemm(a, b, np.empty((2048, 512), np.float32))
    big = np.empty(2048 * 192 + 16, np.float32)
    for offset in (1, 3, 8):  # the same numbers at other addresses: MKL must not change its path
        moved = big[offset:offset + a.size].reshape(a.shape)
        moved[...] = a
        assert np.array_equal(blas.gemm(moved, b, np.empty_like(first)), first)
    before = cpu_threads.get_threads()
    try:
        results = []
        for n in (1, 2, 3):  # 2048 rows: two chunks, whichever threads take them
            cpu_threads.set_threads(n)
            results.append(cpu_threads.matmul(a, b))
        assert all(np.array_equal(r, results[0]) for r in results[1:])
    finally:
        cpu_threads.set_threads(before)
    assert blas.name().startswith("MKL ")


def test_xtrain_blas_numpy_turns_mkl_off():
    code = "from xtrain_lessons.runtime import blas; print(blas.mkl_loaded(), blas.name())"
    env = {**os.environ, "XTRAIN_BLAS": "numpy"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True).stdout
    assert out.startswith("False NumPy")


@needs_mkl
@pytest.mark.skipif((os.cpu_count() or 1) < 2 or "OMP_NUM_THREADS" in os.environ or "MKL_NUM_THREADS" in os.environ,
                    reason="needs 2 cores and no thread-count variables")
def test_one_thread_per_call_leaves_the_process_setting_alone():
    """torch's own MKL shares MKL's thread settings with ours: the sequential layer, or a global
    MKL_Set_Num_Threads(1), would make torch's matmuls single-threaded (runtime/blas.py)."""
    lib = blas._mkl()
    a, b = _randn(300, 64, seed=10), _randn(64, 32, seed=11)
    blas.gemm(a, b, np.empty((300, 32), np.float32))
    assert lib.MKL_Get_Max_Threads() >= 2
