"""Post-training's per-token pieces against float64 PyTorch references (T20, T21): log-probs,
entropy, the three aggregations, group normalisation, the policy-gradient family, the k3 KL,
the SFT loss and its gradient accumulation, prompt + response batches."""

from __future__ import annotations

import numpy as np
import pytest

from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.training.optim import SGD
from xtrain_lessons.training.posttrain.advantages import group_advantages
from xtrain_lessons.training.posttrain.aggregate import AGGREGATIONS, aggregate, token_weights
from xtrain_lessons.training.posttrain.batch import prompt_response_batch
from xtrain_lessons.training.posttrain.logprobs import response_logprobs, token_entropy, token_logprobs
from xtrain_lessons.training.posttrain.pg_loss import (
    clipped_pg_loss_per_token,
    k3_kl,
    naive_pg_loss,
    policy_gradient_loss,
)
from xtrain_lessons.training.posttrain.sft import sft_loss, sft_step

torch = pytest.importorskip("torch")

TOL = dict(rtol=1e-12, atol=1e-12)


def _case(seed=0, B=4, T=7, V=11, scale=2.0):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, scale, (B, T, V))
    labels = rng.integers(0, V, (B, T))
    mask = np.zeros((B, T))
    for b, (lo, hi) in enumerate([(1, 7), (2, 4), (0, 1), (3, 6), (0, 0), (2, 7)][:B]):
        mask[b, lo:hi] = 1
    return logits, labels, mask, rng


def _torch_logp(logits, labels):
    x = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    lp = torch.log_softmax(x, -1).gather(-1, torch.tensor(labels)[..., None])[..., 0]
    return x, lp


def _ours_logp(logits, labels):
    x = Tensor(logits.copy(), requires_grad=True)
    return x, token_logprobs(x, labels)


def _grads_agree(ours_x, torch_x, **tol):
    np.testing.assert_allclose(ours_x.grad, torch_x.grad.numpy(), **(tol or TOL))


# ----- log-probabilities and entropy -------------------------------------------------------

def test_token_logprobs_match_torch_with_gradient():
    logits, labels, _, rng = _case()
    tx, tlp = _torch_logp(logits, labels)
    ox, olp = _ours_logp(logits, labels)
    np.testing.assert_allclose(olp.numpy(), tlp.detach().numpy(), **TOL)
    g = rng.normal(size=labels.shape)
    (olp * g).sum().backward()
    (tlp * torch.tensor(g)).sum().backward()
    _grads_agree(ox, tx)


@pytest.mark.parametrize("scale", [0.5, 3.0, 1000.0])
def test_token_entropy_matches_torch(scale):
    logits, _, _, _ = _case(1, scale=scale)
    expected = torch.distributions.Categorical(logits=torch.tensor(logits)).entropy().numpy()
    got = token_entropy(logits)
    assert got.shape == logits.shape[:2] and got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)
    assert token_entropy(logits.astype(np.float32)).dtype == np.float32


def test_entropy_is_log_v_for_uniform_and_zero_for_one_hot():
    assert token_entropy(np.zeros((2, 5)))[0] == pytest.approx(np.log(5), rel=1e-15)
    assert token_entropy(np.array([[0.0, -1e4, -1e4]]))[0] == pytest.approx(0.0, abs=1e-300)


def test_response_logprobs_is_one_forward_of_both():
    cfg = PRESETS["test"]
    model = Model(cfg, dtype=np.float64, seed=0)
    ids, labels, _ = prompt_response_batch([[1, 2, 3], [4]], [[5, 6], [7, 8, 9]])
    logp, H = response_logprobs(model, ids, labels, with_entropy=True)
    logits = model(ids).numpy()
    np.testing.assert_allclose(logp.numpy(), token_logprobs(logits, labels).numpy(), **TOL)
    np.testing.assert_allclose(H, token_entropy(logits), **TOL)
    assert response_logprobs(model, ids, labels)[1] is None


