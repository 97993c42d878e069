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
