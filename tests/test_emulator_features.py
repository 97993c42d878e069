"""The emulator runs CUDA as public teaching code writes it (tests/cuda_kernels/real_world.cu),
checked against NumPy at sizes that are not multiples of the block."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from xtrain_lessons.runtime.cuda import CompileError, Kernel, KernelError, Module, RawModule

SRC = Path(__file__).resolve().parent / "cuda_kernels" / "real_world.cu"
TEMPLATES = ["block_sum_t<float, 128>", "block_sum_t<double, 64>"]


@pytest.fixture(scope="module")
def mod():
    return Module(SRC, name_expressions=TEMPLATES, backend="cpu")


def blocks(n, b):
    return ((n + b - 1) // b,)


def test_cache_hint_loads_and_stores_on_scalars_and_float4(mod):
    n, n4 = 1003, 250
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n).astype(np.float32)
    y, y4 = np.zeros(n, np.float32), np.zeros((n4, 4), np.float32)
    x4 = x[: 4 * n4].reshape(n4, 4).copy()
    mod.get_function("cache_hints")(blocks(n, 128), (128,), (x, x4, y, y4, np.int32(n), np.int32(n4)))
    np.testing.assert_allclose(y, 6 * x, rtol=1e-6)
    np.testing.assert_allclose(y4, np.concatenate([2 * x4[:, :3], x4[:, 3:]], axis=1), rtol=1e-6)


def test_cooperative_group_tiles(mod):
    n, b = 150, 64  # 3 blocks; the last is partly past n
    x = np.random.default_rng(1).integers(-20, 100, n).astype(np.int32)
    grid = blocks(n, b)
    total = grid[0] * b
    out = np.zeros(9 * total, np.int32)
    mod.get_function("cg_tiles")(grid, (b,), (x, out, np.int32(n)))
    v = np.full(total, -1, np.int32)
    v[:n] = x
    t = v.reshape(-1, 8)  # tiles of 8
    lane = np.arange(8)
    expect = [
        np.repeat(t[:, 2], 8),
        np.where(lane + 1 < 8, np.roll(t, -1, axis=1), t).ravel(),
        t[:, lane ^ 3].ravel(),
        np.where(lane >= 2, np.roll(t, 2, axis=1), t).ravel(),
        np.repeat((t > 50).any(axis=1), 8).astype(np.int32),
        np.repeat((t > 0).all(axis=1), 8).astype(np.int32),
        np.repeat(((t % 2 == 0) << lane).sum(axis=1), 8).astype(np.int32),
        np.tile(np.repeat(np.arange(b // 8) * 100 + b // 8, 8), grid[0]),
        np.repeat(t.sum(axis=1), 8),
    ]
    for k, e in enumerate(expect):
        np.testing.assert_array_equal(out[k * total:(k + 1) * total], e, err_msg=f"row {k}")


def test_cooperative_group_reduce_and_block_sync(mod):
    n, b = 1000, 96  # 3 warps a block, 11 blocks, the last partial
    x = np.random.default_rng(2).standard_normal(n).astype(np.float32)
    grid = blocks(n, b)
    warps = grid[0] * b // 32
    ws, wm, bs = np.zeros(warps, np.float32), np.zeros(warps, np.float32), np.zeros(grid[0], np.float32)
    mod.get_function("cg_warp_reduce")(grid, (b,), (x, ws, wm, bs, np.int32(n)))
    padded = np.zeros(warps * 32, np.float32)
    padded[:n] = x
    live = (np.arange(warps * 32) < n).reshape(warps, 32)
    np.testing.assert_allclose(ws, padded.reshape(warps, 32).sum(axis=1), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(wm, np.where(live, padded.reshape(warps, 32), -np.inf).max(axis=1))
    np.testing.assert_allclose(bs, np.add.reduceat(padded, np.arange(0, grid[0] * b, b)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("expr, dtype, block", [(TEMPLATES[0], np.float32, 128), (TEMPLATES[1], np.float64, 64)])
def test_template_kernel_by_name_expression(mod, expr, dtype, block):
    n = 1000
    x = np.random.default_rng(3).standard_normal(n).astype(dtype)
    grid = blocks(n, block)
    out = np.zeros(grid[0], dtype)
    k = mod.get_function(expr)
    assert k.signature == f"const {'float' if dtype == np.float32 else 'double'}*, " \
                          f"{'float' if dtype == np.float32 else 'double'}*, int"
    k(grid, (block,), (x, out, np.int32(n)))
    padded = np.zeros(grid[0] * block, dtype)
    padded[:n] = x
    np.testing.assert_allclose(out, padded.reshape(-1, block).sum(axis=1), rtol=1e-5 if dtype == np.float32 else 1e-12)


def test_template_kernel_through_kernel_and_raw_module_api():
    k = Kernel(SRC, "block_sum_t<float, 128>", backend="cpu")
    x = np.ones(300, np.float32)
    out = np.zeros(3, np.float32)
    k((3,), (128,), (x, out, np.int32(300)))
    np.testing.assert_array_equal(out, [128, 128, 44])
    raw = RawModule(code=SRC.read_text(), name_expressions=["block_sum_t<double, 64>"], backend="cpu")
    assert raw.get_function("block_sum_t<double, 64>").signature == "const double*, double*, int"
    with pytest.raises(CompileError, match="name expression"):
        Module(SRC, name_expressions=["no_such_kernel<int>"], backend="cpu")
    with pytest.raises(CompileError, match="template kernel"):
        Module(SRC, backend="cpu").get_function("block_sum_t")


def test_constant_memory_set_from_the_host(mod):
    p = np.array([0.5, -1.0, 0.25, 2.0], np.float32)
    mod.set_global("poly", p)
    g = mod.get_global("poly")
    assert g.size == 16
    back = np.zeros(4, np.float32)
    g.copy_to_host(back.ctypes.data, back.nbytes)
    np.testing.assert_array_equal(back, p)
    x = np.linspace(-2, 2, 777).astype(np.float32)
    y = np.zeros_like(x)
    mod.get_function("horner")(blocks(777, 256), (256,), (x, y, np.int32(777)))
    np.testing.assert_allclose(y, np.polyval(p[::-1].astype(np.float64), x), rtol=1e-5, atol=1e-5)
    with pytest.raises(KeyError, match="poly"):
        mod.get_global("nope")
    with pytest.raises(ValueError, match="16 bytes"):
        mod.set_global("poly", np.zeros(5, np.float32))


def test_nvcc_atomics(mod):
    n = 1234
    v = np.random.default_rng(4).integers(-1000, 1000, n).astype(np.int32)
    counters = np.zeros(3, np.uint32)
    minmax = np.array([2**31 - 1, -2**31], np.int32)
    ll = np.array([2**63 - 1, -2**63], np.int64)
    exch = np.zeros(1, np.uint64)
    mod.get_function("atomics_nvcc")(blocks(n, 128), (128,), (v, counters, minmax, ll, exch, np.int32(n)))
    inc = dec = 0
    for _ in range(n):  # CUDA's definitions, step by step
        inc = 0 if inc >= 9 else inc + 1
        dec = 9 if dec == 0 or dec > 9 else dec - 1
    np.testing.assert_array_equal(counters, [inc, dec, n])
    np.testing.assert_array_equal(minmax, [v.min(), v.max()])
    np.testing.assert_array_equal(ll, [int(v.min()) * 10**9, int(v.max()) * 10**9])
    assert 1 <= exch[0] <= n


def test_trap_stops_the_kernel_with_block_thread_and_line(mod):
    x = np.zeros(300, np.int32)
    x[277] = -1
    with pytest.raises(KernelError, match=r"__trap\(\) on line \d+ in block \(2,0,0\), thread \(21,0,0\)"):
        mod.get_function("trap_on_negative")(blocks(300, 128), (128,), (x, np.int32(300)))


def test_half_and_bfloat16_pairs(mod):
    import ml_dtypes
    bf = ml_dtypes.bfloat16
    n = 999
    rng = np.random.default_rng(5)
    a = rng.uniform(-4, 4, n).astype(np.float32)
    b = rng.uniform(0.5, 4, n).astype(np.float32) * rng.choice([-1, 1], n).astype(np.float32)
    out = np.zeros(8 * n, np.float32)
    mod.get_function("half_ops")(blocks(n, 128), (128,), (a, b, out, np.int32(n)))
    ha, hb = a.astype(np.float16), b.astype(np.float16)
    h2 = ha + hb * hb  # __hadd2(h2, __hmul2(h2, h2)) on (a, b): x = a + a*a, y = b + b*b
    ba, bb = a.astype(bf), b.astype(bf)
    g2x = (ba * (ba + ba)).astype(np.float32)
    g2y = (bb * (bb + bb)).astype(np.float32)
    expect = [
        (ha + hb), (ha * hb),
        (ha.astype(np.float64) * hb + ha).astype(np.float16),
        (ha + ha * ha), (hb + hb * hb),
        g2x, bb.astype(np.float32) - g2y, (ba / bb),
    ]
    del h2
    for k, e in enumerate(expect):
        np.testing.assert_array_equal(out[k * n:(k + 1) * n], np.asarray(e).astype(np.float32), err_msg=f"row {k}")


def test_half_conversions_match_numpy_bit_for_bit(mod):
    """All 65536 half patterns to float; floats to half at ties, subnormals, the overflow edge."""
    bits = np.arange(65536, dtype=np.uint16)
    rng = np.random.default_rng(8)
    special = np.array([65504, 65519.99, 65520, 1e9, 2.0**-24, 2.0**-25, 1.5 * 2.0**-25, 2.0**-14, 0.0, -0.0,
                        np.inf, -np.inf, 1 + 2.0**-11, 1 + 3 * 2.0**-11, 2049, 2051], np.float32)
    x = np.concatenate([special, rng.standard_normal(30000).astype(np.float32) * 10.0 ** rng.integers(-9, 6, 30000),
                        bits.view(np.float16).astype(np.float32)[np.isfinite(bits.view(np.float16))]])
    x = np.resize(x, 65536).astype(np.float32)
    to_half, to_float = np.zeros(65536, np.uint16), np.zeros(65536, np.float32)
    mod.get_function("half_convert")(blocks(65536, 256), (256,), (x, to_half, bits, to_float, np.int32(65536)))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(to_half, x.astype(np.float16).view(np.uint16))
    ref = bits.view(np.float16).astype(np.float32)
    nan = np.isnan(ref)
    np.testing.assert_array_equal(to_float[~nan].view(np.uint32), ref[~nan].view(np.uint32))
    assert np.isnan(to_float[nan]).all()


def test_user_lerp_and_max_do_not_clash(mod):
    """real_world.cu defines lerp and a 3-argument max (it compiled for the fixture); lerp is the
    user's: lerp(a, b, 0.5) of a float4's w component."""
    x4 = np.arange(8, dtype=np.float32).reshape(2, 4)
    y4 = np.zeros_like(x4)
    mod.get_function("cache_hints")((1,), (32,), (x4.ravel(), x4, np.zeros(8, np.float32), y4, np.int32(0),
                                                   np.int32(2)))
    np.testing.assert_array_equal(y4[:, 3], x4[:, 3])


def _gpu() -> bool:
    from xtrain_lessons.runtime.device import gpu_available
    return gpu_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs CuPy and an NVIDIA GPU")
def test_module_gives_the_same_results_on_a_gpu():
    """Template kernels by name expression, __constant__ memory and cooperative groups through
    cupy.RawModule agree with the emulator."""
    import cupy as cp
    gpu, cpu = (Module(SRC, name_expressions=TEMPLATES, backend=b) for b in ("gpu", "cpu"))
    x = np.random.default_rng(6).standard_normal(1000).astype(np.float32)
    out_cpu, out_gpu = np.zeros(8, np.float32), cp.zeros(8, cp.float32)
    cpu.get_function(TEMPLATES[0])((8,), (128,), (x, out_cpu, np.int32(1000)))
    gpu.get_function(TEMPLATES[0])((8,), (128,), (cp.asarray(x), out_gpu, np.int32(1000)))
    np.testing.assert_allclose(cp.asnumpy(out_gpu), out_cpu, rtol=1e-5, atol=1e-5)
    p = np.array([0.5, -1.0, 0.25, 2.0], np.float32)
    for m in (cpu, gpu):
        m.set_global("poly", p)
    y_cpu, y_gpu = np.zeros(1000, np.float32), cp.zeros(1000, cp.float32)
    cpu.get_function("horner")((4,), (256,), (x, y_cpu, np.int32(1000)))
    gpu.get_function("horner")((4,), (256,), (cp.asarray(x), y_gpu, np.int32(1000)))
    np.testing.assert_allclose(cp.asnumpy(y_gpu), y_cpu, rtol=1e-5, atol=1e-5)
    v = np.random.default_rng(7).integers(-20, 100, 150).astype(np.int32)
    o_cpu, o_gpu = np.zeros(9 * 192, np.int32), cp.zeros(9 * 192, cp.int32)
    cpu.get_function("cg_tiles")((3,), (64,), (v, o_cpu, np.int32(150)))
    gpu.get_function("cg_tiles")((3,), (64,), (cp.asarray(v), o_gpu, np.int32(150)))
    np.testing.assert_array_equal(cp.asnumpy(o_gpu), o_cpu)


# ---- the tensor cores: mma.sync.m16n8k16 as inline PTX, and 16-bit atomics ------------------
TC = Path(__file__).resolve().parent / "cuda_kernels" / "tensor_cores.cu"


@pytest.fixture(scope="module")
def tc():
    return Module(TC, backend="cpu")


def _bf16(a):
    import ml_dtypes
    return np.asarray(a, np.float32).astype(ml_dtypes.bfloat16)


@pytest.mark.parametrize("kind", ["bf16", "f16"])
def test_mma_tile_is_a_times_b_plus_c(tc, kind):
    """One warp, one instruction: D = A B + C from fragments loaded by the PTX ISA's layout.
    Products of 16-bit values are exact, so D is the float64 result rounded once to float32."""
    rng = np.random.default_rng(10)
    cast = _bf16 if kind == "bf16" else (lambda a: np.asarray(a, np.float16))
    A, B = cast(rng.standard_normal((16, 16))), cast(rng.standard_normal((16, 8)))
    C = rng.standard_normal((16, 8)).astype(np.float32)
    D = np.full((16, 8), np.nan, np.float32)
    tc.get_function(f"mma_tile_{kind}")((1,), (32,), (A, B, C, D))
    exact = A.astype(np.float64) @ B.astype(np.float64) + C
    np.testing.assert_array_equal(D, exact.astype(np.float32))
    # the check can fail: a transposed B is a different product
    assert not np.allclose(D, (A.astype(np.float64) @ B.astype(np.float64)[::-1] + C), atol=1e-3)


def test_mma_gemm_over_warps_and_blocks(tc):
    M, N, K = 64, 24, 48  # 2 x 2 warps in blocks of (32, 2), 3 column tiles, 3 steps along K
    rng = np.random.default_rng(11)
    A, B = _bf16(rng.standard_normal((M, K))), _bf16(rng.standard_normal((K, N)))
    C = np.full((M, N), np.nan, np.float32)
    tc.get_function("mma_gemm_bf16")((N // 8, M // 32), (32, 2), (A, B, C, np.int32(M), np.int32(N), np.int32(K)))
    np.testing.assert_allclose(C, A.astype(np.float64) @ B.astype(np.float64), rtol=1e-6, atol=1e-5)


def test_mma_fragment_layout_is_the_ptx_isa_one():
    """Every element of A (16x16), B and C (16x8) is held by exactly one (lane, register); spot
    values from the PTX ISA's figures (lane 0 holds A[0][0:2], A[8][0:2], A[0][8:10], A[8][8:10])."""
    from xtrain_lessons.runtime.cuda.emulator import mma_fragment_layout
    for operand, shape in (("a", (16, 16)), ("b", (16, 8)), ("c", (16, 8))):
        rows, cols = mma_fragment_layout(operand)
        counts = np.zeros(shape, int)
        np.add.at(counts, (rows.ravel(), cols.ravel()), 1)
        assert (counts == 1).all(), operand
    rows, cols = mma_fragment_layout("a")
    assert list(zip(rows[0], cols[0])) == [(0, 0), (0, 1), (8, 0), (8, 1), (0, 8), (0, 9), (8, 8), (8, 9)]
    assert list(zip(rows[5], cols[5]))[:2] == [(1, 2), (1, 3)]  # lane 5: group 1, thread 1 of its group
    rows, cols = mma_fragment_layout("b")
    assert list(zip(rows[6], cols[6])) == [(4, 1), (5, 1), (12, 1), (13, 1)]
    rows, cols = mma_fragment_layout("c")
    assert list(zip(rows[31], cols[31])) == [(7, 6), (7, 7), (15, 6), (15, 7)]
    with pytest.raises(ValueError, match="operand"):
        mma_fragment_layout("x")