# ----- aggregation -------------------------------------------------------------------------

def _torch_aggregate(v, m, how, constant):
    if how == "sequence_mean":
        return ((v * m).sum(1) / m.sum(1).clamp(min=1)).mean()
    if how == "constant":
        return (v * m).sum() / constant
    return (v * m).sum() / m.sum()


@pytest.mark.parametrize("how", AGGREGATIONS)
def test_aggregations_match_torch_with_gradient(how):
    _, _, mask, rng = _case(2, B=5)
    values = rng.normal(size=mask.shape)
    tv = torch.tensor(values, requires_grad=True)
    expected = _torch_aggregate(tv, torch.tensor(mask), how, 13.0)
    expected.backward()
    ov = Tensor(values.copy(), requires_grad=True)
    got = aggregate(ov, mask, how, 13.0)
    got.backward()
    assert float(got.item()) == pytest.approx(expected.item(), rel=1e-13)
    np.testing.assert_allclose(ov.grad, tv.grad.numpy(), **TOL)
    assert aggregate(values, mask, how, 13.0) == pytest.approx(expected.item(), rel=1e-13)  # arrays too


def test_aggregations_weigh_long_and_short_answers_as_documented():
    mask = np.zeros((2, 20))
    mask[0, :2] = mask[1, :20] = 1  # a 2-token and a 20-token answer
    seq = token_weights(mask, "sequence_mean")
    assert seq[0, 0] == pytest.approx(10 * seq[1, 0]) and seq.sum(1) == pytest.approx([0.5, 0.5], rel=1e-15)
    tok = token_weights(mask, "token_mean")
    assert tok[0, 0] == tok[1, 0] == pytest.approx(1 / 22)
    const = token_weights(mask, "constant", 40)
    assert const[0, 0] == const[1, 0] == 1 / 40
    with pytest.raises(ValueError, match="constant > 0"):
        token_weights(mask, "constant")
    with pytest.raises(ValueError, match="unknown aggregation"):
        token_weights(mask, "median")


# ----- group normalisation ------------------------------------------------------------------

@pytest.mark.parametrize("ddof", [0, 1])
def test_group_advantages_match_torch_std(ddof):
    r = np.random.default_rng(3).normal(size=(5, 4))
    t = torch.tensor(r)
    expected = (t - t.mean(1, keepdim=True)) / (t.std(1, correction=ddof, keepdim=True) + 1e-6)
    np.testing.assert_allclose(group_advantages(r, eps=1e-6, ddof=ddof), expected.numpy(), **TOL)
    np.testing.assert_allclose(group_advantages(r, normalize_by_std=False), (t - t.mean(1, keepdim=True)).numpy(),
                               **TOL)


def test_sample_and_population_std_differ_by_sqrt_g_over_g_minus_1():
    r = np.random.default_rng(4).normal(size=(3, 4))
    ratio = group_advantages(r, eps=0.0, ddof=0) / group_advantages(r, eps=0.0, ddof=1)
    np.testing.assert_allclose(ratio, np.sqrt(4 / 3), rtol=1e-12)  # 15% at G = 4
    assert (group_advantages([[1.0, 1.0, 1.0]]) == 0).all()


# ----- the policy-gradient family -----------------------------------------------------------

def test_naive_pg_loss_matches_torch():
    logits, labels, _, rng = _case(5)
    adv = rng.normal(size=4)
    tx, tlp = _torch_logp(logits, labels)
    ox, olp = _ours_logp(logits, labels)
    t_loss = -torch.tensor(adv)[:, None] * tlp
    o_loss = naive_pg_loss(olp, adv)
    np.testing.assert_allclose(o_loss.numpy(), t_loss.detach().numpy(), **TOL)
    g = rng.normal(size=labels.shape)
    (o_loss * g).sum().backward()
    (t_loss * torch.tensor(g)).sum().backward()
    _grads_agree(ox, tx)


