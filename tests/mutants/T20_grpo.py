"""Plausible wrong solutions of the T20_grpo exercises, each of which its check must reject.

The cases and the checks repeat the notebook's (solutions/T20_grpo.ipynb) exactly; the test
in tests/test_mutants_T20.py runs every mutant through them.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor, no_grad
from xtrain_lessons.model.batching import pad_batch
from xtrain_lessons.training.posttrain.grpo import Rollout, token_logprobs
from xtrain_lessons.training.posttrain.grpo import masked_mean_per_sequence as xl_masked_mean


# ----- T20.1 group_advantages -------------------------------------------------------------

def adv_global_baseline(rewards, eps=1e-4):
    """The mean and std of the whole batch, not of each group."""
    r = np.asarray(rewards, dtype=np.float64)
    return (r - r.mean()) / (r.std() + eps)


def adv_no_std(rewards, eps=1e-4):
    """Only the baseline subtracted: the scale of each prompt's rewards leaks in."""
    r = np.asarray(rewards, dtype=np.float64)
    return r - r.mean(axis=1, keepdims=True)


def adv_sample_std(rewards, eps=1e-4):
    """The sample std (ddof=1) instead of the population std."""
    r = np.asarray(rewards, dtype=np.float64)
    return (r - r.mean(axis=1, keepdims=True)) / (r.std(axis=1, ddof=1, keepdims=True) + eps)


ADVANTAGES = [adv_global_baseline, adv_no_std, adv_sample_std]


# ----- T20.2 masked_mean_per_sequence -----------------------------------------------------

def mean_token_weighted(values, mask):
    """T10's token-weighted mean: long completions count for more."""
    mask = np.asarray(mask, dtype=np.float64)
    return float((np.asarray(values) * mask).sum() / mask.sum())


def mean_over_padding(values, mask):
    """Divides by the padded length T, not the completion's own length."""
    mask = np.asarray(mask, dtype=np.float64)
    return float(((np.asarray(values) * mask).sum(axis=1) / mask.shape[1]).mean())


def mean_skips_empty_rows(values, mask):
    """Averages over the non-empty rows only (an empty row should still count in B)."""
    mask = np.asarray(mask, dtype=np.float64)
    n = mask.sum(axis=1)
    keep = n > 0
    return float(((np.asarray(values) * mask).sum(axis=1)[keep] / n[keep]).mean())


MEANS = [mean_token_weighted, mean_over_padding, mean_skips_empty_rows]


# ----- T20.3 clipped_loss -----------------------------------------------------------------

def _pieces(logp, old_logp, adv):
    A = np.asarray(adv, dtype=logp.dtype)[:, None]
    ratio = ops.exp(logp - old_logp)
    return A, ratio, ratio * A


def clip_none(logp, old_logp, adv, mask, eps=0.2):
    """No clipping at all: the plain importance-weighted policy gradient."""
    _, _, unclipped = _pieces(logp, old_logp, adv)
    return -xl_masked_mean(unclipped, mask)


def clip_both_directions(logp, old_logp, adv, mask, eps=0.2):
    """Stops the gradient whenever the ratio leaves the range, whatever the advantage's sign."""
    A, ratio, unclipped = _pieces(logp, old_logp, adv)
    outside = (ratio.data < 1 - eps) | (ratio.data > 1 + eps)
    const = Tensor(np.clip(ratio.data, 1 - eps, 1 + eps) * A)
    return -xl_masked_mean(ops.where(outside, const, unclipped), mask)


def clip_max(logp, old_logp, adv, mask, eps=0.2):
    """max instead of min: the pessimistic bound turned optimistic."""
    A, ratio, unclipped = _pieces(logp, old_logp, adv)
    clipped = np.clip(ratio.data, 1 - eps, 1 + eps) * A
    return -xl_masked_mean(ops.where(unclipped.data >= clipped, unclipped, Tensor(clipped)), mask)


def clip_unmasked(logp, old_logp, adv, mask, eps=0.2):
    """The right surrogate averaged over every position, prompt and padding included."""
    A, ratio, unclipped = _pieces(logp, old_logp, adv)
    clipped = np.clip(ratio.data, 1 - eps, 1 + eps) * A
    return -xl_masked_mean(ops.where(unclipped.data <= clipped, unclipped, Tensor(clipped)),
                           np.ones(np.shape(mask)))


CLIPPED = [clip_none, clip_both_directions, clip_max, clip_unmasked]


# ----- T20.4 completion_logprobs_batched --------------------------------------------------

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

# ----- T20.1 reinforce_grad (the bandit) ---------------------------------------------------

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


# ----- T20.5 kl_penalty ---------------------------------------------------------------------

def _q_minus_p(logp, ref_logp):
    return np.asarray(ref_logp, dtype=logp.dtype) - logp


def kl_k1(logp, ref_logp, mask):
    """k1 = p - q: unbiased too, but not the k3 the loss uses (and negative half the time)."""
    return xl_masked_mean(-_q_minus_p(logp, ref_logp), mask)


def kl_swapped(logp, ref_logp, mask):
    """p and q swapped: exp(p - q) - (p - q) - 1."""
    d = -_q_minus_p(logp, ref_logp)
    return xl_masked_mean(ops.exp(d) - d - 1.0, mask)


def kl_no_minus_one(logp, ref_logp, mask):
    """The - 1 forgotten: the gradient is right, the value is 1 too large."""
    d = _q_minus_p(logp, ref_logp)
    return xl_masked_mean(ops.exp(d) - d, mask)


def kl_detached(logp, ref_logp, mask):
    """Computed from logp.data: the right value, but a constant, so no gradient reaches the policy."""
    d = np.asarray(ref_logp, dtype=logp.dtype) - logp.data
    return xl_masked_mean(Tensor(np.exp(d) - d - 1.0), mask) + 0.0 * ops.sum(logp)


def kl_k2(logp, ref_logp, mask):
    """k2 = (p - q)^2 / 2: another estimator, biased."""
    d = _q_minus_p(logp, ref_logp)
    return xl_masked_mean(d * d * 0.5, mask)


KL = [kl_k1, kl_swapped, kl_no_minus_one, kl_detached, kl_k2]


# tests/test_mutants.py's format: exercise id -> {what the mistake is: mutant}
MUTANTS = {ex: {f.__name__.replace("_", " "): f for f in fns}
           for ex, fns in (("T20.1", REINFORCE), ("T20.2", ADVANTAGES), ("T20.3", MEANS), ("T20.4", CLIPPED),
                           ("T20.5", KL), ("T20.6", GATES))}
MUTANTS["T20.1"]["reinforce naive softmax"] = (reinforce_naive_softmax, "logits ~1000")


def rollout_list(vocab, seed, n=6):
    r = np.random.default_rng(seed)
    return [Rollout(0, list(r.integers(0, vocab, r.integers(1, 6))),
                    list(r.integers(0, vocab, r.integers(1, 20))), False) for _ in range(n)]
