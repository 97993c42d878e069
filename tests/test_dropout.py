"""Dropout with a counter-based mask (T18): identity cases, expectation, gradients, recompute.

The mask is regenerated from (seed, offset): backward and a recomputed forward must see
exactly the mask the forward used, so every claim of equality here is bit for bit.
"""

import numpy as np
import pytest

from xtrain_lessons.autograd.tensor import Tensor, no_grad
from xtrain_lessons.model.dropout import dropout, dropout_scale, keep_mask
from xtrain_lessons.autograd.gradcheck import gradcheck
from xtrain_lessons.model.qwen3 import PRESETS, Config, Model
from xtrain_lessons.model.recompute import checkpoint, saved_bytes
from xtrain_lessons.runtime.rng import uniform


def _x(shape=(4, 5, 6), seed=0, dtype=np.float32):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def test_forward_is_inverted_dropout_of_the_philox_mask():
    x, p = _x(), 0.3
    y = dropout(Tensor(x, requires_grad=True), p, seed=11, offset=5)
    u = uniform(11, 5, x.size).reshape(x.shape)
    want = np.where(u >= np.float32(p), x * np.float32(1 / (1 - p)), np.float32(0))
    assert y.dtype == np.float32 and np.array_equal(y.data, want)
    assert np.array_equal(keep_mask(x.shape, p, 11, 5), u >= np.float32(p))


def test_p_zero_and_eval_are_the_identity_bit_for_bit():
    x = Tensor(_x(), requires_grad=True)
    assert dropout(x, 0.0, 1, 2) is x
    assert dropout(x, 0.5, 1, 2, training=False) is x
    # and the general formula at p = 0 is exact too: every element kept, scaled by 1.0
    s = dropout_scale(x.shape, 0.0, 1, 2)
    assert np.all(s == 1.0) and np.array_equal(x.data * s, x.data)


def test_mask_depends_only_on_seed_and_offset():
    x = _x((1000,))
    a = dropout(x, 0.5, 3, 4).data
    assert np.array_equal(a, dropout(x, 0.5, 3, 4).data)  # same pair, same mask
    assert not np.array_equal(a, dropout(x, 0.5, 3, 5).data)
    assert not np.array_equal(a, dropout(x, 0.5, 4, 4).data)


def test_keep_fraction_binomial_bound():
    n, p = 200_000, 0.1
    kept = keep_mask((n,), p, 2024, 0).mean()
    assert abs(kept - (1 - p)) < 6 * np.sqrt(p * (1 - p) / n)


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_expectation_is_the_input(p):
    """E[dropout(x)] = x: averaged over S independent masks, each element's mean is within
    6 standard errors, sd_i = |x_i| sqrt(p / (1 - p) / S); and the grand mean of
    dropout(ones(n)) is 1 within 6 sd of the mean, sqrt(p / (1 - p) / n)."""
    x = _x((64,), seed=3)
    S = 20_000
    outs = dropout(np.tile(x, (S, 1)), p, 99, 0).data  # S rows: S independent masks for x
    mean = outs.mean(axis=0)
    sd = np.abs(x) * np.sqrt(p / (1 - p) / S)
    assert np.all(np.abs(mean - x) <= 6 * sd + 1e-6)
    n = 500_000
    m = dropout(np.ones(n, np.float32), p, 5, 0).data.astype(np.float64).mean()
    assert abs(m - 1.0) < 6 * np.sqrt(p / (1 - p) / n)


def test_gradcheck_with_fixed_mask():
    x = _x((3, 7), seed=4, dtype=np.float64)
    assert gradcheck(lambda t: dropout(t, 0.4, 123, 9) * t, [x])
    assert gradcheck(lambda t: dropout(t, 0.0, 1, 1), [x])


def test_backward_regenerates_the_mask_and_stores_nothing():
    x = Tensor(_x(), requires_grad=True)
    y = dropout(x, 0.25, 8, 1)
    g = np.random.default_rng(9).standard_normal(y.shape).astype(np.float32)
    y.backward(g)
    assert np.array_equal(x.grad, g * dropout_scale(x.shape, 0.25, 8, 1))
    assert np.array_equal(x.grad == 0, y.data == 0) or np.all((y.data == 0) >= (x.grad == 0))
    # the graph keeps the output only: no mask array in the closure
    assert saved_bytes(y) == y.data.nbytes