@pytest.mark.parametrize("name, message", [
    ("mma_after_early_exit", r"needs all 32 lanes of the warp .*lanes 16-31 have exited"),
    ("mma_divergent", r"warp divergence .* different warp operations"),
])
def test_mma_needs_the_whole_warp(tc, name, message):
    A, B = _bf16(np.ones((16, 16))), _bf16(np.ones((16, 8)))
    C, D = np.zeros((16, 8), np.float32), np.zeros((16, 8), np.float32)
    with pytest.raises(KernelError, match=message):
        tc.get_function(name)((1,), (32,), (A, B, C, D))
    with pytest.raises(KernelError, match="only 16 threads in this warp"):
        tc.get_function("mma_tile_bf16")((1,), (16,), (A, B, C, D))


def test_mma_runs_in_threads_mode_and_under_the_sanitizer(monkeypatch):
    rng = np.random.default_rng(12)
    A, B = _bf16(rng.standard_normal((16, 16))), _bf16(rng.standard_normal((16, 8)))
    C = rng.standard_normal((16, 8)).astype(np.float32)
    expect = (A.astype(np.float64) @ B.astype(np.float64) + C).astype(np.float32)
    k = Kernel(TC, "mma_tile_bf16", backend="cpu", sanitize=True)
    D = np.zeros((16, 8), np.float32)
    k((1,), (32,), (A, B, C, D))
    np.testing.assert_array_equal(D, expect)
    with pytest.raises(KernelError, match="out-of-bounds global read of C"):
        k((1,), (32,), (A, B, C[:8].copy(), D))  # C too short: the sanitizer names it
    monkeypatch.setenv("XTRAIN_EMULATOR_MODE", "threads")
    D = np.zeros((16, 8), np.float32)
    Kernel(TC, "mma_tile_bf16", backend="cpu")((1,), (32,), (A, B, C, D))
    np.testing.assert_array_equal(D, expect)


