"""kernels/bf16.cu: float32 -> bf16 (round to nearest even) and back, on the CPU emulator,
bit-exact against ml_dtypes (and torch) on every non-NaN input; nvcc compiles the file in
test_nvcc_compile.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from xtrain_lessons.runtime.kernels.bf16 import (
    bf16_to_f32,
    bf16_to_f32_reference,
    f32_to_bf16,
    f32_to_bf16_reference,
)


def hard_values() -> np.ndarray:
    """Random bit patterns (all exponents), ties and their neighbours, subnormals, specials."""
    rng = np.random.default_rng(12)
    bits = [rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)]
    hi = rng.integers(0, 2**16, 10_000, dtype=np.uint32) << 16
    bits += [hi | 0x8000, hi | 0x7FFF, hi | 0x8001, hi]  # ties (even and odd kept bit), neighbours
    bits += [np.arange(0, 2**16, 5, dtype=np.uint32) | s for s in (0, 0x80000000)]  # subnormals
    bits += [np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000,
                       0x7F7F7FFF, 0x00800000, 0x007FFFFF, 0x00008000, 0x00018000, 0x7FC00000,
                       0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0x3F808000, 0x3F818000], np.uint32)]
    return np.concatenate(bits).view(np.float32)


def test_f32_to_bf16_bit_exact_on_the_emulator():
    x = hard_values()
    got, ref = f32_to_bf16(x), f32_to_bf16_reference(x)
    assert got.dtype == np.uint16 and got.shape == x.shape
    nan = np.isnan(x)
    assert nan.sum() > 100
    np.testing.assert_array_equal(got[~nan], ref[~nan])
    assert np.isnan(bf16_to_f32_reference(got[nan])).all()  # NaN stays NaN (pattern 0x7FFF)
    # ties: exactly halfway rounds to the even kept pattern
    assert f32_to_bf16(np.array([0x3F808000, 0x3F818000], np.uint32).view(np.float32)).tolist() \
        == [0x3F80, 0x3F82]


def test_bf16_to_f32_exact_for_all_65536_patterns():
    every = np.arange(2**16, dtype=np.uint16)
    got = bf16_to_f32(every)
    np.testing.assert_array_equal(got.view(np.uint32), every.astype(np.uint32) << 16)
    np.testing.assert_array_equal(got.view(np.uint32), bf16_to_f32_reference(every).view(np.uint32))
    # accepts an ml_dtypes array too; the round trip of a bf16 value is the identity
    b = every.view(ml_dtypes.bfloat16)
    ok = ~np.isnan(b.astype(np.float32))
    np.testing.assert_array_equal(f32_to_bf16(bf16_to_f32(b))[ok], every[ok])


@pytest.mark.parametrize("shape", [(0,), (1,), (255,), (257,), (3, 5, 7)])
def test_shapes_and_partial_blocks(shape):
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    got = f32_to_bf16(x)
    assert got.shape == x.shape
    np.testing.assert_array_equal(got, f32_to_bf16_reference(x))
    np.testing.assert_array_equal(bf16_to_f32(got), x.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_bf16_to_f32_rejects_wrong_dtype():
    with pytest.raises(TypeError):
        bf16_to_f32(np.zeros(3, np.float32))


def test_matches_torch():
    torch = pytest.importorskip("torch")
    x = hard_values()
    ok = ~np.isnan(x)
    t = torch.from_numpy(x.copy()).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(f32_to_bf16(x)[ok], t[ok])


def _gpu() -> bool:
    from xtrain_lessons.runtime.device import gpu_available
    return gpu_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs CuPy and an NVIDIA GPU")
def test_bf16_kernels_on_gpu():
    import cupy as cp
    x = hard_values()
    ok = ~np.isnan(x)
    got = cp.asnumpy(f32_to_bf16(cp.asarray(x)))
    np.testing.assert_array_equal(got[ok], f32_to_bf16_reference(x)[ok])
    every = np.arange(2**16, dtype=np.uint16)
    np.testing.assert_array_equal(cp.asnumpy(bf16_to_f32(cp.asarray(every))).view(np.uint32),
                                  every.astype(np.uint32) << 16)
