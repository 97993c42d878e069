"""The stand-in's NumPy twins of the step's elementwise kernels (cupy_standin._elementwise_kernels):
under XTRAIN_STANDIN_KERNELS=reference the end-to-end runs (every learner notebook and command on
the cuda path) use them instead of the emulator. Each must give what the emulated CUDA kernel gives
on the same inputs, and a kernel that only shares a name with one of them (a learner's) must still
run on the emulator.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from xtrain_lessons import cupy_standin
from xtrain_lessons.runtime.kernels import adamw, residual, rmsnorm, rope, swiglu

F32, BF16 = np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)
RTOL = {F32: 4 * 2.0 ** -24, BF16: 2.0 ** -8}  # a few float32 roundings; one bf16 rounding apart


@pytest.fixture
def cp():
    with cupy_standin.installed() as module:
        yield module


def both(monkeypatch, run):
    """run() on the emulated kernels, then on the references (where no kernel may reach the
    emulator): the two results, as NumPy arrays."""
    from xtrain_lessons.runtime.cuda.emulator import CpuKernel  # noqa: PLC0415

    emulated = []
    launch = CpuKernel.__call__
    monkeypatch.setattr(CpuKernel, "__call__", lambda self, *a, **kw: (emulated.append(self.name),
                                                                        launch(self, *a, **kw))[1])
    out = []
    for mode in ("", "reference"):
        emulated.clear()
        monkeypatch.setenv("XTRAIN_STANDIN_KERNELS", mode)
        out.append([np.asarray(a.get()).astype(np.float64) for a in run()])
        assert emulated if mode == "" else not emulated, (mode, emulated)
    return out


def assert_same(emulated, referenced, dt):
    """Within a few roundings of each other, relative to each value and (where a sum cancels, as in
    RoPE's x1 cos - x2 sin) to the array's largest."""
    for e, r in zip(emulated, referenced):
        np.testing.assert_allclose(r, e, rtol=RTOL[dt], atol=RTOL[dt] * np.abs(e).max())


def rand(shape, dt, seed, scale=2.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(np.float32).astype(dt)


@pytest.mark.parametrize("dt", [F32, BF16], ids=str)
def test_add_swiglu_rope_match_the_emulated_kernels(cp, monkeypatch, dt):
    shape = (3, 19, 4, 8)  # (B, T, H, D) for rope; 1824 elements: a partial last block elsewhere
    a, u, g = (rand(shape, dt, s) for s in (1, 2, 3))
    angles = np.arange(19 * 8).reshape(19, 8) / 7.0
    cos, sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)

    def run():
        out, da, du, rot, inv = (cp.empty(shape, dt) for _ in range(5))
        residual.add(cp.asarray(a), cp.asarray(u), out)
        swiglu.swiglu_bwd(cp.asarray(a), cp.asarray(u), cp.asarray(g), da, du)
        rope.rope(cp.asarray(a), cp.asarray(cos), cp.asarray(sin), rot)
        rope.rope(cp.asarray(a), cp.asarray(cos), cp.asarray(sin), inv, -1.0)
        y = cp.asarray(a)
        swiglu.swiglu_fwd(y, cp.asarray(u), y)  # in place
        return out, da, du, rot, inv, y

    emulated, referenced = both(monkeypatch, run)
    assert_same(emulated, referenced, dt)


@pytest.mark.parametrize("found_inf", [0.0, 1.0])
def test_adamw_steps_match_the_emulated_kernels(cp, monkeypatch, found_inf):
    n, n_decay = 5000, 3000
    p, g, m = (rand(n, F32, s, 0.1) for s in (4, 5, 6))
    v = np.abs(rand(n, F32, 7, 0.01))
    factors = np.array([1.0, 0.5, found_inf], np.float32)
    scalars = adamw.adamw_step_scalars(3, 1e-2, (0.9, 0.95), 0.1)

    def run():
        state = [cp.asarray(x) for _ in range(3) for x in (p, g, m, v)]
        adamw.adamw_flat(*state[0:4], step=3, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, n_decay=n_decay)
        adamw.adamw_flat_scaled(*state[4:8], cp.asarray(factors), step=3, lr=1e-2, betas=(0.9, 0.95),
                                weight_decay=0.1, n_decay=n_decay)
        adamw.adamw_flat_graphed(*state[8:12], cp.asarray(factors), cp.asarray(scalars), betas=(0.9, 0.95),
                                 n_decay=n_decay)
        return [state[i] for i in (0, 2, 3, 4, 6, 7, 8, 10, 11)]

    emulated, referenced = both(monkeypatch, run)
    assert_same(emulated, referenced, F32)
    if found_inf:  # the skipped step leaves p, m and v as they were
        np.testing.assert_array_equal(referenced[3], p.astype(np.float64))


def test_rmsnorm_gain_sum_matches_bit_for_bit(cp, monkeypatch):
    parts = rand((7, 45), F32, 8)

    def run():
        gw = cp.zeros(45, cp.float32)
        k = rmsnorm.kernel(rmsnorm._FILE, "rmsnorm_gw_sum", rmsnorm.NAME_EXPRESSIONS, cp)
        k((1,), (64,), (cp.asarray(parts), gw, np.int32(7), np.int32(45)))
        return [gw]

    emulated, referenced = both(monkeypatch, run)
    np.testing.assert_array_equal(referenced[0], emulated[0])


def test_a_kernel_that_only_shares_the_name_runs_on_the_emulator(cp, monkeypatch):
    monkeypatch.setenv("XTRAIN_STANDIN_KERNELS", "reference")
    src = r"""
    extern "C" __global__ void add(const float* a, const float* b, float* out, long long n) {
        long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) out[i] = a[i] - b[i];
    }"""
    a, b = rand(300, F32, 9), rand(300, F32, 10)
    out = cp.zeros(300, cp.float32)
    cp.RawKernel(src, "add")((2,), (256,), (cp.asarray(a), cp.asarray(b), out, np.int64(300)))
    np.testing.assert_array_equal(out.get(), a - b)


@pytest.mark.parametrize("causal,Tq,Tk", [(True, 70, 70), (True, 20, 70), (False, 33, 50)])
def test_tensor_core_flash_attention_matches_the_emulated_kernels(cp, monkeypatch, causal, Tq, Tk):
    """Forward and backward, grouped-query (4 query heads on 2 kv heads), a head dim padded to its
    bucket (24 -> 32), the queries the last Tq of Tk positions."""
    from xtrain_lessons.runtime.kernels import flash_attention_tc as ftc  # noqa: PLC0415

    q, dout = rand((2, Tq, 4, 24), BF16, 11, 1.0), rand((2, Tq, 4, 24), BF16, 12, 1.0)
    k, v = rand((2, Tk, 2, 24), BF16, 13, 1.0), rand((2, Tk, 2, 24), BF16, 14, 1.0)

    def run():
        o, lse = ftc.flash_attention_tc_fwd(cp.asarray(q), cp.asarray(k), cp.asarray(v), causal=causal)
        return (o, lse, *ftc.flash_attention_tc_bwd(cp.asarray(q), cp.asarray(k), cp.asarray(v), o, lse,
                                                    cp.asarray(dout), causal=causal))

    emulated, referenced = both(monkeypatch, run)
    for e, r in zip(emulated, referenced):  # each kernel rounds its bf16 operands and sums in tiles
        np.testing.assert_allclose(r, e, rtol=2 * RTOL[BF16], atol=4 * RTOL[BF16] * np.abs(e).max())