def test_unsupported_inline_ptx_is_a_compile_error_naming_it():
    src = 'extern "C" __global__ void k(float* x) {\n  asm volatile("bar.sync 0;");\n}\n'
    with pytest.raises(CompileError, match=r"bar\.sync.*not supported.*mma\.sync"):
        Kernel(src, "k", backend="cpu")


def test_atomic_add_on_16_bit_floats_and_pairs(tc):
    """atomicAdd on __nv_bfloat162 (issue 39: real bf16 reductions use it), __nv_bfloat16,
    __half2, __half: 1000 threads into 7 slots; small integers, so every sum is exact."""
    n, npairs = 1000, 7
    rng = np.random.default_rng(13)
    x, y = rng.integers(-3, 4, n).astype(np.float32), rng.integers(-2, 3, n).astype(np.float32)
    pb, sb = _bf16(np.zeros((npairs, 2))), _bf16(np.zeros(npairs))
    ph, sh = np.zeros((npairs, 2), np.float16), np.zeros(npairs, np.float16)
    tc.get_function("atomic_add_16bit")(blocks(n, 128), (128,), (x, y, pb, sb, ph, sh, np.int32(n), np.int32(npairs)))
    sx = np.bincount(np.arange(n) % npairs, weights=x, minlength=npairs)
    sy = np.bincount(np.arange(n) % npairs, weights=y, minlength=npairs)
    assert np.abs(sx).max() < 256 and np.abs(sy).max() < 256  # exact in bfloat16
    np.testing.assert_array_equal(pb.astype(np.float64), np.stack([sx, sy], axis=1))
    np.testing.assert_array_equal(sb.astype(np.float64), sx)
    np.testing.assert_array_equal(ph.astype(np.float64), np.stack([sx, sy], axis=1))
    np.testing.assert_array_equal(sh.astype(np.float64), sy)


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs CuPy and an NVIDIA GPU")
def test_tensor_core_kernels_agree_with_the_emulator_on_a_gpu():
    """mma.sync on a real tensor core against the emulator's (the same fragments, so the same
    product; the GPU may round the sum differently in the last bit: 1e-6 relative), and the
    16-bit atomics bit for bit."""
    import cupy as cp
    if int(cp.cuda.Device().compute_capability) < 80:
        pytest.skip("bf16 mma.sync and bf16 atomics need sm_80 or newer")
    gpu, cpu = Module(TC, backend="gpu"), Module(TC, backend="cpu")
    rng = np.random.default_rng(14)
    M, N, K = 64, 24, 48
    A, B = _bf16(rng.standard_normal((M, K))), _bf16(rng.standard_normal((K, N)))
    c_cpu, c_gpu = np.zeros((M, N), np.float32), cp.zeros((M, N), cp.float32)
    args = (np.int32(M), np.int32(N), np.int32(K))
    cpu.get_function("mma_gemm_bf16")((N // 8, M // 32), (32, 2), (A, B, c_cpu, *args))
    gpu.get_function("mma_gemm_bf16")((N // 8, M // 32), (32, 2), (cp.asarray(A), cp.asarray(B), c_gpu, *args))
    np.testing.assert_allclose(cp.asnumpy(c_gpu), c_cpu, rtol=1e-6, atol=1e-6 * np.abs(c_cpu).max())
    n, npairs = 1000, 7
    x, y = rng.integers(-3, 4, n).astype(np.float32), rng.integers(-2, 3, n).astype(np.float32)
    outs = {}
    for name, mod, xp in (("cpu", cpu, np), ("gpu", gpu, cp)):
        bufs = [xp.asarray(_bf16(np.zeros((npairs, 2)))), xp.asarray(_bf16(np.zeros(npairs))),
                xp.zeros((npairs, 2), np.float16), xp.zeros(npairs, np.float16)]
        mod.get_function("atomic_add_16bit")(blocks(n, 128), (128,), (xp.asarray(x), xp.asarray(y), *bufs,
                                                                        np.int32(n), np.int32(npairs)))
        outs[name] = [np.asarray(b.get() if xp is cp else b).astype(np.float64) for b in bufs]
    for a, b in zip(outs["cpu"], outs["gpu"]):
        np.testing.assert_array_equal(a, b)