def _torch_clipped(tlp, old, adv, eps):
    ratio = torch.exp(tlp - torch.tensor(old))
    a = torch.tensor(adv)[:, None]
    return -torch.minimum(ratio * a, torch.clamp(ratio, 1 - eps, 1 + eps) * a)


def test_clipped_pg_loss_matches_torch_on_both_sides_of_the_clip():
    logits, labels, _, rng = _case(6)
    adv = np.array([1.0, -1.0, 0.5, -2.0])
    tx, tlp = _torch_logp(logits, labels)
    ox, olp = _ours_logp(logits, labels)
    delta = rng.choice([np.log(1.5), np.log(0.6), 0.05, -0.05], size=labels.shape)  # ratios far out and inside
    old = olp.numpy() - delta
    t_loss = _torch_clipped(tlp, old, adv, 0.2)
    o_loss, clipped = clipped_pg_loss_per_token(olp, old, adv, 0.2)
    np.testing.assert_allclose(o_loss.numpy(), t_loss.detach().numpy(), **TOL)
    g = rng.normal(size=labels.shape)
    (o_loss * g).sum().backward()
    (t_loss * torch.tensor(g)).sum().backward()
    _grads_agree(ox, tx)
    ratio, A = np.exp(delta), adv[:, None]
    assert (clipped == (((A > 0) & (ratio > 1.2)) | ((A < 0) & (ratio < 0.8)))).all()
    assert clipped.any() and not clipped.all()


def test_k3_kl_matches_torch_and_is_never_negative():
    logits, labels, _, rng = _case(7)
    tx, tlp = _torch_logp(logits, labels)
    ox, olp = _ours_logp(logits, labels)
    ref = olp.numpy() + rng.normal(0, 0.7, labels.shape)
    d = torch.tensor(ref) - tlp
    t_kl = torch.exp(d) - d - 1
    o_kl = k3_kl(olp, ref)
    np.testing.assert_allclose(o_kl.numpy(), t_kl.detach().numpy(), **TOL)
    assert (o_kl.numpy() >= 0).all()
    o_kl.sum().backward()
    t_kl.sum().backward()
    _grads_agree(ox, tx)


@pytest.mark.parametrize("method", ["no_baseline", "reinforce", "grpo_clip"])
def test_policy_gradient_family_matches_torch(method):
    logits, labels, _, rng = _case(8)
    rewards = np.array([[1.0, 0.0], [0.5, 2.0]])  # 2 groups of 2, rows in group order
    tx, tlp = _torch_logp(logits, labels)
    ox, olp = _ours_logp(logits, labels)
    old = olp.numpy() - rng.choice([np.log(1.5), np.log(0.6), 0.0], size=labels.shape)
    t = torch.tensor(rewards)
    if method == "no_baseline":
        t_loss = -t.reshape(-1, 1) * tlp
    elif method == "reinforce":
        t_loss = -(t - t.mean(1, keepdim=True)).reshape(-1, 1) * tlp
    else:
        adv = ((t - t.mean(1, keepdim=True)) / (t.std(1, keepdim=True) + 1e-4)).reshape(-1).numpy()
        t_loss = _torch_clipped(tlp, old, adv, 0.2)
    o_loss, stats = policy_gradient_loss(olp, method, rewards, old_logp=old, clip_eps=0.2)
    np.testing.assert_allclose(o_loss.numpy(), t_loss.detach().numpy(), **TOL)
    o_loss.sum().backward()
    t_loss.sum().backward()
    _grads_agree(ox, tx)
    assert stats["clipped"].any() == (method == "grpo_clip")


def test_policy_gradient_loss_errors():
    _, lp = _ours_logp(*_case(9)[:2])
    with pytest.raises(ValueError, match="needs old_logp"):
        policy_gradient_loss(lp, "grpo_clip", np.zeros((2, 2)))
    with pytest.raises(ValueError, match="unknown policy-gradient method"):
        policy_gradient_loss(lp, "ppo", np.zeros((2, 2)))
    with pytest.raises(ValueError, match="n_groups \\* G = 4"):
        policy_gradient_loss(lp, "reinforce", np.zeros((3, 2)))


