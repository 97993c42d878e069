"""A counter-based random number generator: Philox-4x32-10 (phase T18).

A stateful generator (NumPy's `default_rng`, `np.random.rand`) is a sequence: the k-th number
depends on the k-1 draws before it, so a second draw — a recompute, another thread, a GPU
thread per element — gives different numbers unless the state is saved and replayed.
A *counter-based* generator is a pure function instead:

    bits = philox4x32(counter, key)      # 4 x uint32 in, 4 x uint32 out, no state

Any element can be computed on its own, in any order, on any device, as often as wanted, and
it is always the same. That is what dropout needs: the forward and the backward (and a
recomputed forward, T13) all regenerate the same mask from a few integers.

Philox-4x32-10 (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3",
SC 2011; the generator of cuRAND's `curandStatePhilox4_32_10` and of PyTorch's CUDA dropout)
is 10 rounds of a cheap bijection of the 128-bit counter (c0, c1, c2, c3) under a 64-bit key
(k0, k1). One round, with the two multipliers M0 = 0xD2511F53 and M1 = 0xCD9E8D57:

    hi0, lo0 = mulhilo(M0, c0)          # the 64-bit product, split into its two halves
    hi1, lo1 = mulhilo(M1, c2)
    (c0, c1, c2, c3) <- (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)

and between rounds the key is bumped by the Weyl constants: k0 += 0x9E3779B9 (golden ratio),
k1 += 0xBB67AE85 (sqrt(3) - 1), modulo 2**32. It passes the BigCrush statistical tests.
Checked here against the known-answer vectors of Random123 (`KAT`).

Public API
----------
philox4x32(counter, key, rounds=10) -> uint32 array (..., 4)
    Vectorised over leading dimensions: counter (..., 4) and key (..., 2) (or (2,)) uint32.
mulhilo32(a, b) -> (hi, lo)     the high and low 32 bits of the 64-bit product a * b.
philox_round(counter, key) -> counter   one round (the building block of the notebook).
random_bits(seed, offset, n) -> uint32 (n,)   the stream: see below.
uniform(seed, offset, n) -> float32 (n,) in [0, 1)
    Element k of stream (seed, offset) is output word k % 4 of
        philox4x32(counter=(k // 4 mod 2**32, k // 4 >> 32, offset mod 2**32, offset >> 32),
                   key=(seed mod 2**32, seed >> 32))
    turned into a float as (bits >> 8) * 2**-24: the top 24 bits, exactly representable in
    float32, so the values are k / 2**24, uniform on [0, 1), never 1.0.
    `offset` selects an independent stream (like cuRAND's subsequence): offsets 0, 1, 2, ...
    never overlap, whatever n. Stateless: the same (seed, offset, n) always gives the same
    numbers; uniform(seed, offset, m) is a prefix of uniform(seed, offset, n) for m <= n.
    seed and offset are integers in [0, 2**64).
to_uniform(bits) -> float32    the bits -> [0, 1) conversion above.
KAT                             [(counter, key, expected output)] of Random123 for philox4x32_10.

The same generator in CUDA C is `xtrain_lessons/runtime/kernels/philox.cu` (launchers in
`xtrain_lessons/runtime/kernels/philox.py`); its output equals this module's bit for bit.
"""

from __future__ import annotations

import numpy as np

__all__ = ["philox4x32", "philox_round", "mulhilo32", "random_bits", "uniform", "to_uniform",
           "KAT", "PHILOX_M0", "PHILOX_M1", "PHILOX_W0", "PHILOX_W1"]

PHILOX_M0 = 0xD2511F53  # round multipliers
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9  # key schedule (Weyl sequence) constants
PHILOX_W1 = 0xBB67AE85

_MASK32 = np.uint64(0xFFFFFFFF)

# Known-answer tests of Random123 (kat_vectors, philox4x32 10 rounds): counter, key, output
KAT = [
    ((0x00000000, 0x00000000, 0x00000000, 0x00000000), (0x00000000, 0x00000000),
     (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF),
     (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def mulhilo32(a, b):
    """(hi, lo): the two 32-bit halves of the 64-bit product of uint32 a and b."""
    p = np.asarray(a, dtype=np.uint64) * np.asarray(b, dtype=np.uint64)  # < 2**64: exact
    return (p >> np.uint64(32)).astype(np.uint32), (p & _MASK32).astype(np.uint32)


def philox_round(counter, key):
    """One Philox-4x32 round: counter (..., 4) and key (..., 2) uint32 -> new counter."""
    c = np.asarray(counter, dtype=np.uint32)
    k = np.asarray(key, dtype=np.uint32)
    hi0, lo0 = mulhilo32(PHILOX_M0, c[..., 0])
    hi1, lo1 = mulhilo32(PHILOX_M1, c[..., 2])
    return np.stack([hi1 ^ c[..., 1] ^ k[..., 0], lo1,
                     hi0 ^ c[..., 3] ^ k[..., 1], lo0], axis=-1)


def philox4x32(counter, key, rounds: int = 10):
    """Philox-4x32 with `rounds` rounds (10 is the standard): (..., 4) uint32 output."""
    c = np.asarray(counter, dtype=np.uint32)
    k = np.asarray(key, dtype=np.uint32)
    if c.shape[-1:] != (4,) or k.shape[-1:] != (2,):
        raise ValueError(f"philox4x32: counter must be (..., 4) and key (..., 2), "
                         f"got {c.shape} and {k.shape}")
    k0, k1 = k[..., 0].copy(), k[..., 1].copy()
    with np.errstate(over="ignore"):  # the key schedule wraps modulo 2**32 on purpose
        for r in range(rounds):
            if r:
                k0 = k0 + np.uint32(PHILOX_W0)
                k1 = k1 + np.uint32(PHILOX_W1)
            c = philox_round(c, np.stack([k0, k1], axis=-1))
    return c


def _split64(v: int, what: str) -> tuple[int, int]:
    v = int(v)
    if not 0 <= v < 2 ** 64:
        raise ValueError(f"{what} must be an integer in [0, 2**64), got {v}")
    return v & 0xFFFFFFFF, v >> 32


def random_bits(seed: int, offset: int, n: int):
    """n uint32 of stream (seed, offset): see the module doc for the layout."""
    n = int(n)
    if n < 0:
        raise ValueError(f"random_bits: n must be >= 0, got {n}")
    s_lo, s_hi = _split64(seed, "seed")
    o_lo, o_hi = _split64(offset, "offset")
    blocks = np.arange((n + 3) // 4, dtype=np.uint64)
    ctr = np.empty((blocks.size, 4), dtype=np.uint32)
    ctr[:, 0] = (blocks & _MASK32).astype(np.uint32)
    ctr[:, 1] = (blocks >> np.uint64(32)).astype(np.uint32)
    ctr[:, 2] = o_lo
    ctr[:, 3] = o_hi
    key = np.array([s_lo, s_hi], dtype=np.uint32)
    return philox4x32(ctr, key).reshape(-1)[:n]


def to_uniform(bits):
    """uint32 -> float32 in [0, 1): the top 24 bits times 2**-24 (exact in float32)."""
    bits = np.asarray(bits, dtype=np.uint32)
    return (bits >> np.uint32(8)).astype(np.float32) * np.float32(2.0 ** -24)


def uniform(seed: int, offset: int, n: int):
    """n float32 uniforms on [0, 1) of stream (seed, offset): stateless, reproducible."""
    return to_uniform(random_bits(seed, offset, n))
