"""Wrong solutions of T12's exercises that the checks must fail (tests/test_grad_scaler.py)."""

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
