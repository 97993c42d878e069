"""The emulator's sanitizer: each planted bug is reported with where it happened, and every
correct kernel of the package runs through it silently with unchanged results."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import xtrain_lessons.runtime.cuda as cuda
from xtrain_lessons.runtime.cuda import Kernel, KernelError

KDIR = Path(__file__).resolve().parent / "cuda_kernels"
BUGS = r'''
extern "C" __global__ void oob_read(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + x[i + 1];   // BUG: x[n] for the last thread
}
extern "C" __global__ void oob_write(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) y[i] = 2.0f * x[i < n ? i : 0];   // BUG: <= writes y[n]
}
extern "C" __global__ void shared_oob(const float* x, float* y, int n) {
    __shared__ float s[64];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    s[threadIdx.x] = i < n ? x[i] : 0.0f;           // BUG: the block has 65 threads
    __syncthreads();
    if (i < n) y[i] = s[threadIdx.x];
}
extern "C" __global__ void pair_race(const float* x, float* y, int n) {
    __shared__ float s[128];
    int t = threadIdx.x, i = blockIdx.x * blockDim.x + t;
    s[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    s[t] += s[t ^ 1];                               // BUG: reads what the partner writes
    if (i < n) y[i] = s[t];
}
'''


def run(name, n=1000, block=128, sanitize=True):
    x = np.arange(n, dtype=np.float32)
    y = np.zeros(n, np.float32)
    Kernel(BUGS, name, backend="cpu", sanitize=sanitize)(((n + block - 1) // block,), (block,), (x, y, np.int32(n)))
    return y


def test_out_of_bounds_read_names_parameter_index_size_block_thread():
    with pytest.raises(KernelError) as e:
        run("oob_read")
    msg = str(e.value)
    assert "out-of-bounds global read of x[1000]" in msg and "'x'" in msg and "1000 elements" in msg
    assert "block (7,0,0)" in msg and "thread (103,0,0)" in msg and "oob_read" in msg


def test_out_of_bounds_write():
    with pytest.raises(KernelError, match=r"out-of-bounds global write of y\[1000\].*has 1000 elements"):
        run("oob_write")


def test_without_sanitizer_the_bugs_pass_silently():
    """What the sanitizer is for: the normal mode does not see these bugs."""
    y = run("oob_write", sanitize=False)
    np.testing.assert_array_equal(y, 2 * np.arange(1000, dtype=np.float32))


def test_shared_out_of_bounds():
    expected = r"out-of-bounds shared-memory access: s\[64\].*64 elements.*thread \(64,0,0\)"
    with pytest.raises(KernelError, match=expected):
        run("shared_oob", block=65)


def test_uninitialised_shared_read():
    k = Kernel(KDIR / "shared_memory.cu", "read_uninitialized", backend="cpu", sanitize=True)
    with pytest.raises(KernelError, match=r"shared memory never written: s\[0\].*thread \(0,0,0\)"):
        k((1,), (64,), (np.zeros(128, np.float32),), shared_mem=256)


def test_shared_memory_race_between_barriers():
    with pytest.raises(KernelError) as e:
        run("pair_race")
    msg = str(e.value)
    assert "shared-memory race on s[0]" in msg and "thread (0,0,0) wrote it" in msg
    assert "thread (1,0,0) now reads it" in msg and "__syncthreads() (on line 21)" in msg


def test_missing_barrier_is_reported():
    k = Kernel(KDIR / "shared_memory.cu", "block_sum_missing_sync", backend="cpu", sanitize=True)
    with pytest.raises(KernelError, match="shared memory never written"):
        k((4,), (256,), (np.ones(1000, np.float32), np.zeros(4, np.float32), np.int32(1000)))


def test_environment_variable_turns_it_on(monkeypatch):
    monkeypatch.setenv("XTRAIN_SANITIZE", "1")
    assert Kernel(BUGS, "oob_read", backend="cpu").sanitize
    with pytest.raises(KernelError, match="out-of-bounds global read"):
        run("oob_read", sanitize=None)


# ---------------------------------------------------------------- silent on correct kernels
@pytest.fixture
def sanitized(monkeypatch):
    """Every load_kernel in the test compiles in sanitizer mode."""
    monkeypatch.setenv("XTRAIN_SANITIZE", "1")
    yield
    cuda._loaded.clear()


def test_test_kernels_are_clean(sanitized):
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1000).astype(np.float32)
    sums = np.zeros(8, np.float32)
    Kernel(KDIR / "shared_memory.cu", "block_sum", backend="cpu")((4,), (256,), (x, sums, np.int32(1000)))
    np.testing.assert_allclose(sums[:4], [x[i * 256:(i + 1) * 256].sum() for i in range(4)], rtol=1e-5, atol=1e-5)
    y = np.zeros(1000, np.float32)
    Kernel(KDIR / "shared_memory.cu", "reverse_blocks", backend="cpu")((8,), (128,), (x, y, np.int32(1000)),
                                                                       shared_mem=512)
    Kernel(KDIR / "shared_memory.cu", "pair_sum_early_return", backend="cpu")((8,), (128,), (x, y, np.int32(999)))
    M, K, N = 37, 53, 29
    A, B = rng.standard_normal((M, K), dtype=np.float32), rng.standard_normal((K, N), dtype=np.float32)
    C = np.zeros((M, N), np.float32)
    Kernel(KDIR / "matmul_tiled.cu", "matmul_tiled", backend="cpu")(
        ((N + 15) // 16, (M + 15) // 16), (16, 16), (A, B, C, np.int32(M), np.int32(N), np.int32(K)))
    np.testing.assert_allclose(C, A @ B, rtol=1e-4, atol=1e-4)
    xs = rng.standard_normal((7, 1000), dtype=np.float32)
    ys = np.zeros_like(xs)
    Kernel(KDIR / "softmax_warp.cu", "softmax_rows", backend="cpu")((7,), (128,), (xs, ys, np.int32(7), np.int32(1000)))
    e = np.exp(xs - xs.max(axis=1, keepdims=True))
    np.testing.assert_allclose(ys, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_package_kernels_are_clean(sanitized):
    from xtrain_lessons.runtime.kernels import (
        adamw,
        bf16,
        elementwise,
        embedding,
        flash_attention,
        gemm,
        philox,
        transpose,
        vector_add,
    )
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((37, 45), dtype=np.float32), rng.standard_normal((45, 29), dtype=np.float32)
    for version in sorted(gemm.DEFAULTS):
        np.testing.assert_allclose(gemm.gemm(a, b, version=version), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(transpose.transpose(a), a.T)
    np.testing.assert_array_equal(transpose.transpose(a, tiled=False), a.T)
    v = rng.standard_normal(1001).astype(np.float32)
    np.testing.assert_array_equal(vector_add.vector_add(v, v), v + v)
    c = rng.standard_normal((1, 45), dtype=np.float32)
    np.testing.assert_array_equal(elementwise.binary_op(a, c), a + c)
    ids = rng.integers(0, 37, 50).astype(np.int32)
    np.testing.assert_array_equal(embedding.embedding_forward(ids, a), a[ids])
    dout = rng.standard_normal((50, 45), dtype=np.float32)
    np.testing.assert_allclose(embedding.embedding_backward(ids, dout, 37),
                               embedding.embedding_backward_reference(ids, dout, 37), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(bf16.bf16_to_f32(bf16.f32_to_bf16(v)), bf16.bf16_to_f32_reference(
        bf16.f32_to_bf16_reference(v)))
    np.testing.assert_array_equal(philox.philox_bits(7, 3, 1001), philox.philox_bits_reference(7, 3, 1001))
    p, g = v.copy(), rng.standard_normal(1001).astype(np.float32)
    m, s = np.zeros_like(p), np.zeros_like(p)
    adamw.adamw_flat(p, g, m, s, step=1, lr=1e-2)
    assert np.isfinite(p).all() and not np.array_equal(p, v)
    q = rng.standard_normal((1, 37, 2, 16), dtype=np.float32)
    k = rng.standard_normal((1, 37, 1, 16), dtype=np.float32)
    vv = rng.standard_normal((1, 37, 1, 16), dtype=np.float32)
    out, lse = flash_attention.flash_attention_fwd_cuda(q, k, vv)
    ref_out, ref_lse = flash_attention.flash_attention_fwd_reference(q, k, vv)
    np.testing.assert_allclose(out, ref_out, rtol=1e-4, atol=1e-5)
    grads = flash_attention.flash_attention_bwd_cuda(q, k, vv, out, lse, np.ones_like(out))
    refs = flash_attention.flash_attention_bwd_reference(q, k, vv, out, lse, np.ones_like(out))
    for got, ref in zip(grads, refs):
        np.testing.assert_allclose(got, ref, rtol=1e-3, atol=1e-4)


def test_real_world_kernels_are_clean():
    """Cooperative groups, a template kernel's shared array, __constant__ memory: no report."""
    from xtrain_lessons.runtime.cuda import Module
    mod = Module(KDIR / "real_world.cu", name_expressions=["block_sum_t<double, 64>"], backend="cpu", sanitize=True)
    x = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    ws, wm, bs = np.zeros(33, np.float32), np.zeros(33, np.float32), np.zeros(11, np.float32)
    mod.get_function("cg_warp_reduce")((11,), (96,), (x, ws, wm, bs, np.int32(1000)))
    np.testing.assert_allclose(bs.sum(), x.sum(), rtol=1e-4)
    xd, out = x.astype(np.float64), np.zeros(16, np.float64)
    mod.get_function("block_sum_t<double, 64>")((16,), (64,), (xd, out, np.int32(1000)))
    np.testing.assert_allclose(out.sum(), xd.sum(), rtol=1e-12)
    mod.set_global("poly", np.array([1, 2, 3, 4], np.float32))
    y = np.zeros(1000, np.float32)
    mod.get_function("horner")((4,), (256,), (x, y, np.int32(1000)))
    np.testing.assert_allclose(y, 1 + x * (2 + x * (3 + 4 * x)), rtol=1e-5, atol=1e-5)


