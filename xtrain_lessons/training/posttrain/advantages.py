"""Group-normalised advantages (T21): how much better each completion did than its siblings.

For one prompt the policy samples a group of G completions with rewards r_1 ... r_G. GRPO's
advantage of completion i:

    A_i = (r_i - mean(r)) / (std(r) + eps)      normalize_by_std=True  (GRPO, DeepSeekMath)
    A_i =  r_i - mean(r)                        normalize_by_std=False (Dr. GRPO: the division
                                                makes a group whose rewards barely differ count
                                                as much as one whose rewards differ a lot)

The std is an estimator with a choice: the sample std (ddof=1: divide the squared deviations by
G - 1, as `torch.std` does and as most implementations use — the default here) or the
population std (ddof=0: divide by G, NumPy's default). They differ by sqrt(G / (G - 1)): 15% at
G = 4, 7% at G = 8. A group whose rewards are all equal gets advantages 0 (no signal).
"""

from __future__ import annotations

import numpy as np

__all__ = ["group_advantages"]


def group_advantages(rewards, eps: float = 1e-4, normalize_by_std: bool = True,
                     ddof: int = 1) -> np.ndarray:
    """Advantages (n_groups, G) float64 of `rewards` (n_groups, G): one group (prompt) per row.

    The baseline is the row's mean; with `normalize_by_std` the difference is divided by the
    row's std (`ddof` 1: sample, 0: population) + eps.
    """
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError(f"group_advantages: rewards must be (n_groups, G), got shape {r.shape}")
    centred = r - r.mean(axis=1, keepdims=True)
    if not normalize_by_std:
        return centred
    if ddof not in (0, 1):
        raise ValueError(f"group_advantages: ddof must be 0 (population std) or 1 (sample std), got {ddof}")
    if r.shape[1] <= ddof:
        raise ValueError(f"group_advantages: a group of {r.shape[1]} has no sample std (ddof={ddof}); "
                         f"use groups of 2 or more")
    return centred / (r.std(axis=1, ddof=ddof, keepdims=True) + eps)
