"""Plausible wrong solutions of T12's exercises (format: tests/test_mutants.py). fp16's loss scaling,
once T12.3, is T12b's (tests/mutants/T12b_fp16.py)."""

import numpy as np

# ---------------------------------------------------------------- T12.1 float32 -> bf16 bits
_ROUND = """
u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
lsb = (u >> 16) & np.uint32(1)
rounded = (u + np.uint32(0x7FFF) + lsb) >> 16
nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
quiet = ((u >> 16) & np.uint32(0x8000)) | np.uint32(0x7FC0)
return np.where(nan, quiet, rounded).astype(np.uint16)
"""

_SIGN_FROM_X = """
u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
mag = u & np.uint32(0x7FFFFFFF)
rounded = (mag + np.uint32(0x7FFF) + ((mag >> 16) & np.uint32(1))) >> 16
negative = np.asarray(x) < 0  # -0.0 < 0 is False: the sign of -0 is lost
rounded = np.where(negative, rounded | np.uint32(0x8000), rounded)
quiet = np.where(negative, np.uint32(0xFFC0), np.uint32(0x7FC0))
return np.where(mag > np.uint32(0x7F800000), quiet, rounded).astype(np.uint16)
"""

_CARRY_DROPPED = """
u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
hi = u >> 16
up = ((u & np.uint32(0xFFFF)) + np.uint32(0x7FFF) + (hi & np.uint32(1))) >> 16  # 0 or 1
rounded = (hi & np.uint32(0xFF80)) | ((hi + up) & np.uint32(0x7F))  # the mantissa field wraps around
nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
quiet = ((u >> 16) & np.uint32(0x8000)) | np.uint32(0x7FC0)
return np.where(nan, quiet, rounded).astype(np.uint16)
"""

_T12_1 = {
    "truncation (no rounding)": (_ROUND.replace("(u + np.uint32(0x7FFF) + lsb) >> 16", "u >> 16"), "above halfway"),
    "ties rounded up, not to even": (_ROUND.replace("np.uint32(0x7FFF) + lsb", "np.uint32(0x8000)"), "ties at 1"),
    "NaN not special-cased (rounds into infinity)": (_ROUND.replace("np.where(nan, quiet, rounded)", "rounded"), "NaN"),
    "NaN sign dropped": (_ROUND.replace("((u >> 16) & np.uint32(0x8000)) | ", ""), "NaN"),
    "infinity taken for a NaN (>= in the NaN test)": (_ROUND.replace(") > np.uint32(0x7F800000)", ") >= np.uint32(0x7F800000)"),
                                                      "±inf"),
    "sign taken from x < 0 (loses -0)": (_SIGN_FROM_X, "±0"),
    "subnormals flushed to zero": (_ROUND.replace(
        "nan = ", "rounded = np.where((u & np.uint32(0x7F800000)) == 0, (u >> 16) & np.uint32(0x8000), rounded)\nnan = "),
        "subnormals"),
    "saturates at 3.39e38 instead of rounding to inf": (_ROUND.replace(
        "nan = ", "top = ((rounded & np.uint32(0x7FFF)) == np.uint32(0x7F80)) & ((u & np.uint32(0x7FFFFFFF)) < np.uint32(0x7F800000))\n"
                  "rounded = np.where(top, rounded - np.uint32(1), rounded)\nnan = "), "3.39e38"),
    "carry out of the mantissa dropped": (_CARRY_DROPPED, "all ones"),
    # issue 37: the right bits in a uint32 array (the integer width is part of the answer)
    "bits returned as uint32": (_ROUND.replace(".astype(np.uint16)", ".astype(np.uint32)"), "dtype uint32 ≠ expected uint16"),
}

# ---------------------------------------------------------------- T12.2 RMSNorm under the policy
_RMSNORM = """
ms = (x * x).mean(axis=-1, keepdims=True)
xhat = x * (np.float32(1.0) / np.sqrt(ms + np.float32(eps)))
return (xhat * weight).astype(low)
"""

_T12_2 = {
    "mean of squares in the storage dtype": (_RMSNORM.replace(
        "ms = (x * x).mean(axis=-1, keepdims=True)",
        "xl = x.astype(low)\nms = (xl * xl).mean(axis=-1, keepdims=True).astype(np.float32)"), "1024 features"),
    "squares in the storage dtype, averaged in float32": (_RMSNORM.replace(
        "ms = (x * x).mean(axis=-1, keepdims=True)",
        "xl = x.astype(low)\nms = (xl * xl).astype(np.float32).mean(axis=-1, keepdims=True)"), "300"),
    "squares in fp16 with the overflow clipped (underflow missed)": (_RMSNORM.replace(
        "ms = (x * x).mean(axis=-1, keepdims=True)",
        "xl = x.astype(low)\nwith np.errstate(over='ignore'):\n    sq = (xl * xl).astype(np.float32)\n"
        "sq = np.where(np.isinf(sq), (x * x), sq)\nms = sq.mean(axis=-1, keepdims=True)"), "1e-4"),
    "output left in float32 (no memory saved)": (_RMSNORM.replace("(xhat * weight).astype(low)", "xhat * weight"), "output dtype"),
    "eps outside the square root": (_RMSNORM.replace("np.sqrt(ms + np.float32(eps))", "(np.sqrt(ms) + np.float32(eps))"),
                                    "quiet row"),
    "LayerNorm's centring (subtracts the mean)": (_RMSNORM.replace(
        "ms = (x * x).mean(axis=-1, keepdims=True)",
        "x = x - x.mean(axis=-1, keepdims=True)\nms = (x * x).mean(axis=-1, keepdims=True)"), ""),
}


# ---------------------------------------------------------------- T12.3 the spacing of bf16 values
_ULP = """
bits = f32_to_bf16_bits(np.abs(np.asarray(w, np.float32))).astype(np.uint32)
below, above = (bits << 16).view(np.float32), ((bits + 1) << 16).view(np.float32)
return above - below
"""

_T12_3 = {
    "the exponent formula 2^(floor(log2|w|) - 7)": ("""
with np.errstate(divide="ignore"):
    return (2.0 ** (np.floor(np.log2(np.abs(np.asarray(w, np.float32)))) - 7)).astype(np.float32)
""", "round up to a power of two"),
    "the exponent field of w, not of w rounded": ("""
e = (np.asarray(w, np.float32).view(np.uint32) >> 23) & np.uint32(0xFF)
return (np.maximum(e, 1).astype(np.uint32) - 7 << 23).view(np.float32)
""", "round up to a power of two"),
    "the gap to the value below (pattern - 1)": (_ULP.replace(
        "below, above = (bits << 16).view(np.float32), ((bits + 1) << 16).view(np.float32)",
        "below, above = ((bits - 1) << 16).view(np.float32), (bits << 16).view(np.float32)"), "round up to a power of two"),
    "the sign kept (no |w|)": (_ULP.replace("np.abs(np.asarray(w, np.float32))", "np.asarray(w, np.float32)"), "negative"),
    "returned as float64": (_ULP.replace("return above - below", "return above.astype(np.float64) - below"),
                            "dtype float64"),
    "zero's gap taken as 0": (_ULP.replace("return above - below", "return np.where(bits == 0, np.float32(0), above - below)"),
                              "±0"),
}

MUTANTS = {"T12.1": _T12_1, "T12.2": _T12_2, "T12.3": _T12_3}