def test_float64_and_errors():
    x = _x(dtype=np.float64)
    y = dropout(x, 0.2, 1, 1)
    assert y.dtype == np.float64
    m = keep_mask(x.shape, 0.2, 1, 1)
    assert np.array_equal(y.data, np.where(m, x * (1 / 0.8), 0.0))
    for bad in (-0.1, 1.0, 1.5):
        with pytest.raises(ValueError):
            dropout(x, bad, 1, 1)
    with pytest.raises(ValueError):
        dropout(x, 0.1, -1, 0)


def test_dropout_inside_checkpoint_is_bit_identical():
    rng = np.random.default_rng(6)
    W = Tensor(rng.standard_normal((8, 8)).astype(np.float32), requires_grad=True)
    x = Tensor(rng.standard_normal((5, 8)).astype(np.float32), requires_grad=True)

    def f(h):
        return dropout((h @ W).tanh(), 0.3, seed=77, offset=3) @ W

    def grads(use_ckpt):
        W.grad = x.grad = None
        y = checkpoint(f, x) if use_ckpt else f(x)
        (y * y).sum().backward()
        return y.data, W.grad.copy(), x.grad.copy()

    for a, b in zip(grads(False), grads(True)):
        assert np.array_equal(a, b)


# -- in the model ------------------------------------------------------------------------

CFG = PRESETS["test"]


def _batch(cfg, B=2, T=12, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (B, T)), rng.integers(0, cfg.vocab_size, (B, T))


def _grads(cfg, steps=1, train=True):
    model = Model(cfg, seed=0).train(train)
    ids, targets = _batch(cfg)
    for _ in range(steps):
        model.zero_grad()
        loss = model.loss(ids, targets)
        loss.backward()
    return loss.data, {k: p.grad for k, p in model.named_parameters().items()}, model


def test_model_dropout_zero_is_bit_identical():
    l0, g0, _ = _grads(CFG)
    l1, g1, m = _grads(CFG.replace(dropout=0.0), train=True)
    assert np.array_equal(l0, l1) and all(np.array_equal(g0[k], g1[k]) for k in g0)
    assert m.dropout_step == 0  # nothing drawn


def test_model_eval_mode_is_identity_and_train_mode_drops():
    ids, _ = _batch(CFG)
    ref = Model(CFG, seed=0)(ids).data
    m = Model(CFG.replace(dropout=0.3), seed=0)
    assert m.training
    assert m.eval() is m and not m.training
    assert np.array_equal(m(ids).data, ref)
    with no_grad():
        cache = m.new_cache()
        # the KV-cache path never drops (it rounds slightly differently from the full forward)
        np.testing.assert_allclose(m.forward_cached(ids[:1], cache, 0), ref[:1], rtol=1e-5, atol=1e-6)
    m.train()
    y1, y2 = m(ids).data, m(ids).data
    assert not np.array_equal(y1, ref)
    assert not np.array_equal(y1, y2)  # a new mask every step
    assert m.dropout_step == 2


def test_model_seed_offset_scheme_reproducible():
    ids, _ = _batch(CFG)
    a = Model(CFG.replace(dropout=0.2), seed=0)
    b = Model(CFG.replace(dropout=0.2), seed=0)
    for _ in range(3):
        assert np.array_equal(a(ids).data, b(ids).data)
    b.dropout_step = 1  # resuming at step 1 reproduces step 1
    c = Model(CFG.replace(dropout=0.2), seed=0)
    c(ids)
    assert np.array_equal(c(ids).data, b(ids).data)


@pytest.mark.parametrize("cfg", [CFG.replace(dropout=0.1),
                                 Config(vocab_size=96, dim=48, n_layers=3, n_heads=4, n_kv_heads=2,
                                        head_dim=12, ffn_dim=128, max_seq_len=48, dropout=0.25)],
                         ids=["test", "small"])
def test_model_dropout_with_recompute_bit_identical(cfg):
    l0, g0, m0 = _grads(cfg, steps=2)
    l1, g1, m1 = _grads(cfg.replace(recompute=True), steps=2)
    assert m0.dropout_step == m1.dropout_step == 2  # the recompute does not advance the step
    assert np.array_equal(l0, l1)
    for k in g0:
        assert np.array_equal(g0[k], g1[k]), k
