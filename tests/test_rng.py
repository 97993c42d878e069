"""Philox-4x32-10 (T18): known-answer vectors, the stream layout, the CUDA kernel bit for bit.

The Random123 known-answer tests pin the generator itself; the CUDA kernel (CPU emulator
here, CuPy on a GPU) must produce the very same uint32 stream as the NumPy implementation.
"""

import numpy as np
import pytest

from xtrain_lessons.runtime.rng import (
    KAT,
    mulhilo32,
    philox4x32,
    philox_round,
    random_bits,
    to_uniform,
    uniform,
)


@pytest.mark.parametrize("counter,key,expected", KAT, ids=["zeros", "ones", "pi"])
def test_known_answer_vectors(counter, key, expected):
    out = philox4x32(np.array(counter, np.uint32), np.array(key, np.uint32))
    assert out.dtype == np.uint32
    assert [f"{v:08x}" for v in out.tolist()] == [f"{v:08x}" for v in expected]


def test_kat_values_are_the_published_ones():
    # the vectors as published (Random123 kat_vectors), spelled out
    assert KAT[0][2] == (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)
    assert KAT[1][2] == (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)
    assert KAT[2][0] == (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344)
    assert KAT[2][1] == (0xA4093822, 0x299F31D0)
    assert KAT[2][2] == (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)


def test_vectorised_equals_one_at_a_time():
    rng = np.random.default_rng(0)
    ctr = rng.integers(0, 2 ** 32, (50, 4), dtype=np.uint64).astype(np.uint32)
    key = rng.integers(0, 2 ** 32, (50, 2), dtype=np.uint64).astype(np.uint32)
    batch = philox4x32(ctr, key)
    for i in range(50):
        assert np.array_equal(batch[i], philox4x32(ctr[i], key[i]))
    one_key = philox4x32(ctr, key[0])  # a (2,) key broadcasts
    assert np.array_equal(one_key[3], philox4x32(ctr[3], key[0]))


def test_mulhilo_and_round_against_python_ints():
    rng = np.random.default_rng(1)
    a = rng.integers(0, 2 ** 32, 1000, dtype=np.uint64).astype(np.uint32)
    b = rng.integers(0, 2 ** 32, 1000, dtype=np.uint64).astype(np.uint32)
    hi, lo = mulhilo32(a, b)
    for x, y, h, l in zip(a.tolist()[:200], b.tolist()[:200], hi.tolist(), lo.tolist()):
        assert (h << 32) | l == x * y
    c, k = [1, 2, 3, 4], [5, 6]
    p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
    want = [(p1 >> 32) ^ c[1] ^ k[0], p1 & 0xFFFFFFFF, (p0 >> 32) ^ c[3] ^ k[1], p0 & 0xFFFFFFFF]
    assert philox_round(np.array(c, np.uint32), np.array(k, np.uint32)).tolist() == want


def test_stream_layout():
    seed, offset, n = 2 ** 40 + 17, 2 ** 35 + 3, 4 * 2 + 3
    bits = random_bits(seed, offset, n)
    for k in range(n):
        ctr = np.array([k // 4, 0, offset & 0xFFFFFFFF, offset >> 32], np.uint32)
        key = np.array([seed & 0xFFFFFFFF, seed >> 32], np.uint32)
        assert bits[k] == philox4x32(ctr, key)[k % 4]
    assert np.array_equal(random_bits(seed, offset, 5), bits[:5])  # prefixes agree
    assert random_bits(1, 2, 0).shape == (0,)
    with pytest.raises(ValueError):
        random_bits(-1, 0, 4)
    with pytest.raises(ValueError):
        random_bits(0, 2 ** 64, 4)


def test_uniform_properties():
    u = uniform(1234, 0, 1 << 20)
    assert u.dtype == np.float32 and u.min() >= 0.0 and u.max() < 1.0
    assert to_uniform(np.array([0, 0xFFFFFFFF], np.uint32)).tolist() == [0.0, 1.0 - 2 ** -24]
    # values are multiples of 2**-24 (exact 24-bit fractions)
    assert np.all((u.astype(np.float64) * 2 ** 24) % 1 == 0)
    # mean and variance of U[0, 1): 1/2 and 1/12, within 6 standard errors
    n = u.size
    assert abs(u.mean() - 0.5) < 6 * np.sqrt(1 / 12 / n)
    assert abs(u.var() - 1 / 12) < 6 * np.sqrt(1 / 180 / n)
    # chi-square over 64 equal bins: mean 63, sd sqrt(126); 6 sd is a very loose bound
    counts = np.bincount((u * 64).astype(np.int64), minlength=64)
    chi2 = ((counts - n / 64) ** 2 / (n / 64)).sum()
    assert chi2 < 63 + 6 * np.sqrt(126)
    # neighbouring values are uncorrelated
    r = np.corrcoef(u[:-1], u[1:])[0, 1]
    assert abs(r) < 6 / np.sqrt(n)


def test_streams_differ_and_are_reproducible():
    a, b = uniform(7, 0, 1000), uniform(7, 1, 1000)
    c = uniform(8, 0, 1000)
    assert np.array_equal(a, uniform(7, 0, 1000))
    assert np.mean(a == b) < 0.01 and np.mean(a == c) < 0.01


# -- the CUDA kernel on the CPU emulator --------------------------------------------------

@pytest.mark.parametrize("seed,offset,n", [(0, 0, 1), (0, 0, 4), (42, 7, 1003),
                                          (2 ** 64 - 1, 2 ** 64 - 1, 517),
                                          (2 ** 40 + 5, 2 ** 33 + 9, 4096 + 2)])
def test_cuda_kernel_bits_equal_numpy(seed, offset, n):
    from xtrain_lessons.runtime.kernels.philox import philox_bits, philox_bits_reference
    got = philox_bits(seed, offset, n)
    assert got.dtype == np.uint32
    assert np.array_equal(got, philox_bits_reference(seed, offset, n))


def test_cuda_kernel_uniform_equal_numpy():
    from xtrain_lessons.runtime.kernels.philox import philox_uniform, philox_uniform_reference
    for seed, offset, n in [(1, 2, 3), (123456789, 10 ** 12, 2050)]:
        got = philox_uniform(seed, offset, n)
        want = philox_uniform_reference(seed, offset, n)
        assert got.dtype == np.float32 and np.array_equal(got.view(np.uint32), want.view(np.uint32))


def test_cuda_kernel_kat_through_the_stream():
    # KAT vector 1 (counter 0, key 0) is block 0 of stream (seed 0, offset 0)
    from xtrain_lessons.runtime.kernels.philox import philox_bits
    assert philox_bits(0, 0, 4).tolist() == list(KAT[0][2])
    assert philox_bits(0, 0, 0).shape == (0,)


@pytest.mark.gpu
def test_cuda_kernel_on_gpu():
    from xtrain_lessons.runtime.device import gpu_available
    if not gpu_available():
        pytest.skip("needs CuPy and an NVIDIA GPU")
    import cupy as cp
    from xtrain_lessons.runtime.kernels.philox import philox_bits
    got = philox_bits(99, 5, 10_001, xp=cp)
    assert np.array_equal(cp.asnumpy(got), random_bits(99, 5, 10_001))
