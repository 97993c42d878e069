"""From per-token losses to one number: the aggregation, a named choice (T20, T21).

Every loss of post-training is first a (B, T) array of per-token values l[b, t] with a response
mask m[b, t] (n_b = sum_t m[b, t] tokens in sequence b). How they become one scalar is a choice
practitioners argue about, because it decides how much each token — and so each answer, long
or short — weighs in the gradient:

    "sequence_mean"  (1/B) sum_b (1/n_b) sum_t m l    the mean over each answer's tokens, then
                                                      over answers: GRPO as published; every
                                                      answer counts once, whatever its length
    "constant"       (1/C) sum_b sum_t m l           a masked sum over a constant C fixed in
                                                      advance (Dr. GRPO: C = B x the generation
                                                      budget; SFT with gradient accumulation: the
                                                      tokens of the whole batch): every token
                                                      weighs the same, in every batch
    "token_mean"     sum m l / sum m                  the token-weighted mean (T10's loss, DAPO):
                                                      every token of THIS batch weighs the same

Each is a weight per token, w[b, t] (`token_weights`), and the loss is sum w l. Under the
sequence mean a token of a 2-token answer weighs 10x one of a 20-token answer: a wrong long
answer is pushed down less per token than a wrong short one (the length bias Dr. GRPO removes).
A row without tokens weighs nothing (it still counts in B for the sequence mean).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.runtime.device import array_module

__all__ = ["AGGREGATIONS", "token_weights", "aggregate", "masked_mean_per_sequence",
           "masked_normalize", "masked_token_mean"]

AGGREGATIONS = ("sequence_mean", "constant", "token_mean")


def token_weights(mask, how: str = "sequence_mean", constant: float | None = None) -> np.ndarray:
    """The weight (B, T) float64 of each token in the aggregation `how` (module docstring)."""
    m = np.asarray(mask, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"aggregate: the mask must be (B, T), got shape {m.shape}")
    if how == "sequence_mean":
        return m / (np.maximum(m.sum(axis=1, keepdims=True), 1.0) * m.shape[0])
    if how == "constant":
        if constant is None or not constant > 0:
            raise ValueError(f"aggregate 'constant' needs a constant > 0, got {constant!r}")
        return m / float(constant)
    if how == "token_mean":
        return m / max(m.sum(), 1.0)
    raise ValueError(f"unknown aggregation {how!r}: choose one of {', '.join(AGGREGATIONS)}")


def aggregate(values, mask, how: str = "sequence_mean", constant: float | None = None):
    """sum_{b,t} w[b, t] values[b, t] with the weights of `how`: a scalar Tensor when `values`
    is a Tensor (the gradient flows), else a float."""
    w = token_weights(mask, how, constant)
    if isinstance(values, Tensor):
        xp = array_module(values.data)
        return ops.sum(values * xp.asarray(w, dtype=values.dtype))
    return float((np.asarray(values, dtype=np.float64) * w).sum())


def masked_mean_per_sequence(values, mask):
    """(1/B) sum_b (1/n_b) sum_t values[b, t] mask[b, t]: GRPO's aggregation."""
    return aggregate(values, mask, "sequence_mean")


def masked_normalize(values, mask, constant: float):
    """sum_{b,t} values[b, t] mask[b, t] / constant: Dr. GRPO's and SFT's aggregation."""
    return aggregate(values, mask, "constant", constant)


def masked_token_mean(values, mask):
    """sum values * mask / sum mask: the token-weighted mean."""
    return aggregate(values, mask, "token_mean")
