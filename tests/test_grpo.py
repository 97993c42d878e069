"""GRPO (T21): the ragged-batch gates, the clipped loss, advantages, rewards, the command."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest

from xtrain_lessons.cli import main, grpo
from xtrain_lessons.autograd.tensor import Tensor, no_grad
from xtrain_lessons.model.batching import forward_loop, forward_ragged
from xtrain_lessons.model.generate import generate
from xtrain_lessons.training.posttrain.advantages import group_advantages
from xtrain_lessons.training.posttrain.aggregate import masked_mean_per_sequence
from xtrain_lessons.training.posttrain.grpo import GRPOConfig, clipped_pg_loss, clipped_pg_loss_looped
from xtrain_lessons.training.posttrain.rollouts import Rollout, rollout_batch, sample_batch, sample_group
from xtrain_lessons.training.posttrain.logprobs import sequence_logprobs, token_logprobs
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.training.posttrain.rewards import EOT, RewardError, load_reward

CFG = PRESETS["test"]


def rollouts(seed=0, n=6, vocab=CFG.vocab_size):
    """Ragged prompt + completion pairs (prompts 1-5 tokens, completions 1-19)."""
    rng = np.random.default_rng(seed)
    return [Rollout(0, list(rng.integers(0, vocab, rng.integers(1, 6))),
                    list(rng.integers(0, vocab, rng.integers(1, 20))), False) for _ in range(n)]


# ----- gate 1: the ragged right-padded batched forward == the looped forward --------------

@pytest.mark.parametrize("attention,dtype,tol", [("composed", "float32", 1e-6),
                                                 ("flash", "float32", 1e-6),
                                                 ("composed", "bf16", 0.0)])
def test_ragged_batched_forward_equals_looped(attention, dtype, tol):
    model = Model(CFG.replace(attention=attention), seed=0)
    model.compute_dtype = dtype
    rng = np.random.default_rng(1)
    seqs = [rng.integers(1, CFG.vocab_size, n) for n in (3, 17, 9, 31, 1, 24)]
    for s, a, b in zip(seqs, forward_ragged(model, seqs), forward_loop(model, seqs)):
        assert a.shape == b.shape == (len(s), CFG.vocab_size)
        assert np.abs(a.astype(np.float64) - b.astype(np.float64)).max() <= tol


def test_rollout_batch_masks_the_completion_tokens():
    rs = [Rollout(0, [5, 6], [7, 8, 9], True), Rollout(0, [4], [3], False)]
    ids, targets, mask = rollout_batch(rs, pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 8], [4, 0, 0, 0]]
    assert targets.tolist() == [[6, 7, 8, 9], [3, 0, 0, 0]]
    assert mask.tolist() == [[0, 1, 1, 1], [1, 0, 0, 0]]


# ----- gate 2: the batched clipped-PG loss and its gradients == the looped sum ------------

def _grads(model):
    return np.concatenate([p.grad.ravel() for p in model.parameters()])


@pytest.mark.parametrize("attention", ["composed", "flash"])
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_batched_loss_and_grads_equal_looped_sum(attention, kl_coef):
    model = Model(CFG.replace(attention=attention), seed=3)
    rs = rollouts(seed=3)
    ids, targets, mask = rollout_batch(rs)
    rng = np.random.default_rng(3)
    with no_grad():
        logp0 = sequence_logprobs(model, ids, targets).numpy()
    old = logp0 + rng.normal(0, 0.3, logp0.shape).astype(np.float32)  # ratios on both sides
    ref = logp0 + rng.normal(0, 0.1, logp0.shape).astype(np.float32)
    adv = rng.normal(size=len(rs))

    loss, stats = clipped_pg_loss(sequence_logprobs(model, ids, targets), old, adv, mask, 0.2,
                                  ref, kl_coef)
    loss.backward()
    g_batched = _grads(model)
    assert 0.05 < stats["clip_frac"] < 0.6  # the clipped branch is exercised

    model.zero_grad()
    n = [len(r.prompt_ids) + len(r.ids) - 1 for r in rs]
    looped = clipped_pg_loss_looped(model, rs, [old[b:b + 1, :n[b]] for b in range(len(rs))], adv,
                                    0.2, [ref[b:b + 1, :n[b]] for b in range(len(rs))], kl_coef)
    looped.backward()
    g_looped = _grads(model)
    assert abs(loss.item() - looped.item()) <= 1e-6 * abs(looped.item())
    assert np.abs(g_batched - g_looped).max() <= 1e-6 * np.abs(g_looped).max()


# ----- the loss against direct computations on the logits ---------------------------------

def _logit_setup(seed=0, B=4, T=7, V=11):
    rng = np.random.default_rng(seed)
    logits = rng.normal(0, 2, (B, T, V))  # float64: exact comparisons
    targets = rng.integers(0, V, (B, T))
    mask = np.zeros((B, T))
    for b, (lo, hi) in enumerate([(1, 7), (2, 4), (0, 1), (3, 6)][:B]):
        mask[b, lo:hi] = 1
    return logits, targets, mask, rng


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _weights(mask):  # the per-sequence-then-per-batch mean's weight of each token
    return mask / (mask.sum(1, keepdims=True) * mask.shape[0])


def test_token_logprobs_and_their_gradient():
    logits, targets, _, rng = _logit_setup()
    x = Tensor(logits, requires_grad=True)
    lp = token_logprobs(x, targets)
    expected = np.log(np.take_along_axis(_softmax(logits), targets[..., None], -1))[..., 0]
    np.testing.assert_allclose(lp.numpy(), expected, rtol=1e-12, atol=1e-12)
    g = rng.normal(size=targets.shape)
    (lp * g).sum().backward()
    onehot = np.eye(logits.shape[-1])[targets]
    np.testing.assert_allclose(x.grad, g[..., None] * (onehot - _softmax(logits)), rtol=1e-12, atol=1e-12)


def test_ratio_one_is_the_plain_policy_gradient():
    logits, targets, mask, rng = _logit_setup(1)
    adv = rng.normal(size=mask.shape[0])
    x = Tensor(logits, requires_grad=True)
    lp = token_logprobs(x, targets)
    loss, stats = clipped_pg_loss(lp, lp.numpy().copy(), adv, mask, clip_eps=0.2)
    loss.backward()
    w = _weights(mask)
    # L = -sum w A log pi  ->  dL/dlogits = -w A (onehot - softmax)
    direct = -(w * adv[:, None])[..., None] * (np.eye(logits.shape[-1])[targets] - _softmax(logits))
    np.testing.assert_allclose(x.grad, direct, rtol=1e-12, atol=1e-14)
    assert abs(loss.item() + float((w * adv[:, None]).sum())) <= 1e-12
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0


def test_clipping_stops_the_gradient_only_in_the_advantage_direction():
    logits, targets, mask, rng = _logit_setup(2, B=4)
    eps = 0.2
    adv = np.array([1.0, -1.0, 1.0, -1.0])
    # log-ratios: far above, far below and inside [1 - eps, 1 + eps], per token
    delta = rng.choice([np.log(1.5), np.log(0.5), 0.05, -0.05], size=mask.shape)
    x = Tensor(logits, requires_grad=True)
    lp = token_logprobs(x, targets)
    old = lp.numpy() - delta
    loss, stats = clipped_pg_loss(lp, old, adv, mask, clip_eps=eps)
    loss.backward()
    ratio = np.exp(delta)
    A = adv[:, None]
    stopped = ((A > 0) & (ratio > 1 + eps)) | ((A < 0) & (ratio < 1 - eps))
    w = _weights(mask)
    live = -(w * A * ratio * ~stopped)[..., None] * (np.eye(logits.shape[-1])[targets] - _softmax(logits))
    np.testing.assert_allclose(x.grad, live, rtol=1e-12, atol=1e-14)
    real = mask > 0
    assert (np.abs(x.grad[stopped & real]).max(-1) == 0).all()
    # a ratio out of range AGAINST the advantage still gets its (unclipped) gradient
    against = real & (((A > 0) & (ratio < 1 - eps)) | ((A < 0) & (ratio > 1 + eps)))
    assert against.any() and (np.abs(x.grad[against]).max(-1) > 0).all()
    assert stats["clip_frac"] == pytest.approx(stopped[real].mean())


def test_masked_mean_per_sequence():
    rng = np.random.default_rng(0)
    v, mask = rng.normal(size=(3, 5)), np.array([[1, 1, 0, 0, 0], [0, 1, 1, 1, 1], [0, 0, 0, 0, 0]])
    expected = (v[0, :2].mean() + v[1, 1:].mean() + 0.0) / 3
    assert masked_mean_per_sequence(v, mask) == pytest.approx(expected, rel=1e-12)
    t = masked_mean_per_sequence(Tensor(v), mask)
    assert float(t.item()) == pytest.approx(expected, rel=1e-12)


def test_kl_k3_is_zero_at_the_reference_and_positive_elsewhere():
    logits, targets, mask, rng = _logit_setup(3)
    lp = token_logprobs(Tensor(logits, requires_grad=True), targets)
    _, s0 = clipped_pg_loss(lp, lp.numpy(), np.zeros(4), mask, 0.2, lp.numpy(), 0.1)
    d = rng.normal(0, 0.5, lp.shape)
    _, s1 = clipped_pg_loss(lp, lp.numpy(), np.zeros(4), mask, 0.2, lp.numpy() + d, 0.1)
    assert s0["kl"] == 0.0
    assert s1["kl"] == pytest.approx(masked_mean_per_sequence(np.exp(d) - d - 1, mask), rel=1e-12)
    assert s1["kl"] > 0


# ----- advantages -------------------------------------------------------------------------

def test_group_advantages():
    a = group_advantages([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0]], eps=1e-4, ddof=0)
    np.testing.assert_allclose(a[0], np.array([1, -1, -1, 1]) * 0.5 / (0.5 + 1e-4), rtol=1e-12)
    assert (a[1] == 0).all()  # no spread: no signal
    r = np.random.default_rng(0).normal(size=(3, 8))
    a = group_advantages(r)  # the default: the sample std (ddof 1), as torch.std
    np.testing.assert_allclose(a.mean(1), 0, atol=1e-12)
    np.testing.assert_allclose(a, (r - r.mean(1, keepdims=True)) / (r.std(1, ddof=1, keepdims=True) + 1e-4))
    np.testing.assert_allclose(group_advantages(r, normalize_by_std=False), r - r.mean(1, keepdims=True))
    with pytest.raises(ValueError, match="n_groups, G"):
        group_advantages([1.0, 2.0])
    with pytest.raises(ValueError, match="no sample std"):
        group_advantages([[1.0], [2.0]])


# ----- rollouts ---------------------------------------------------------------------------

def test_group_sampling_greedy_equals_generate_and_stops_at_eos():
    model = Model(CFG, seed=0)
    prompt = [3, 9, 4]
    group = sample_group(model, prompt, 3, 10, temperature=0.0)
    greedy = generate(model, prompt, 10, temperature=0.0)
    assert all(ids == greedy and not ended for ids, ended in group)
    eos = greedy[4]  # a token the greedy path emits: it must stop there, included
    group = sample_group(model, prompt, 2, 10, temperature=0.0, eos_id=eos)
    first = greedy.index(eos)
    assert all(ids == greedy[:first + 1] and ended for ids, ended in group)
    sampled = sample_group(model, prompt, 5, 12, temperature=1.0, top_p=0.9,
                           rng=np.random.default_rng(0))
    again = sample_group(model, prompt, 5, 12, temperature=1.0, top_p=0.9,
                         rng=np.random.default_rng(0))
    assert sampled == again and len({tuple(ids) for ids, _ in sampled}) > 1
    assert all(len(ids) == 12 for ids, _ in sampled)


# ----- rewards ----------------------------------------------------------------------------

def test_builtin_rewards():
    assert load_reward("word:dog")("p", "The Dog ran.", 3) == 1.0
    assert load_reward("word:dog")("p", "hotdogs", 3) == 0.0
    assert load_reward("eos:5")("p", "bye" + EOT, 5) == 1.0
    assert load_reward("eos:5")("p", "bye" + EOT, 6) == 0.0
    assert load_reward("eos:5")("p", "bye", 2) == 0.0
    assert load_reward("length:2-4")("p", "x", 4) == 1.0 and load_reward("length:2-4")("p", "x", 5) == 0.0
    assert load_reward("word:dog+eos:9")("p", "a dog" + EOT, 3) == 2.0
    for bad in ("nope:1", "eos:x", "length:5-2", "word:", "a+"):
        with pytest.raises(RewardError):
            load_reward(bad)


def test_user_reward_and_its_errors(tmp_path):
    f = tmp_path / "my_rewards.py"
    f.write_text("def count(prompt, completion):\n    return completion.count('a') / 10\n"
                 "def boom(prompt, completion):\n    raise KeyError('oops')\n"
                 "def text(prompt, completion):\n    return 'high'\n"
                 "def nan(prompt, completion):\n    return float('nan')\n")
    assert load_reward(f"{f}:count")("p", "banana", 6) == pytest.approx(0.3)
    with pytest.raises(RewardError, match=r"my_rewards.py:boom raised KeyError: 'oops'"):
        load_reward(f"{f}:boom")("p", "x", 1)
    with pytest.raises(RewardError, match=r"my_rewards.py:text returned 'high' \(str\), not a finite number"):
        load_reward(f"{f}:text")("p", "x", 1)
    with pytest.raises(RewardError, match="nan"):
        load_reward(f"{f}:nan")("p", "x", 1)
    with pytest.raises(RewardError, match="has no function 'missing'"):
        load_reward(f"{f}:missing")
    with pytest.raises(RewardError, match="no such file"):
        load_reward(f"{tmp_path}/none.py:f")


# ----- the command ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory):
    from test_train import small_corpus  # noqa: PLC0415  (tests/ is on sys.path under pytest)

    root = tmp_path_factory.mktemp("grpo")
    corpus = small_corpus(root / "small.txt")
    run = root / "base"
    assert main.main(["train", "--data", str(corpus), "--out", str(run), "--preset", "test",
                     "--vocab-size", "300", "--steps", "3", "--batch-size", "4", "--seq-len", "16",
                     "--eval-every", "0", "--sample-every", "0", "--no-progress", "--no-hf-check",
                     "--no-export"]) == 0
    return run


def _grpo(argv):
    parser = argparse.ArgumentParser(prog="xtrain grpo")
    grpo.configure_parser(parser)
    return grpo.run(parser.parse_args(argv))


def test_grpo_command_writes_a_run_that_sample_and_export_accept(tiny_run, tmp_path, capsys):
    out = tmp_path / "rl"
    assert _grpo([str(tiny_run), "--reward", "length:1-6", "--steps", "3", "--group", "3",
                  "--max-new-tokens", "8", "--eval-samples", "2", "--eval-batches", "1",
                  "--out", str(out), "--no-progress"]) == 0
    assert "mean reward" in capsys.readouterr().out
    for name in ("config.json", "tokenizer.json", "checkpoints", "metrics.jsonl", "reward.png",
                 "samples.txt", "summary.json"):
        assert (out / name).exists(), name
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert {"reward_mean", "kl", "clip_frac", "entropy"} <= set(rows[0])
    assert rows[0]["kl"] == 0.0  # the first rollouts come from the start model itself
    text = (out / "samples.txt").read_text()
    assert "===== before" in text and "===== after" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["val_loss_before"] is not None and summary["steps"] == 3

    assert main.main(["sample", str(out), "--max-new-tokens", "5"]) == 0
    pytest.importorskip("transformers")
    assert main.main(["export", str(out), "--out", str(tmp_path / "hf"), "--check", "--tokens", "8"]) == 0
    assert "identical on 3/3 prompts" in capsys.readouterr().out
    assert _grpo([str(tiny_run), "--reward", "length:1-6", "--out", str(out)]) == 2  # no overwrite


def test_grpo_command_names_a_failing_reward(tiny_run, tmp_path, capsys):
    f = tmp_path / "bad.py"
    f.write_text("def score(prompt, completion):\n    return None\n")
    assert _grpo([str(tiny_run), "--reward", f"{f}:score", "--steps", "1", "--group", "2",
                  "--max-new-tokens", "4", "--eval-batches", "0", "--out", str(tmp_path / "o"),
                  "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "bad.py:score returned None" in err and "Traceback" not in err
    assert _grpo([str(tiny_run), "--reward", "bogus:1"]) == 2
    assert "unknown reward 'bogus:1'" in capsys.readouterr().err


def test_config_validation():
    with pytest.raises(ValueError, match="group must be >= 2"):
        GRPOConfig(group=1).validate()
    with pytest.raises(ValueError, match="clip_eps"):
        GRPOConfig(clip_eps=1.5).validate()


def test_bench_grpo_runs_and_agrees(capsys):
    from xtrain_lessons.measure import grpo_bench  # noqa: PLC0415

    args = argparse.Namespace(preset="test", vocab_size=64, batch_size=4, seq_len=8, rounds=1, threads=1)
    assert grpo_bench.run(args) == 0
    out = capsys.readouterr().out
    assert "grpo scoring, batched vs looped: capture" in out
    delta = float(out.split("loss batched vs looped: |Δ| ")[1].split()[0])
    assert delta <= 1e-6
    assert grpo_bench.run(argparse.Namespace(**{**vars(args), "preset": "nope"})) == 2


def test_grpo_step_starts_at_ratio_one_and_raises_a_reward():
    from xtrain_lessons.training.posttrain.grpo import grpo_step  # noqa: PLC0415
    from xtrain_lessons.training.optim import AdamW  # noqa: PLC0415

    model, ref = Model(CFG, seed=0), Model(CFG, seed=0)
    cfg = GRPOConfig(group=8, prompts_per_step=2, max_new_tokens=8, lr=1e-2, kl_coef=0.01)
    opt = AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    prompts = [("a", [1, 2]), ("b", [3])]

    def low_tokens(prompt, completion, n):  # the share of token ids below 16
        return float(np.mean([int(t) < 16 for t in completion.split()]))

    rng = np.random.default_rng(0)
    history = [grpo_step(model, ref, opt, prompts, low_tokens, cfg, rng, None,
                         lambda ids: " ".join(map(str, ids))) for _ in range(15)]
    # ratio 1 and A summing to 0 in each group: the first inner loss is 0 up to rounding
    assert abs(history[0]["loss"]) < 1e-6 and history[0]["kl"] == 0.0
    first = np.mean([h["reward_mean"] for h in history[:3]])
    last = np.mean([h["reward_mean"] for h in history[-3:]])
    assert first < 0.5 and last > first + 0.3, (first, last)


# ----- sampling many rows at once, the loss choices ---------------------------------------

def test_sample_rows_draws_from_the_softmax():
    from xtrain_lessons.training.posttrain.rollouts import sample_rows  # noqa: PLC0415

    logits = np.array([[0.0, 1.0, 2.0, -1.0], [3.0, 3.0, -50.0, 0.0]], dtype=np.float32)
    assert sample_rows(logits, 0.0).tolist() == [2, 0]  # greedy: the first largest
    n = 20000
    draws = sample_rows(np.tile(logits, (n, 1)), 1.0, rng=np.random.default_rng(0)).reshape(n, 2)
    for row in range(2):
        p = np.exp(logits[row] - logits[row].max())
        p /= p.sum()
        freq = np.bincount(draws[:, row], minlength=4) / n
        assert np.all(np.abs(freq - p) <= 5 * np.sqrt(p * (1 - p) / n) + 1e-12), (freq, p)
    again = sample_rows(np.tile(logits, (n, 1)), 1.0, rng=np.random.default_rng(0)).reshape(n, 2)
    assert (again == draws).all()


def test_sample_batch_decodes_different_prompts_of_one_length():
    model = Model(CFG, seed=0)
    prompts = [[3, 9, 4], [5, 1, 2], [7, 7, 7]]
    got = sample_batch(model, prompts, 6, temperature=0.0)
    assert [ids for ids, _ in got] == [generate(model, p, 6, temperature=0.0) for p in prompts]
    with pytest.raises(ValueError, match="one length"):
        sample_batch(model, [[1, 2], [3]], 4)


@pytest.mark.parametrize("loss,aggregation", [("grpo_clip", "sequence_mean"), ("grpo_clip", "constant"),
                                              ("reinforce", "token_mean"), ("no_baseline", "sequence_mean")])
def test_grpo_step_with_each_loss_and_aggregation(loss, aggregation):
    from xtrain_lessons.training.posttrain.grpo import grpo_loss, grpo_step  # noqa: PLC0415
    from xtrain_lessons.training.optim import AdamW  # noqa: PLC0415

    model = Model(CFG, seed=0)
    cfg = GRPOConfig(group=4, prompts_per_step=2, max_new_tokens=6, lr=1e-3, loss=loss, aggregation=aggregation,
                     ddof=0, normalize_by_std=loss == "grpo_clip").validate()
    opt = AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    reward = lambda prompt, completion, n: float(n % 3)  # noqa: E731
    m = grpo_step(model, None, opt, [("a", [1, 2]), ("b", [3, 4])], reward, cfg, np.random.default_rng(0), None,
                  lambda ids: " ".join(map(str, ids)))
    assert np.isfinite(m["loss"]) and m["entropy"] > 0 and m["kl"] is None
    if loss != "no_baseline":  # advantages summing to 0 in each group at ratio 1: loss ~0 for equal lengths
        assert abs(m["loss"]) < 1e-6
    # the constant aggregation divides the masked sum by B x max_new_tokens
    rs, rewards = m["_rollouts"], m["_rewards"]
    ids, targets, mask = rollout_batch(rs)
    with no_grad():
        lp = sequence_logprobs(model, ids, targets).numpy()
    const = GRPOConfig(**{**cfg.to_dict(), "aggregation": "constant"})
    total, _ = grpo_loss(Tensor(lp), lp, rewards, mask, const)
    summed, _ = grpo_loss(Tensor(lp), lp, rewards, mask, GRPOConfig(**{**cfg.to_dict(), "aggregation": "token_mean"}))
    assert total.item() * len(rs) * cfg.max_new_tokens == pytest.approx(summed.item() * mask.sum(), rel=1e-5, abs=1e-9)


def test_config_choices_are_validated():
    for bad, msg in [({"loss": "ppo"}, "loss must be one of"), ({"aggregation": "max"}, "aggregation must be"),
                     ({"ddof": 2}, "ddof must be 0"), ({"warmup": -1}, "warmup")]:
        with pytest.raises(ValueError, match=msg):
            GRPOConfig(**bad).validate()
    cfg = GRPOConfig(lr=1e-3, warmup=4)
    assert [cfg.lr_at(s) for s in (1, 2, 4, 9)] == pytest.approx([2.5e-4, 5e-4, 1e-3, 1e-3])