def test_at_ratio_one_the_clipped_gradient_is_the_naive_one():
    logits, labels, _, rng = _case(10)
    adv = rng.normal(size=4)
    grads = []
    for clipped in (False, True):
        ox, olp = _ours_logp(logits, labels)
        loss = clipped_pg_loss_per_token(olp, olp.numpy(), adv)[0] if clipped else naive_pg_loss(olp, adv)
        loss.sum().backward()
        grads.append(ox.grad)
    np.testing.assert_allclose(grads[0], grads[1], **TOL)


# ----- prompt + response batches ------------------------------------------------------------

def test_prompt_response_batch_masks_prompt_and_padding():
    ids, labels, mask = prompt_response_batch([[5, 6], [4], [1, 2, 3]], [[7, 8, 9], [3], []], pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8], [4, 0, 0, 0], [1, 2, 0, 0]]
    assert labels.tolist() == [[6, 7, 8, 9], [3, 0, 0, 0], [2, 3, 0, 0]]
    assert mask.tolist() == [[0, 1, 1, 1], [1, 0, 0, 0], [0, 0, 0, 0]]
    assert ids.dtype == labels.dtype == np.int64 and mask.dtype == np.float32


def test_prompt_response_batch_encodes_the_two_parts_apart():
    encode = lambda s: [ord(c) for c in s]  # noqa: E731
    ids, labels, mask = prompt_response_batch(["ab", "c"], ["de", "fgh"], encode=encode)
    assert labels[mask > 0].tolist() == [ord(c) for c in "defgh"]
    with pytest.raises(ValueError, match="prompt 1 has no token"):
        prompt_response_batch([[1], []], [[2], [3]])
    with pytest.raises(ValueError, match="2 prompts but 1 responses"):
        prompt_response_batch([[1], [2]], [[3]])


# ----- the SFT loss and gradient accumulation -----------------------------------------------

def test_sft_loss_matches_torch():
    logits, labels, mask, _ = _case(11)
    tx, tlp = _torch_logp(logits, labels)
    ox, olp = _ours_logp(logits, labels)
    t_loss = -(tlp * torch.tensor(mask)).sum() / 17.0
    o_loss = sft_loss(olp, mask, 17.0)
    assert float(o_loss.item()) == pytest.approx(t_loss.item(), rel=1e-13)
    o_loss.backward()
    t_loss.backward()
    _grads_agree(ox, tx)


def _pairs(seed=12, n=6):
    r = np.random.default_rng(seed)
    return [(list(r.integers(1, 60, r.integers(1, 6))), list(r.integers(1, 60, r.integers(1, 9)))) for _ in range(n)]


@pytest.mark.parametrize("micro", [1, 2, 4])
def test_accumulated_micro_batches_equal_one_batch(micro):
    """Every micro-batch divides its sum by the WHOLE batch's token count: the accumulated
    gradient is the whole batch's, however it is cut (float64: to rounding)."""
    pairs = _pairs()
    grads, losses = [], []
    for m in (0, micro):
        model = Model(PRESETS["test"], dtype=np.float64, seed=1)
        opt = SGD(model.parameters(), lr=0.0)
        out = sft_step(model, opt, pairs, micro_batch=m, grad_clip=0.0)
        grads.append(np.concatenate([p.grad.ravel() for p in model.parameters()]))
        losses.append(out["loss"])
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-11, atol=1e-14)
    assert losses[1] == pytest.approx(losses[0], rel=1e-12)
    model = Model(PRESETS["test"], dtype=np.float64, seed=1)  # the loss is the token-mean NLL
    ids, labels, mask = prompt_response_batch([p for p, _ in pairs], [r for _, r in pairs])
    lp = token_logprobs(model(ids), labels).numpy()
    assert losses[0] == pytest.approx(-(lp * mask).sum() / mask.sum(), rel=1e-12)
