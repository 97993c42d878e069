"""Plausible wrong solutions of T12's exercises (format: tests/test_mutants.py)."""

_ROUND = """
u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
lsb = (u >> 16) & np.uint32(1)
rounded = (u + np.uint32(0x7FFF) + lsb) >> 16
nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
quiet = ((u >> 16) & np.uint32(0x8000)) | np.uint32(0x7FC0)
return np.where(nan, quiet, rounded).astype(np.uint16)
"""

# Mutants the check lets through until the change reported to the lead is applied (the runner
# asserts they still pass, so the entry is removed once the check catches them):
# T12.2: add a case whose elements are not already bf16 values (this one: 163 vs 162), e.g.
#   (np.random.default_rng(0).uniform(0, 1, 300).astype(np.float32), BF16)
AWAITING_CHECK_FIX = {"T12.2": ["elements not rounded to dtype first"]}

MUTANTS = {
    "T12.1": {
        "truncation (no rounding)": _ROUND.replace("(u + np.uint32(0x7FFF) + lsb) >> 16", "u >> 16"),
        "ties rounded up, not to even": _ROUND.replace("np.uint32(0x7FFF) + lsb", "np.uint32(0x8000)"),
        "NaN not special-cased (rounds into infinity)": _ROUND.replace("np.where(nan, quiet, rounded)", "rounded"),
        "NaN sign dropped": _ROUND.replace("((u >> 16) & np.uint32(0x8000)) | ", ""),
    },
    "T12.2": {
        "summed in float32, rounded once at the end": """
            total = np.float32(0.0)
            for v in np.asarray(x, dtype=np.float32).astype(dtype).astype(np.float32):
                total = np.float32(total + v)
            return np.float32(dtype(total))
        """,
        "elements not rounded to dtype first": """
            total = np.float32(0.0)
            for v in np.asarray(x, dtype=np.float32):
                total = np.float32(dtype(total + v))
            return total
        """,
        "rounded before each addition, not after": """
            total = np.float32(0.0)
            for v in np.asarray(x, dtype=np.float32).astype(dtype).astype(np.float32):
                total = np.float32(np.float32(dtype(total)) + v)
            return total
        """,
    },
}