WARP_SUM = r'''
extern "C" __global__ void warp_tail_sum(const float* x, float* out, int n) {
    __shared__ float s[64];
    int t = threadIdx.x, i = blockIdx.x * 64 + t;
    s[t] = i < n ? x[i] : 0.0f;
    __syncthreads();
    if (t < 32) s[t] += s[t + 32];
    __syncthreads();
    if (t < 32) {
        for (int off = 16; off > 0; off >>= 1) {
            float other = t + off < 32 ? s[t + off] : 0.0f;
            SYNC_WARP;
            s[t] += other;
            SYNC_WARP;
        }
    }
    if (t == 0) out[blockIdx.x] = s[0];
}
'''


@pytest.mark.parametrize("sync, race", [("__syncwarp()", False), ("(void)0", True)])
def test_lanes_that_meet_at_syncwarp_do_not_race(sync, race):
    """A warp's lanes may share memory across __syncwarp() without a block barrier; without it,
    lane 0 runs its whole loop first (the emulator runs a warp's lanes one after another), so
    lane 1 then writes s[1], which lane 0 has read."""
    k = Kernel(WARP_SUM, "warp_tail_sum", options=(f"-DSYNC_WARP={sync}",), backend="cpu", sanitize=True)
    x = np.random.default_rng(3).standard_normal(200).astype(np.float32)
    out = np.zeros(4, np.float32)
    if race:
        expected = r"race on s\[1\].*thread \(0,0,0\) read it and thread \(1,0,0\) now writes it.*__syncwarp\(\) is enough"
        with pytest.raises(KernelError, match=expected):
            k((4,), (64,), (x, out, np.int32(200)))
        return
    k((4,), (64,), (x, out, np.int32(200)))
    padded = np.zeros(256, np.float32)
    padded[:200] = x
    np.testing.assert_allclose(out, padded.reshape(4, 64).sum(axis=1), rtol=1e-5, atol=1e-5)


def test_an_array_passed_twice_is_one_array():
    """In place (x passed as both input and output): the sanitized copies alias like the memory."""
    src = r'''extern "C" __global__ void axpy_into(const float* x, float* y, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = 2.0f * x[i] + y[i];
    }'''
    x = np.arange(300, dtype=np.float32)
    Kernel(src, "axpy_into", backend="cpu", sanitize=True)((3,), (128,), (x, x, np.int32(300)))
    np.testing.assert_array_equal(x, 3 * np.arange(300, dtype=np.float32))
