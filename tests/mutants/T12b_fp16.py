"""Plausible wrong solutions of T12b's exercises (format: tests/test_mutants.py). The loss-scale
update's (T12b.1), in the old (scale, tracker) signature, are also run by tests/test_grad_scaler.py
(UPDATE_SCALE_MUTANTS)."""

import numpy as np

# ---------------------------------------------------------------- T12b.1 the loss scale's update (was T12.3)
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


_T12B_1 = {
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


# ---------------------------------------------------------------- T12b.2 unscale and find the overflow
_UNSCALE = """
inv = np.float32(1.0 / scale)
unscaled, found_inf = [], False
for g in grads:
    if g is None:
        unscaled.append(None)
        continue
    found_inf = found_inf or not bool(np.isfinite(g).all())
    unscaled.append(g * inv)
return unscaled, found_inf
"""

_T12B_2 = {
    "np.isinf: a NaN is missed": (_UNSCALE.replace("not bool(np.isfinite(g).all())", "bool(np.isinf(g).any())"), "NaN"),
    "only the first gradient checked": (_UNSCALE.replace(
        "found_inf = found_inf or not bool(np.isfinite(g).all())",
        "found_inf = found_inf if unscaled else not bool(np.isfinite(g).all())"), "last gradient"),
    "unscaled in place (g *= inv)": (_UNSCALE.replace("unscaled.append(g * inv)", "g *= inv\n    unscaled.append(g)"),
                                     "in place"),
    "the reciprocal in float64 (results float64)": (_UNSCALE.replace("inv = np.float32(1.0 / scale)", "inv = np.float64(1.0 / scale)"),
                                                   "dtype float64"),
    "None dropped from the list": (_UNSCALE.replace("        unscaled.append(None)\n", ""), "no gradient"),
    "None not skipped": (_UNSCALE.replace("    if g is None:\n        unscaled.append(None)\n        continue\n", ""),
                         "no gradient"),
    "the reciprocal rounded to fp16": (_UNSCALE.replace("inv = np.float32(1.0 / scale)", "inv = np.float16(1.0 / scale)"),
                                       "1000"),
    "found_inf per gradient (a list)": ("""
inv = np.float32(1.0 / scale)
unscaled = [None if g is None else g * inv for g in grads]
return unscaled, [g is not None and not bool(np.isfinite(g).all()) for g in grads]
""", "one bool"),
    "non-finite values zeroed": (_UNSCALE.replace("unscaled.append(g * inv)", "unscaled.append(np.nan_to_num(g * inv, nan=0.0, posinf=0.0, neginf=0.0))"),
                                 "-inf"),
}

# ---------------------------------------------------------------- T12b.3 what fp16 does to a gradient
_FATE = """
g = np.asarray(g, np.float32)
with np.errstate(over="ignore"):
    h = np.abs((g * np.float32(scale)).astype(np.float16))
lost = int(((g != 0) & (h == 0)).sum())
subnormal = int(((h > 0) & (h < np.finfo(np.float16).smallest_normal)).sum())
return lost, subnormal, int(np.isinf(h).sum())
"""

_THRESHOLDS = """
s = np.abs(np.asarray(g, np.float64) * scale)
fi = np.finfo(np.float16)
sub, normal, top = float(fi.smallest_subnormal), float(fi.smallest_normal), float(fi.max)
lost = int(((s > 0) & (s < sub / 2)).sum())
return lost, int(((s >= sub / 2) & (s < normal)).sum()), int((s > top).sum())
"""

_T12B_3 = {
    "thresholds on |g·S| instead of rounding": (_THRESHOLDS, "a tie"),
    "no |.|: negative gradients never subnormal": (_FATE.replace(
        "h = np.abs((g * np.float32(scale)).astype(np.float16))", "h = (g * np.float32(scale)).astype(np.float16)"),
        "negative"),
    "zeros in float32 counted as lost": (_FATE.replace("((g != 0) & (h == 0))", "(h == 0)"), "0 in float32"),
    "subnormal judged before rounding": (_FATE.replace(
        "subnormal = int(((h > 0) & (h < np.finfo(np.float16).smallest_normal)).sum())",
        "s = np.abs(g * np.float32(scale))\nsubnormal = int(((h > 0) & (s < np.finfo(np.float16).smallest_normal)).sum())"),
        "smallest normal"),
    "overflow above 65504 instead of rounding to inf": (_FATE.replace(
        "int(np.isinf(h).sum())", "int((np.abs(g * np.float32(scale)) > 65504).sum())"), "65520"),
    "scaled after the rounding": (_FATE.replace(
        "h = np.abs((g * np.float32(scale)).astype(np.float16))",
        "h = np.abs(g.astype(np.float16) * scale)"), "S = 2^16"),
    "fractions instead of counts": (_FATE.replace(
        "return lost, subnormal, int(np.isinf(h).sum())", "return lost / g.size, subnormal / g.size, float(np.isinf(h).mean())"),
        "dtype"),
}

MUTANTS = {"T12b.1": _T12B_1, "T12b.2": _T12B_2, "T12b.3": _T12B_3}


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
