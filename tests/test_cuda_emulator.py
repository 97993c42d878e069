"""The CPU emulator runs CUDA C kernels correctly, and fails loudly on synchronisation bugs.

Kernels live in tests/cuda_kernels/*.cu (also compiled by nvcc in test_nvcc_compile.py).
Compiled libraries go to the user cache (shared across runs); the tests about compiling and
caching use a temporary cache.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from xtrain_lessons.runtime.cuda import CompileError, Kernel, KernelError, selftest, emulator
from xtrain_lessons.runtime.kernels.vector_add import vector_add, vector_add_reference

KERNELS = Path(__file__).parent / "cuda_kernels"
_cache: dict = {}


def kernel(file: str, name: str) -> Kernel:
    if (file, name) not in _cache:
        _cache[file, name] = Kernel(KERNELS / file, name, backend="cpu")
    return _cache[file, name]


def blocks(n: int, block: int) -> int:
    return (n + block - 1) // block


@pytest.fixture(params=["fibers", "threads", "ucontext"])
def mode(request, monkeypatch):
    """Run a test with each way of switching between CUDA threads (see emulator.MODES)."""
    monkeypatch.setenv("XTRAIN_EMULATOR_MODE", request.param)
    return request.param


# ------------------------------------------------------------------ correct kernels
@pytest.mark.parametrize("n", [1, 255, 256, 1000, 4097])
def test_vector_add_partial_last_block(n):
    rng = np.random.default_rng(n)
    a, b = rng.standard_normal(n, dtype=np.float32), rng.standard_normal(n, dtype=np.float32)
    np.testing.assert_array_equal(vector_add(a, b), vector_add_reference(a, b))


def test_vector_add_does_not_write_past_the_end():
    k = kernel("../../xtrain_lessons/runtime/kernels/vector_add.cu", "vector_add")
    a, b = np.ones(1000, np.float32), np.ones(1000, np.float32)
    c = np.full(1024, -7.0, np.float32)
    k((4,), (256,), (a, b, c, np.int32(1000)))
    assert (c[:1000] == 2).all() and (c[1000:] == -7).all()


def test_tiled_matmul_odd_sizes(mode):
    M, K, N = 37, 53, 29  # not multiples of the 16x16 tile
    rng = np.random.default_rng(0)
    A = rng.standard_normal((M, K), dtype=np.float32)
    B = rng.standard_normal((K, N), dtype=np.float32)
    C = np.zeros((M, N), np.float32)
    kernel("matmul_tiled.cu", "matmul_tiled")((blocks(N, 16), blocks(M, 16)), (16, 16),
                                              (A, B, C, np.int32(M), np.int32(N), np.int32(K)))
    ref = A.astype(np.float64) @ B.astype(np.float64)
    np.testing.assert_allclose(C, ref, rtol=0, atol=K * 4 * np.finfo(np.float32).eps * np.abs(ref).max())


@pytest.mark.parametrize("block", [32, 128, 1024])
def test_warp_shuffle_softmax(block):
    rows, cols = 7, 1000
    x = np.random.default_rng(1).standard_normal((rows, cols), dtype=np.float32) * 5
    y = np.zeros_like(x)
    kernel("softmax_warp.cu", "softmax_rows")((rows,), (block,), (x, y, np.int32(rows), np.int32(cols)))
    e = np.exp(x.astype(np.float64) - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(y, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)


def test_warp_operations():
    n = 64  # two warps
    x = np.random.default_rng(2).integers(-20, 100, n).astype(np.int32)
    out = np.zeros(8 * n, np.int32)
    kernel("warp_ops.cu", "warp_ops")((1,), (n,), (x, out, np.int32(n)))
    out = out.reshape(8, n)
    lane, base = np.arange(n) % 32, np.arange(n) // 32 * 32
    same = lambda src, ok: np.where(ok, x[base + np.clip(src, 0, 31)], x)  # noqa: E731
    np.testing.assert_array_equal(out[0], x[base + 3])
    np.testing.assert_array_equal(out[1], x[base + (lane // 8 * 8) + (lane + 1) % 8])
    np.testing.assert_array_equal(out[2], same(lane - 2, lane >= 2))
    np.testing.assert_array_equal(out[3], same(lane + 5, lane % 16 + 5 < 16))
    np.testing.assert_array_equal(out[4], x[base + (lane ^ 1)])
    ballot = [sum(1 << l for l in range(32) if x[w * 32 + l] > 0) for w in range(2)]
    np.testing.assert_array_equal(out[5].view(np.uint32), np.repeat(np.array(ballot, np.uint32), 32))
    np.testing.assert_array_equal(out[6], np.repeat([int((x[w * 32:(w + 1) * 32] > 50).any()) for w in range(2)], 32))
    np.testing.assert_array_equal(out[7], np.repeat([int((x[w * 32:(w + 1) * 32] >= 0).all()) for w in range(2)], 32))


def test_3d_grid_and_block():
    grid, block = (3, 2, 2), (4, 2, 3)
    W, H, D = 12, 4, 6
    out = np.full(2 * W * H * D, -1, np.int32)
    kernel("indexing.cu", "write_coords")(grid, block, (out, np.int32(W), np.int32(H)))
    z, y, x = np.meshgrid(np.arange(D), np.arange(H), np.arange(W), indexing="ij")
    bx, by, bz, tx, ty, tz = x // 4, y // 2, z // 3, x % 4, y % 2, z % 3
    out = out.reshape(D, H, W, 2)
    np.testing.assert_array_equal(out[..., 0], (bz * 2 + by) * 3 + bx)
    np.testing.assert_array_equal(out[..., 1], (tz * 2 + ty) * 4 + tx)


def test_atomics():
    rng = np.random.default_rng(3)
    n, bins = 100_000, 37
    values = rng.integers(0, bins, n).astype(np.int32)
    counts = np.zeros(bins, np.int32)
    kernel("atomics.cu", "histogram")((blocks(n, 256),), (256,), (values, counts, np.int32(n)))
    np.testing.assert_array_equal(counts, np.bincount(values, minlength=bins))

    src = rng.standard_normal(n).astype(np.float32)
    out = np.zeros(bins, np.float32)
    kernel("atomics.cu", "scatter_add")((blocks(n, 256),), (256,), (values, src, out, np.int32(n)))
    np.testing.assert_allclose(out, np.bincount(values, weights=src, minlength=bins), atol=1e-3)

    u = rng.integers(0, 2**32 - 1, n, dtype=np.uint32)
    best = np.zeros(1, np.uint32)
    kernel("atomics.cu", "global_max")((blocks(n, 256),), (256,), (u, best, np.int32(n)))
    assert best[0] == u.max()

    counter = np.zeros(1, np.uint64)
    kernel("atomics.cu", "cas_count")((blocks(n, 256),), (256,), (counter, np.int32(n)))
    assert counter[0] == n

    x, total = rng.standard_normal(n), np.zeros(1, np.float64)
    kernel("atomics.cu", "double_sum")((blocks(n, 256),), (256,), (x, total, np.int32(n)))
    np.testing.assert_allclose(total[0], x.sum(), rtol=1e-12, atol=1e-9)


def test_dynamic_shared_memory():
    n, block = 1000, 128
    x = np.arange(n, dtype=np.float32)
    y = np.zeros(n, np.float32)
    kernel("shared_memory.cu", "reverse_blocks")((blocks(n, block),), (block,), (x, y, np.int32(n)),
                                                 shared_mem=block * 4)
    padded = np.concatenate([x, np.zeros(blocks(n, block) * block - n, np.float32)])
    np.testing.assert_array_equal(y, padded.reshape(-1, block)[:, ::-1].ravel()[:n])


def test_early_return_does_not_deadlock(mode):
    n, block = 200, 128  # the second block has 72 live threads
    x = np.arange(n, dtype=np.float32)
    y = np.zeros(n, np.float32)
    kernel("shared_memory.cu", "pair_sum_early_return")((blocks(n, block),), (block,), (x, y, np.int32(n)))
    partner = np.arange(n) ^ 1
    np.testing.assert_array_equal(y, x + np.where(partner < n, x[np.minimum(partner, n - 1)], 0))


def test_bf16_rounding_bit_exact():
    rng = np.random.default_rng(4)
    bits = [rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32)]  # all exponents
    hi = rng.integers(0, 2**16, 20_000, dtype=np.uint32) << 16
    bits += [hi | 0x8000, hi | 0x7FFF, hi | 0x8001]  # ties (even and odd) and their neighbours
    bits += [np.arange(0, 2**16, 7, dtype=np.uint32) | s for s in (0, 0x80000000)]  # subnormals
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000,
                         0x00800000, 0x007FFFFF, 0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF], np.uint32)
    x = np.concatenate(bits + [specials]).view(np.float32)
    n = x.size
    y = np.zeros(n, ml_dtypes.bfloat16)
    kernel("bf16.cu", "to_bf16")((blocks(n, 256),), (256,), (x, y, np.int32(n)))
    with np.errstate(invalid="ignore"):
        ref = x.astype(ml_dtypes.bfloat16)
    nan = np.isnan(x)
    assert nan.sum() > 1000
    np.testing.assert_array_equal(y.view(np.uint16)[~nan], ref.view(np.uint16)[~nan])
    assert np.isnan(y[nan].astype(np.float32)).all()

    every = np.arange(2**16, dtype=np.uint16)  # bf16 -> float32 is exact for all 65536 patterns
    f = np.zeros(every.size, np.float32)
    kernel("bf16.cu", "from_bf16")((256,), (256,), (every, f, np.int32(every.size)))
    np.testing.assert_array_equal(f.view(np.uint32), every.astype(np.uint32) << 16)


# ------------------------------------------------------------------ bugs must not pass silently
def test_block_sum_with_and_without_barrier():
    n, block = 1000, 256
    x = np.random.default_rng(5).standard_normal(n).astype(np.float32)
    ref = np.add.reduceat(np.concatenate([x, np.zeros(24, np.float32)]), np.arange(0, 1024, 256))
    out = np.zeros(4, np.float32)
    kernel("shared_memory.cu", "block_sum")((4,), (block,), (x, out, np.int32(n)))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)

    bad = np.zeros(4, np.float32)
    try:
        kernel("shared_memory.cu", "block_sum_missing_sync")((4,), (block,), (x, bad, np.int32(n)))
    except KernelError:
        return
    assert not np.allclose(bad, ref, rtol=1e-5, atol=1e-5), "a missing __syncthreads went unnoticed"


def test_uninitialised_shared_memory_reads_as_nan():
    out = np.zeros(128, np.float32)
    kernel("shared_memory.cu", "read_uninitialized")((1,), (64,), (out,), shared_mem=256)
    assert np.isnan(out[:64]).all()
    assert (out[64:] == -1).all()


def test_barrier_inside_branch_raises(mode):
    x = np.arange(32, dtype=np.float32)
    with pytest.raises(KernelError, match=r"divergence.*threads 0-15 wait at __syncthreads\(\) on line 9"):
        kernel("bugs.cu", "barrier_in_branch")((2,), (32,), (x, np.zeros_like(x)))


def test_half_warp_shuffle_deadlock_raises(mode):
    x = np.arange(64, dtype=np.float32)
    with pytest.raises(KernelError, match=r"deadlock.*__shfl_down_sync on line 20"):
        kernel("bugs.cu", "shuffle_in_branch")((1,), (64,), (x,))


def test_too_much_static_shared_memory():
    with pytest.raises(KernelError, match="48 KB"):
        kernel("bugs.cu", "too_much_shared")((1,), (32,), (np.zeros(32, np.float32),))


def test_emulator_still_works_after_errors():
    a = np.ones(10, np.float32)
    np.testing.assert_array_equal(vector_add(a, a), 2 * a)


# ------------------------------------------------------------------ arguments
def test_mistyped_arguments_raise():
    k = kernel("../../xtrain_lessons/runtime/kernels/vector_add.cu", "vector_add")
    a = np.ones(8, np.float32)
    assert k.signature == "const float*, const float*, float*, int"
    with pytest.raises(TypeError, match=r"argument 1 \(const float\*\).*float64"):
        k((1,), (8,), (a, a.astype(np.float64), a, np.int32(8)))
    with pytest.raises(TypeError, match=r"argument 3 \(int\).*float64"):
        k((1,), (8,), (a, a, a, np.float64(8)))
    with pytest.raises(TypeError, match=r"argument 3 \(int\).*int64"):
        k((1,), (8,), (a, a, a, np.int64(8)))
    with pytest.raises(TypeError, match=r"Python int.*np\.int32"):
        k((1,), (8,), (a, a, a, 8))
    with pytest.raises(TypeError, match="takes 4 arguments, got 3"):
        k((1,), (8,), (a, a, a))
    with pytest.raises(TypeError, match="expected a NumPy array"):
        k((1,), (8,), ([1.0] * 8, a, a, np.int32(8)))
    with pytest.raises(ValueError, match="C-contiguous"):
        k((1,), (8,), (np.ones(16, np.float32)[::2], a, a, np.int32(8)))
    ro = np.ones(8, np.float32)
    ro.flags.writeable = False
    k((1,), (8,), (ro, ro, a, np.int32(8)))  # read-only inputs are fine for const float*
    with pytest.raises(ValueError, match="read-only"):
        k((1,), (8,), (a, a, ro, np.int32(8)))
    with pytest.raises(ValueError, match="1024 threads"):
        k((1,), (2048,), (a, a, a, np.int32(8)))


def test_bf16_pointer_accepts_uint16_storage():
    x = np.array([1.0, 3.0], np.float32)
    y = np.zeros(2, np.uint16)
    kernel("bf16.cu", "to_bf16")(1, 2, (x, y, np.int32(2)))  # int grid and block
    np.testing.assert_array_equal(y.view(ml_dtypes.bfloat16).astype(np.float32), x)


# ------------------------------------------------------------------ compiling and caching
@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    """A fresh kernel cache holding only the (expensive to build) runtime library."""
    runtime = emulator.runtime_library()
    shutil.copy(runtime, tmp_path / runtime.name)
    monkeypatch.setenv("XTRAIN_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_compile_error_names_file_and_line(tmp_cache):
    src = 'extern "C" __global__ void broken(float* x) {\n    int i = threadIdx.x;\n    x[i] = undefined_thing;\n}\n'
    with pytest.raises(CompileError, match=r"broken\.cu:3:.*undefined_thing"):
        Kernel(src, "broken", backend="cpu")
    assert not list(tmp_cache.glob("build-*")), "temporary build directories are cleaned up"


def test_unsupported_shared_declaration_is_a_compile_error(tmp_cache):
    src = ('extern "C" __global__ void two(float* x) {\n'
           '    __shared__ float a[4], b[4];\n    x[0] = 1.0f;\n}\n')
    with pytest.raises(CompileError, match=r"(?s)one variable per statement.*two\.cu:2:"):
        Kernel(src, "two", backend="cpu")


def test_unknown_kernel_name():
    with pytest.raises(CompileError, match=r"no __global__ function named 'nope'.*found: vector_add"):
        Kernel(KERNELS.parent.parent / "xtrain_lessons" / "runtime" / "kernels" / "vector_add.cu", "nope", backend="cpu")


def test_compiled_library_is_cached(tmp_cache, monkeypatch):
    src = 'extern "C" __global__ void fill(float* x, float v) { x[threadIdx.x] = v; }\n'
    Kernel(src, "fill", backend="cpu")
    libs = list(tmp_cache.glob("*.so"))
    assert len(libs) == 2  # the runtime and the kernel

    def no_compiler(*args, **kwargs):
        raise AssertionError("the compiler ran although the library is cached")
    monkeypatch.setattr(emulator.subprocess, "run", no_compiler)
    x = np.zeros(4, np.float32)
    Kernel(src, "fill", backend="cpu")((1,), (4,), (x, np.float32(2.5)))
    assert (x == 2.5).all()


def test_selftest():
    ok, message = selftest()
    assert ok, message


# ------------------------------------------------------------------ source forms
SHARED_FORMS = r'''
#define TILE 8
extern "C" __global__ void __launch_bounds__(64) shared_forms(float* out) {
    __shared__ float tile[TILE][TILE + 1];          // padded 2-D tile
    __shared__ volatile int flag;
    extern __shared__ __align__(16) unsigned char raw[];
    float* dyn = reinterpret_cast<float*>(raw);
    int t = threadIdx.x;
    tile[t / TILE][t % TILE] = (float)t;
    dyn[t] = 2.0f * t;
    if (t == 0) flag = 7;
    __syncthreads();
    out[t] = tile[(63 - t) / TILE][(63 - t) % TILE] + dyn[63 - t] + flag;
}
'''


def test_shared_declaration_forms():
    out = np.zeros(64, np.float32)
    Kernel(SHARED_FORMS, "shared_forms", backend="cpu")((2,), (64,), (out,), shared_mem=64 * 4)
    np.testing.assert_array_equal(out, 3.0 * (63 - np.arange(64)) + 7)


def test_file_scope_shared_is_refused():
    src = '__shared__ float g[4];\nextern "C" __global__ void f(float* x) { x[0] = g[0]; }\n'
    with pytest.raises(CompileError, match="f.cu: line 1: __shared__ variables at file scope"):
        Kernel(src, "f", backend="cpu")


def test_load_kernel_is_cached_per_process():
    from xtrain_lessons.runtime.cuda import load_kernel
    k = load_kernel("vector_add.cu", "vector_add", backend="cpu")
    assert load_kernel("vector_add.cu", "vector_add", backend="cpu") is k
    assert k.backend == "cpu" and k.filename.endswith("vector_add.cu")


def test_fast_path_detection():
    assert not kernel("atomics.cu", "histogram")._impl.uses_barriers  # plain loop over threads
    assert kernel("matmul_tiled.cu", "matmul_tiled")._impl.uses_barriers  # fibers
    assert kernel("softmax_warp.cu", "softmax_rows")._impl.uses_barriers  # via its __device__ helpers
    src = '#define SYNC __sync##threads()\nextern "C" __global__ void hidden(float* x) { x[0] = 1; SYNC; }\n'
    with pytest.raises(KernelError, match="hidden behind a macro"):
        Kernel(src, "hidden", backend="cpu")((1,), (32,), (np.zeros(1, np.float32),))


def test_kernel_printf_reaches_python_stdout(capsys):
    src = ('extern "C" __global__ void hello(int n) {\n'
           '    if (threadIdx.x == 0) printf("block %d of %d says hi\\n", (int)blockIdx.x, n);\n}\n')
    Kernel(src, "hello", backend="cpu")((3,), (32,), (np.int32(3),))
    out = capsys.readouterr().out
    assert sorted(out.splitlines()) == [f"block {b} of 3 says hi" for b in range(3)]
