"""Plausible wrong solutions of the T21_grpo exercises, each of which its check must reject.

tests/test_mutants.py runs every mutant through the notebook's own check cells
(solutions/T21_grpo.ipynb); tests/test_mutants_T21.py runs the quick ones through the same
cases, built here (`cases_*`), without executing the notebook.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor, no_grad
from xtrain_lessons.model.batching import pad_batch
from xtrain_lessons.training.posttrain.aggregate import aggregate as xl_aggregate
from xtrain_lessons.training.posttrain.logprobs import token_logprobs
from xtrain_lessons.training.posttrain.rollouts import Rollout


# ----- T21.2 group_advantages -------------------------------------------------------------

def adv_ddof_off_by_one(rewards, eps=1e-4, normalize_by_std=True, ddof=1):
    """The std's ddof off by one: the population std where the sample std is asked, and back."""
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean(axis=1, keepdims=True)
    if not normalize_by_std:
        return centred
    return centred / (r.std(axis=1, ddof=1 - ddof, keepdims=True) + eps)


def adv_mean_over_wrong_axis(rewards, eps=1e-4, normalize_by_std=True, ddof=1):
    """The mean and std of each column (axis 0) instead of each group (row)."""
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean(axis=0, keepdims=True)
    if not normalize_by_std:
        return centred
    return centred / (r.std(axis=0, ddof=ddof, keepdims=True) + eps)


def adv_global_baseline(rewards, eps=1e-4, normalize_by_std=True, ddof=1):
    """The mean and std of the whole batch, not of each group."""
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean()
    return centred / (r.std(ddof=ddof) + eps) if normalize_by_std else centred


def adv_always_divides(rewards, eps=1e-4, normalize_by_std=True, ddof=1):
    """normalize_by_std ignored: always divided by the std."""
    r = np.asarray(rewards, dtype=np.float64)
    return (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, ddof=ddof, keepdims=True) + eps)


def adv_eps_inside_sqrt(rewards, eps=1e-4, normalize_by_std=True, ddof=1):
    """eps added to the variance under the square root."""
    r = np.asarray(rewards, dtype=np.float64)
    centred = r - r.mean(axis=1, keepdims=True)
    if not normalize_by_std:
        return centred
    return centred / np.sqrt(r.var(axis=1, ddof=ddof, keepdims=True) + eps)


ADVANTAGES = [adv_ddof_off_by_one, adv_mean_over_wrong_axis, adv_global_baseline, adv_always_divides,
              adv_eps_inside_sqrt]


# ----- T21.3 aggregate --------------------------------------------------------------------

def agg_divides_by_sequences(values, mask, how="sequence_mean", constant=None):
    """"constant": the masked sum divided by the number of sequences instead of the constant."""
    values, mask = np.asarray(values, dtype=np.float64), np.asarray(mask, dtype=np.float64)
    total = values * mask
    if how == "sequence_mean":
        return float((total.sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)).mean())
    if how == "constant":
        return float(total.sum() / mask.shape[0])
    return float(total.sum() / max(mask.sum(), 1.0))


def agg_divides_by_padded_length(values, mask, how="sequence_mean", constant=None):
    """The sequence mean over the wrong axis length: each row divided by T, not by its n_b."""
    values, mask = np.asarray(values, dtype=np.float64), np.asarray(mask, dtype=np.float64)
    total = values * mask
    if how == "sequence_mean":
        return float((total.sum(axis=1) / mask.shape[1]).mean())
    if how == "constant":
        return float(total.sum() / constant)
    return float(total.sum() / max(mask.sum(), 1.0))


def agg_padding_left_in(values, mask, how="sequence_mean", constant=None):
    """The values summed without the mask: prompt and padding positions count."""
    values, mask = np.asarray(values, dtype=np.float64), np.asarray(mask, dtype=np.float64)
    if how == "sequence_mean":
        return float((values.sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)).mean())
    if how == "constant":
        return float(values.sum() / constant)
    return float(values.sum() / max(mask.sum(), 1.0))


def agg_skips_empty_rows(values, mask, how="sequence_mean", constant=None):
    """The sequence mean over the non-empty rows only (an empty row should still count in B)."""
    values, mask = np.asarray(values, dtype=np.float64), np.asarray(mask, dtype=np.float64)
    total = values * mask
    n = mask.sum(axis=1)
    if how == "sequence_mean":
        keep = n > 0
        return float((total.sum(axis=1)[keep] / n[keep]).mean())
    if how == "constant":
        return float(total.sum() / constant)
    return float(total.sum() / max(mask.sum(), 1.0))


def agg_divides_by_zero_in_where(values, mask, how="sequence_mean", constant=None):
    """Right values, but n_b = 0 divided inside np.where (both branches are computed: a warning)."""
    values, mask = np.asarray(values, dtype=np.float64), np.asarray(mask, dtype=np.float64)
    total = values * mask
    n = mask.sum(axis=1)
    if how == "sequence_mean":
        return float(np.where(n > 0, total.sum(axis=1) / n, 0.0).mean())
    if how == "constant":
        return float(total.sum() / constant)
    return float(total.sum() / max(mask.sum(), 1.0))


