"""Decoding (T06): sampling pieces, the KV cache against full recomputation, cropping."""

import numpy as np
import pytest

from xtrain_lessons.autograd.tensor import no_grad
from xtrain_lessons.model.generate import generate, sample_next, softmax, top_k_filter, top_p_filter
from xtrain_lessons.model.qwen3 import PRESETS, Model

TOL32 = 1e-5  # cached vs recomputed logits, relative to their scale (float32)


@pytest.fixture(scope="module")
def model():
    m = Model(PRESETS["test"], seed=0)
    # larger weights than the init, so the logits are far from uniform and differ per step
    rng = np.random.default_rng(5)
    for p in m.parameters():
        p.data += 0.1 * rng.standard_normal(p.shape).astype(np.float32)
    return m


# -- sampling pieces ---------------------------------------------------------------------


def test_softmax_and_filters():
    z = np.array([1.0, 3.0, 2.0, 3.0, -1.0])
    p = softmax(z)
    assert np.isclose(p.sum(), 1) and np.allclose(p, np.exp(z) / np.exp(z).sum())
    assert np.array_equal(np.isfinite(top_k_filter(z, 2)), [False, True, False, True, False])
    assert np.array_equal(np.isfinite(top_k_filter(z, 3)), [False, True, True, True, False])
    assert np.array_equal(top_k_filter(z, 10), z)
    # top-p: probabilities sorted are .397 .397 .146 .054 .007 (cumulative .397 .793 .939 .993)
    keep = lambda q: np.isfinite(top_p_filter(z, q))  # noqa: E731
    assert keep(0.3).sum() == 1  # the first token alone reaches 0.3
    assert keep(0.75).sum() == 2
    assert keep(0.9).sum() == 3
    assert keep(0.95).sum() == 4
    assert keep(1.0).all()
    assert keep(1e-9).sum() == 1  # never empty
    with pytest.raises(ValueError):
        top_k_filter(z, 0)


def test_sample_next_greedy_and_k1():
    rng = np.random.default_rng(0)
    z = rng.standard_normal(50)
    assert sample_next(z, 0.0) == int(np.argmax(z))
    assert all(sample_next(z, 2.0, top_k=1, rng=rng) == int(np.argmax(z)) for _ in range(20))
    assert all(sample_next(z, 1.0, top_p=1e-6, rng=rng) == int(np.argmax(z)) for _ in range(20))


def test_sample_next_follows_the_distribution():
    z = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    rng = np.random.default_rng(0)
    n = 10000  # standard error <= 0.005 per probability; 0.02 is 4 of them
    draws = np.bincount([sample_next(z, 1.0, rng=rng) for _ in range(n)], minlength=4) / n
    assert np.abs(draws - [0.5, 0.3, 0.15, 0.05]).max() < 0.02
    # temperature 0.5 squares the odds; top_k=2 renormalises over the two best
    rng = np.random.default_rng(1)
    draws = np.bincount([sample_next(z, 0.5, top_k=2, rng=rng) for _ in range(n)], minlength=4) / n
    want = np.array([0.25, 0.09, 0, 0]) / 0.34
    assert np.abs(draws - want).max() < 0.02 and draws[2:].sum() == 0
    # top_p=0.7: the nucleus is {0.5, 0.3}
    rng = np.random.default_rng(2)
    draws = np.bincount([sample_next(z, 1.0, top_p=0.7, rng=rng) for _ in range(n)], minlength=4) / n
    assert np.abs(draws - [0.625, 0.375, 0, 0]).max() < 0.02


def test_sample_next_seeded():
    z = np.random.default_rng(0).standard_normal(100)
    a = [sample_next(z, 1.0, rng=np.random.default_rng(7)) for _ in range(3)]
    b = [sample_next(z, 1.0, rng=np.random.default_rng(7)) for _ in range(3)]
    assert a == b


# -- KV cache --------------------------------------------------------------------------------


def test_cached_logits_equal_full_recomputation(model):
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 64, (2, 20))
    with no_grad():
        full = model(ids).data  # (2, 20, V)
    cache = model.new_cache(batch=2)
    parts = [model.forward_cached(ids[:, :7], cache, 0)]  # prefill 7 positions
    for t in range(7, 12):  # then one token at a time
        parts.append(model.forward_cached(ids[:, t:t + 1], cache, t))
    parts.append(model.forward_cached(ids[:, 12:], cache, 12))  # then a chunk of 8
    cached = np.concatenate(parts, axis=1)
    assert cache.pos == 20
    err = np.abs(cached - full).max() / np.abs(full).max()
    assert err <= TOL32, err
    with pytest.raises(ValueError, match="start_pos"):
        model.forward_cached(ids[:, :1], cache, 3)


def test_greedy_cache_equals_no_cache(model):
    prompt = [3, 14, 15, 9, 26]
    a = generate(model, prompt, max_new_tokens=20, temperature=0, use_cache=True)
    b = generate(model, prompt, max_new_tokens=20, temperature=0, use_cache=False)
    assert a == b and len(a) == 20
    assert len(set(a)) > 1  # not a degenerate constant output
    # and equal to the argmax of a plain forward at each step
    seq = list(prompt)
    for tok in a[:5]:
        with no_grad():
            assert tok == int(np.argmax(model(np.array([seq])).data[0, -1]))
        seq.append(tok)


def test_sampled_cache_equals_no_cache_and_seed(model):
    kw = dict(max_new_tokens=15, temperature=0.8, top_k=20, top_p=0.95, seed=3)
    a = generate(model, [1, 2, 3], use_cache=True, **kw)
    b = generate(model, [1, 2, 3], use_cache=False, **kw)
    c = generate(model, [1, 2, 3], **{**kw, "seed": 4})
    assert a == b and a != c


def test_context_longer_than_max_seq_len_is_cropped(model):
    L = model.config.max_seq_len  # 32
    prompt = list(np.random.default_rng(1).integers(0, 64, 40))  # longer than L already
    a = generate(model, prompt, max_new_tokens=12, temperature=0, use_cache=True)
    b = generate(model, prompt, max_new_tokens=12, temperature=0, use_cache=False)
    assert a == b and len(a) == 12
    # the model saw only the last L tokens: a different early prefix changes nothing
    other = [7] * 8 + prompt[8:]
    assert generate(model, other, max_new_tokens=12, temperature=0) == a
    # a prompt that fills up during generation (cache path switches to recomputation)
    p2 = prompt[:25]
    assert (generate(model, p2, max_new_tokens=20, temperature=0, use_cache=True)
            == generate(model, p2, max_new_tokens=20, temperature=0, use_cache=False))


def test_eos_and_lengths(model):
    prompt = [5, 6, 7]
    greedy = generate(model, prompt, max_new_tokens=10, temperature=0)
    # stop at eos: the eos token is not returned, nor anything after it
    eos = greedy[3]
    first = greedy.index(eos)
    assert generate(model, prompt, max_new_tokens=10, temperature=0, eos_id=eos) == greedy[:first]
    assert generate(model, prompt, max_new_tokens=0) == []
    assert len(generate(model, prompt, max_new_tokens=4, temperature=1.0)) == 4
    with pytest.raises(ValueError, match="at least one token"):
        generate(model, [], max_new_tokens=3)
