"""Every wrong solution in tests/mutants/T20_grpo.py fails its T20 notebook check; the
package's own functions pass the same checks (so a failing mutant means the check works)."""

from __future__ import annotations

import numpy as np
import pytest

from mutants import T20_grpo as M  # noqa: E402  (tests/ is on sys.path under pytest)
from xtrain_lessons.autograd.tensor import Tensor, no_grad
from xtrain_lessons.course.checks import check_fn
from xtrain_lessons.training.posttrain.grpo import (
    clipped_pg_loss,
    group_advantages,
    masked_mean_per_sequence,
    token_logprobs,
)
from xtrain_lessons.model.qwen3 import Config, Model

# the notebook's cases, built in the notebook's order from the same seeds
_rng = np.random.default_rng(0)
ADV_CASES = [(np.array([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]]),),
             (_rng.normal(size=(3, 8)),),
             (np.array([[0.0, 1.0, 0.5], [5.0, -5.0, 0.0]]), 0.1)]
_mask_a = np.array([[1, 1, 0, 0, 0], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]], dtype=np.float64)
_mask_b = (np.arange(9)[None, :] < np.array([[2], [9], [5], [1]])).astype(np.float64)
MEAN_CASES = [(_rng.normal(size=(3, 5)), _mask_a), (_rng.normal(size=(4, 9)), _mask_b),
              (_rng.normal(size=(2, 3)), np.ones((2, 3)))]


def loss_and_grad(loss_fn):
    def run(logp, old_logp, adv, mask, eps):
        x = Tensor(logp.copy(), requires_grad=True)
        loss = loss_fn(x, old_logp, adv, mask, eps)
        loss.backward()
        return np.asarray(loss.item()), x.grad
    return run


def reference_loss(logp, old_logp, adv, mask, eps):
    return clipped_pg_loss(logp, old_logp, adv, mask, eps)[0]


def clip_case(seed, B=4, T=6, eps=0.2):
    r = np.random.default_rng(seed)
    logp = -r.uniform(0.1, 3.0, (B, T))
    delta = r.choice([np.log(1.5), np.log(0.6), 0.05, -0.05, 0.0], size=(B, T))
    adv = np.array([1.0, -1.0, 0.5, -2.0])[:B]
    mask = (np.arange(T)[None, :] < r.integers(1, T + 1, (B, 1))).astype(np.float64)
    return (logp, logp - delta, adv, mask, eps)


CLIP_CASES = [clip_case(1), clip_case(2), clip_case(3, eps=0.1)]

CFG = Config(vocab_size=256, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
             ffn_dim=192, max_seq_len=64)


def looped(model, rollouts):
    out = []
    with no_grad():
        for r in rollouts:
            seq = np.asarray(r.prompt_ids + r.ids)
            lp = token_logprobs(model(seq[None, :-1]), seq[None, 1:]).numpy()[0]
            out.append(lp[len(r.prompt_ids) - 1:])
    return out


@pytest.fixture(scope="module")
def gate_cases():
    model = Model(CFG, seed=0)
    return [(model, M.rollout_list(CFG.vocab_size, 1)), (model, M.rollout_list(CFG.vocab_size, 2, n=9)),
            (model, M.rollout_list(CFG.vocab_size, 3, n=2))]


def _passes(fn, reference, cases, **tol):
    return check_fn("mutant", fn, reference, cases, **tol) is fn


@pytest.mark.parametrize("mutant", M.ADVANTAGES, ids=lambda f: f.__name__)
def test_advantage_mutants_fail(mutant, capsys):
    assert _passes(group_advantages, group_advantages, ADV_CASES)
    assert not _passes(mutant, group_advantages, ADV_CASES)


@pytest.mark.parametrize("mutant", M.MEANS, ids=lambda f: f.__name__)
def test_masked_mean_mutants_fail(mutant, capsys):
    assert _passes(masked_mean_per_sequence, masked_mean_per_sequence, MEAN_CASES)
    assert not _passes(mutant, masked_mean_per_sequence, MEAN_CASES)


@pytest.mark.parametrize("mutant", M.CLIPPED, ids=lambda f: f.__name__)
def test_clipped_loss_mutants_fail(mutant, capsys):
    ref = loss_and_grad(reference_loss)
    assert _passes(loss_and_grad(reference_loss), ref, CLIP_CASES)
    assert not _passes(loss_and_grad(mutant), ref, CLIP_CASES)


@pytest.mark.parametrize("mutant", M.GATES, ids=lambda f: f.__name__)
def test_batched_gate_mutants_fail(mutant, gate_cases, capsys):
    from xtrain_lessons.training.posttrain.grpo import rollout_batch, sequence_logprobs  # noqa: PLC0415

    def right(model, rollouts):  # the package's batched path, sliced to the completions
        ids, targets, mask = rollout_batch(rollouts)
        with no_grad():
            lp = sequence_logprobs(model, ids, targets).numpy()
        return [lp[b][mask[b] > 0] for b in range(len(rollouts))]

    assert _passes(right, looped, gate_cases, atol=1e-6, rtol=0.0)
    assert not _passes(mutant, looped, gate_cases, atol=1e-6, rtol=0.0)