def agg_token_mean_of_sequence_means(values, mask, how="sequence_mean", constant=None):
    """"token_mean" computed as the sequence mean (each answer once, not each token)."""
    values, mask = np.asarray(values, dtype=np.float64), np.asarray(mask, dtype=np.float64)
    total = values * mask
    if how == "constant":
        return float(total.sum() / constant)
    return float((total.sum(axis=1) / np.maximum(mask.sum(axis=1), 1.0)).mean())


AGGREGATES = [agg_divides_by_sequences, agg_divides_by_padded_length, agg_padding_left_in, agg_skips_empty_rows,
              (agg_divides_by_zero_in_where, "np.where"), agg_token_mean_of_sequence_means]


# ----- T21.4 clipped_loss_per_token -------------------------------------------------------

def _pieces(logp, old_logp, adv):
    A = np.asarray(adv, dtype=logp.dtype)[:, None]
    ratio = ops.exp(logp - old_logp)
    return A, ratio, ratio * A


def clip_none(logp, old_logp, adv, eps=0.2):
    """No clipping at all: the plain importance-weighted policy gradient."""
    return -_pieces(logp, old_logp, adv)[2]


def clip_wrong_side_for_negative_advantage(logp, old_logp, adv, eps=0.2):
    """For A < 0 the gradient is stopped above 1 + eps (as for A > 0), not below 1 - eps."""
    A, ratio, unclipped = _pieces(logp, old_logp, adv)
    stop = (ratio.data > 1 + eps) & (A != 0)
    const = Tensor(np.clip(ratio.data, 1 - eps, 1 + eps) * A * np.ones_like(ratio.data))
    return -ops.where(stop, const, unclipped)


def clip_both_directions(logp, old_logp, adv, eps=0.2):
    """Stops the gradient whenever the ratio leaves the range, whatever the advantage's sign."""
    A, ratio, unclipped = _pieces(logp, old_logp, adv)
    outside = (ratio.data < 1 - eps) | (ratio.data > 1 + eps)
    const = Tensor(np.clip(ratio.data, 1 - eps, 1 + eps) * A)
    return -ops.where(outside, const, unclipped)


def clip_max(logp, old_logp, adv, eps=0.2):
    """max instead of min: the pessimistic bound turned optimistic."""
    A, ratio, unclipped = _pieces(logp, old_logp, adv)
    clipped = np.clip(ratio.data, 1 - eps, 1 + eps) * A
    return -ops.where(unclipped.data >= clipped, unclipped, Tensor(clipped))


def clip_fixed_eps(logp, old_logp, adv, eps=0.2):
    """The clip range hard-coded to 0.2 whatever eps is given."""
    A, ratio, unclipped = _pieces(logp, old_logp, adv)
    clipped = np.clip(ratio.data, 0.8, 1.2) * A
    return -ops.where(unclipped.data <= clipped, unclipped, Tensor(clipped))


CLIPPED = [clip_none, (clip_wrong_side_for_negative_advantage, "A < 0"), clip_both_directions, clip_max, clip_fixed_eps]


# ----- T21.6 completion_logprobs_batched --------------------------------------------------

def batched_left_padded(model, rollouts, pad_id=0):
    """Left padding: the real tokens sit at other positions (RoPE) and see the pads."""
    seqs = [list(r.prompt_ids) + list(r.ids) for r in rollouts]
    T = max(len(s) for s in seqs) - 1
    ids = np.full((len(seqs), T), pad_id, dtype=np.int64)
    targets = np.full((len(seqs), T), pad_id, dtype=np.int64)
    for b, s in enumerate(seqs):
        ids[b, T - len(s) + 1:] = s[:-1]
        targets[b, T - len(s) + 1:] = s[1:]
    with no_grad():
        lp = token_logprobs(model(ids), targets).numpy()
    return [lp[b, T - len(r.ids):] for b, r in enumerate(rollouts)]


def batched_off_by_one(model, rollouts, pad_id=0):
    """Slices from len(prompt) instead of len(prompt) - 1: drops the first completion token."""
    seqs = [list(r.prompt_ids) + list(r.ids) for r in rollouts]
    ids, _ = pad_batch([s[:-1] for s in seqs], pad_id)
    targets, _ = pad_batch([s[1:] for s in seqs], pad_id)
    with no_grad():
        lp = token_logprobs(model(ids), targets).numpy()
    return [lp[b, len(r.prompt_ids):len(r.prompt_ids) + len(r.ids)] for b, r in enumerate(rollouts)]


