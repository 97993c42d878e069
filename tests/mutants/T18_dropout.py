"""Plausible wrong solutions of T18's exercises (format: tests/test_mutants.py)."""

_ROUND = """
c = counter.astype(np.uint64)
p0, p1 = M0 * c[..., 0], M1 * c[..., 2]
hi0, lo0 = p0 >> np.uint64(32), p0 & np.uint64(0xFFFFFFFF)
hi1, lo1 = p1 >> np.uint64(32), p1 & np.uint64(0xFFFFFFFF)
k = key.astype(np.uint64)
out = np.stack([hi1 ^ c[..., 1] ^ k[..., 0], lo1, hi0 ^ c[..., 3] ^ k[..., 1], lo0], axis=-1)
return out.astype(np.uint32)
"""
_DROP = """
u = uniform(seed, offset, x.size).reshape(x.shape)
scale = x.dtype.type(1.0 / (1.0 - p))
return np.where(u >= np.float32(p), x * scale, x.dtype.type(0))
"""

MUTANTS = {
    "T18.1": {
        "output words in the wrong order": _ROUND.replace(
            "[hi1 ^ c[..., 1] ^ k[..., 0], lo1, hi0 ^ c[..., 3] ^ k[..., 1], lo0]",
            "[hi0 ^ c[..., 1] ^ k[..., 0], lo0, hi1 ^ c[..., 3] ^ k[..., 1], lo1]"),
        "multiplied in uint32 (high words lost)": _ROUND.replace("c = counter.astype(np.uint64)",
                                                                "c = counter.astype(np.uint32).astype(np.uint64) & np.uint64(0xFFFF)"),
        "keys swapped": _ROUND.replace("k[..., 0], lo1", "k[..., 1], lo1").replace("k[..., 1], lo0", "k[..., 0], lo0"),
    },
    "T18.2": {
        "no 1 / (1 - p) rescaling": _DROP.replace("x * scale", "x"),
        "keep test reversed (u < p kept)": _DROP.replace("u >= np.float32(p)", "u < np.float32(p)"),
        "offset ignored (same mask for every call)": _DROP.replace("uniform(seed, offset, x.size)", "uniform(seed, 0, x.size)"),
        "float64 result (scale as np.float64)": _DROP.replace("x.dtype.type(1.0 / (1.0 - p))", "np.float64(1.0 / (1.0 - p))"),
    },
}

_BITS = """
blocks = np.arange((n + 3) // 4, dtype=np.uint64)
counter = np.zeros((blocks.size, 4), dtype=np.uint32)
counter[:, 0] = blocks & np.uint64(0xFFFFFFFF)
counter[:, 1] = blocks >> np.uint64(32)
counter[:, 2], counter[:, 3] = offset & 0xFFFFFFFF, offset >> 32
key = np.array([seed & 0xFFFFFFFF, seed >> 32], dtype=np.uint32)
return philox4x32(counter, key).reshape(-1)[:n]
"""
_BACK = """
u = uniform(seed, offset, g.size).reshape(g.shape)
return np.where(u >= np.float32(p), g * g.dtype.type(1.0 / (1.0 - p)), g.dtype.type(0))
"""

MUTANTS["T18.3"] = {
    "offset's high word dropped": _BITS.replace("offset >> 32", "0"),
    "seed's high word dropped": _BITS.replace("seed >> 32", "0"),
    "block number and offset in swapped counter words": _BITS.replace(
        "counter[:, 0] = blocks & np.uint64(0xFFFFFFFF)", "counter[:, 2] = blocks & np.uint64(0xFFFFFFFF)").replace(
        "counter[:, 2], counter[:, 3] = offset", "counter[:, 0], counter[:, 3] = offset"),
    "words flattened block-column first (Fortran order)": _BITS.replace(".reshape(-1)[:n]", ".reshape(-1, order='F')[:n]"),
    "blocks numbered from 1": _BITS.replace("np.arange((n + 3) // 4, dtype=np.uint64)", "np.arange(1, (n + 3) // 4 + 1, dtype=np.uint64)"),
    "the last partial block not trimmed": _BITS.replace(".reshape(-1)[:n]", ".reshape(-1)"),
}
MUTANTS["T18.4"] = {
    "mask read off the output (y != 0)": ("""
        return np.where(y != 0, g * g.dtype.type(1.0 / (1.0 - p)), g.dtype.type(0))
    """, "exact zeros"),
    "no 1 / (1 - p) in the backward": _BACK.replace("g * g.dtype.type(1.0 / (1.0 - p))", "g"),
    "the next stream (offset + 1)": _BACK.replace("uniform(seed, offset, g.size)", "uniform(seed, offset + 1, g.size)"),
    "a fresh mask from a stateful generator": """
        u = np.random.default_rng(seed).random(g.shape, dtype=np.float32)
        return np.where(u >= np.float32(p), g * g.dtype.type(1.0 / (1.0 - p)), g.dtype.type(0))
    """,
    "float64 gradient": _BACK.replace("g.dtype.type(1.0 / (1.0 - p))", "np.float64(1.0 / (1.0 - p))"),
}
