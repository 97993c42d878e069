"""Plausible wrong solutions of T12's exercises (format: tests/test_mutants.py; the loss-scale
update's are also run by tests/test_grad_scaler.py)."""

import numpy as np


def update_scale_no_reset_on_inf(scale, tracker, found_inf, growth_factor=2.0, backoff_factor=0.5,
                                 growth_interval=2000):
    if found_inf:
        return np.float32(scale * backoff_factor), tracker  # forgets to restart the count
    tracker += 1
    if tracker == growth_interval:
        return np.float32(scale * growth_factor), 0
    return np.float32(scale), tracker


def update_scale_grows_one_late(scale, tracker, found_inf, growth_factor=2.0, backoff_factor=0.5,
                                growth_interval=2000):
    if found_inf:
        return np.float32(scale * backoff_factor), 0
    if tracker == growth_interval:  # compares before counting this step
        return np.float32(scale * growth_factor), 0
    return np.float32(scale), tracker + 1


def update_scale_grows_to_inf(scale, tracker, found_inf, growth_factor=2.0, backoff_factor=0.5,
                              growth_interval=2000):
    if found_inf:
        return np.float32(scale * backoff_factor), 0
    tracker += 1
    if tracker == growth_interval:
        with np.errstate(over="ignore"):
            return np.float32(scale * np.float32(growth_factor)), 0  # takes an inf scale
    return np.float32(scale), tracker


def update_scale_backoff_is_growth(scale, tracker, found_inf, growth_factor=2.0, backoff_factor=0.5,
                                   growth_interval=2000):
    if found_inf:
        return np.float32(scale / growth_factor), 0  # right for the defaults only
    tracker += 1
    if tracker == growth_interval:
        return np.float32(scale * growth_factor), 0
    return np.float32(scale), tracker


UPDATE_SCALE_MUTANTS = [update_scale_no_reset_on_inf, update_scale_grows_one_late, update_scale_grows_to_inf,
                        update_scale_backoff_is_growth]


_ROUND = """
u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
lsb = (u >> 16) & np.uint32(1)
rounded = (u + np.uint32(0x7FFF) + lsb) >> 16
nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
quiet = ((u >> 16) & np.uint32(0x8000)) | np.uint32(0x7FC0)
return np.where(nan, quiet, rounded).astype(np.uint16)
"""

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
    "T12.3": {f.__name__.replace("_", " "): f for f in UPDATE_SCALE_MUTANTS},
}