def batched_no_shift(model, rollouts, pad_id=0):
    """Scores token t with the logits at position t (which predict token t + 1)."""
    seqs = [list(r.prompt_ids) + list(r.ids) for r in rollouts]
    ids, _ = pad_batch(seqs, pad_id)
    with no_grad():
        lp = token_logprobs(model(ids), ids).numpy()
    return [lp[b, len(r.prompt_ids):len(r.prompt_ids) + len(r.ids)] for b, r in enumerate(rollouts)]


GATES = [batched_left_padded, batched_off_by_one, batched_no_shift]


# ----- the notebook's references and cases --------------------------------------------------

# ----- T21.1 reinforce_grad (the bandit) ---------------------------------------------------

def _softmax(theta):
    z = np.exp(theta - theta.max())
    return z / z.sum()


def reinforce_onehot_only(theta, actions, rewards, baseline=0.0):
    """grad log pi(a) taken as e_a: the - pi term of the softmax forgotten."""
    return ((rewards - baseline)[:, None] * np.eye(theta.size)[actions]).mean(axis=0)


def reinforce_sign_flipped(theta, actions, rewards, baseline=0.0):
    """The gradient of -log pi: descends the reward."""
    return -((rewards - baseline)[:, None] * (np.eye(theta.size)[actions] - _softmax(theta))).mean(axis=0)


def reinforce_no_baseline(theta, actions, rewards, baseline=0.0):
    """The baseline argument ignored."""
    return (rewards[:, None] * (np.eye(theta.size)[actions] - _softmax(theta))).mean(axis=0)


def reinforce_summed(theta, actions, rewards, baseline=0.0):
    """Summed over the samples instead of averaged."""
    return ((rewards - baseline)[:, None] * (np.eye(theta.size)[actions] - _softmax(theta))).sum(axis=0)


def reinforce_grad_of_pi(theta, actions, rewards, baseline=0.0):
    """grad pi(a) = pi(a) (e_a - pi) instead of grad log pi(a)."""
    pi = _softmax(theta)
    return ((rewards - baseline)[:, None] * pi[actions][:, None] * (np.eye(theta.size)[actions] - pi)).mean(axis=0)


def reinforce_naive_softmax(theta, actions, rewards, baseline=0.0):
    """exp(theta) without subtracting the maximum: overflows at logits ~1000."""
    z = np.exp(theta)
    return ((rewards - baseline)[:, None] * (np.eye(theta.size)[actions] - z / z.sum())).mean(axis=0)


REINFORCE = [reinforce_onehot_only, reinforce_sign_flipped, reinforce_no_baseline, reinforce_summed,
             reinforce_grad_of_pi]


# ----- T21.5 kl_penalty ---------------------------------------------------------------------

def _q_minus_p(logp, ref_logp):
    return np.asarray(ref_logp, dtype=logp.dtype) - logp


def kl_k1(logp, ref_logp, mask):
    """k1 = p - q: unbiased too, but not the k3 the loss uses (and negative half the time)."""
    return xl_aggregate(-_q_minus_p(logp, ref_logp), mask)


def kl_swapped(logp, ref_logp, mask):
    """p and q swapped: exp(p - q) - (p - q) - 1."""
    d = -_q_minus_p(logp, ref_logp)
    return xl_aggregate(ops.exp(d) - d - 1.0, mask)


def kl_no_minus_one(logp, ref_logp, mask):
    """The - 1 forgotten: the gradient is right, the value is 1 too large."""
    d = _q_minus_p(logp, ref_logp)
    return xl_aggregate(ops.exp(d) - d, mask)


def kl_detached(logp, ref_logp, mask):
    """Computed from logp.data: the right value, but a constant, so no gradient reaches the policy."""
    d = np.asarray(ref_logp, dtype=logp.dtype) - logp.data
    return xl_aggregate(Tensor(np.exp(d) - d - 1.0), mask) + 0.0 * ops.sum(logp)


def kl_k2(logp, ref_logp, mask):
    """k2 = (p - q)^2 / 2: another estimator, biased."""
    d = _q_minus_p(logp, ref_logp)
    return xl_aggregate(d * d * 0.5, mask)


KL = [kl_k1, kl_swapped, kl_no_minus_one, kl_detached, kl_k2]


# tests/test_mutants.py's format: exercise id -> {what the mistake is: mutant or (mutant, words)}
def _named(fns):
    out = {}
    for f in fns:
        fn, words = f if isinstance(f, tuple) else (f, "")
        out[fn.__name__.replace("_", " ")] = (fn, words) if words else fn
    return out


MUTANTS = {ex: _named(fns) for ex, fns in (("T21.1", REINFORCE), ("T21.2", ADVANTAGES), ("T21.3", AGGREGATES),
                                            ("T21.4", CLIPPED), ("T21.5", KL), ("T21.6", GATES))}
MUTANTS["T21.1"]["reinforce naive softmax"] = (reinforce_naive_softmax, "logits ~1000")
