"""Plausible wrong solutions of T12's exercises (format: tests/test_mutants.py). The loss-scale
update's, in the old (scale, tracker) signature, are also run by tests/test_grad_scaler.py
(UPDATE_SCALE_MUTANTS)."""

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


# ---------------------------------------------------------------- T12.3 the loss scale's update
def update_scale_backoff_uncounted(state, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    scale, tracker, skipped = (np.float32(v) for v in state)
    if found_inf:
        return np.array([scale * np.float32(backoff_factor), 0, skipped], np.float32)  # the skipped step not counted
    tracker += 1
    if tracker == growth_interval:
        with np.errstate(over="ignore"):
            grown = scale * np.float32(growth_factor)
        scale, tracker = (grown if np.isfinite(grown) else scale), 0
    return np.array([scale, tracker, skipped], np.float32)


def update_scale_no_reset_on_inf(state, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    scale, tracker, skipped = (np.float32(v) for v in state)
    if found_inf:
        return np.array([scale * np.float32(backoff_factor), tracker, skipped + 1], np.float32)  # count not restarted
    tracker += 1
    if tracker == growth_interval:
        with np.errstate(over="ignore"):
            grown = scale * np.float32(growth_factor)
        scale, tracker = (grown if np.isfinite(grown) else scale), 0
    return np.array([scale, tracker, skipped], np.float32)


def update_scale_no_reset_after_growth(state, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    scale, tracker, skipped = (np.float32(v) for v in state)
    if found_inf:
        return np.array([scale * np.float32(backoff_factor), 0, skipped + 1], np.float32)
    tracker += 1
    if tracker == growth_interval:
        with np.errstate(over="ignore"):
            grown = scale * np.float32(growth_factor)
        scale = grown if np.isfinite(grown) else scale  # the count keeps going
    return np.array([scale, tracker, skipped], np.float32)


def update_scale_grows_one_late(state, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    scale, tracker, skipped = (np.float32(v) for v in state)
    if found_inf:
        return np.array([scale * np.float32(backoff_factor), 0, skipped + 1], np.float32)
    if tracker == growth_interval:  # compares before counting this step
        with np.errstate(over="ignore"):
            grown = scale * np.float32(growth_factor)
        return np.array([grown if np.isfinite(grown) else scale, 0, skipped], np.float32)
    return np.array([scale, tracker + 1, skipped], np.float32)


def update_scale_grows_to_inf(state, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    scale, tracker, skipped = (np.float32(v) for v in state)
    if found_inf:
        return np.array([scale * np.float32(backoff_factor), 0, skipped + 1], np.float32)
    tracker += 1
    if tracker == growth_interval:
        with np.errstate(over="ignore"):
            scale, tracker = scale * np.float32(growth_factor), 0  # takes an inf scale
    return np.array([scale, tracker, skipped], np.float32)


def update_scale_clamps_to_max(state, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    scale, tracker, skipped = (np.float32(v) for v in state)
    if found_inf:
        return np.array([scale * np.float32(backoff_factor), 0, skipped + 1], np.float32)
    tracker += 1
    if tracker == growth_interval:
        with np.errstate(over="ignore"):
            scale, tracker = min(scale * np.float32(growth_factor), np.finfo(np.float32).max), 0  # saturates
    return np.array([scale, tracker, skipped], np.float32)


def update_scale_backoff_is_growth(state, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    scale, tracker, skipped = (np.float32(v) for v in state)
    if found_inf:
        return np.array([scale / np.float32(growth_factor), 0, skipped + 1], np.float32)  # right for the defaults only
    tracker += 1
    if tracker == growth_interval:
        with np.errstate(over="ignore"):
            grown = scale * np.float32(growth_factor)
        scale, tracker = (grown if np.isfinite(grown) else scale), 0
    return np.array([scale, tracker, skipped], np.float32)


def update_scale_skips_counted_always(state, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    scale, tracker, skipped = (np.float32(v) for v in state)
    skipped += 1  # counts every step as skipped
    if found_inf:
        return np.array([scale * np.float32(backoff_factor), 0, skipped], np.float32)
    tracker += 1
    if tracker == growth_interval:
        with np.errstate(over="ignore"):
            grown = scale * np.float32(growth_factor)
        scale, tracker = (grown if np.isfinite(grown) else scale), 0
    return np.array([scale, tracker, skipped], np.float32)


def update_scale_float64_state(state, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    scale, tracker, skipped = (float(v) for v in state)  # Python floats: the state comes back float64
    if found_inf:
        return np.array([scale * backoff_factor, 0, skipped + 1])
    tracker += 1
    if tracker == growth_interval:
        grown = scale * growth_factor
        scale, tracker = (grown if np.isfinite(np.float32(grown)) else scale), 0
    return np.array([scale, tracker, skipped])


_T12_3 = {
    "backs off without counting the skipped step": (update_scale_backoff_uncounted, "an overflow step"),
    "tracker not reset on an overflow": (update_scale_no_reset_on_inf, "after 5 clean steps"),
    "tracker not reset after growth": (update_scale_no_reset_after_growth, "2000th"),
    "grows one step late (compares before counting)": (update_scale_grows_one_late, "2000th"),
    "the scale grows to inf": (update_scale_grows_to_inf, "3e38"),
    "a grown scale clamped to float32's max": (update_scale_clamps_to_max, "3e38"),
    "backs off by 1 / growth_factor": (update_scale_backoff_is_growth, "backoff_factor 0.125"),
    "every step counted as skipped": (update_scale_skips_counted_always, "after skipped ones"),
    "the state returned as float64": (update_scale_float64_state, "dtype"),
}

MUTANTS = {"T12.1": _T12_1, "T12.2": _T12_2, "T12.3": _T12_3}


# ---------------------------------------------------------------- the old signature, for tests/test_grad_scaler.py
def _scale_and_tracker(f):
    """A state-form mutant as update_scale(scale, tracker, found_inf, ...) -> (np.float32 scale, int tracker)."""
    def wrong(scale, tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        s = f(np.array([scale, tracker, 0], np.float32), found_inf, growth_factor, backoff_factor, growth_interval)
        return np.float32(s[0]), int(s[1])
    wrong.__name__ = f.__name__
    return wrong


# the mutants that change the scale or the tracker (the old signature has no skipped count)
UPDATE_SCALE_MUTANTS = [_scale_and_tracker(f) for f in (update_scale_no_reset_on_inf, update_scale_no_reset_after_growth,
                                                        update_scale_grows_one_late, update_scale_grows_to_inf,
                                                        update_scale_clamps_to_max)]
