"""Activation recompute (T13): `checkpoint` gives bit-identical gradients and keeps less.

Bit-identity is the claim (np.array_equal, not a tolerance): the recomputed forward runs the
same NumPy operations on the same arrays, and the backward the same ones in the same order.
"""


import numpy as np
import pytest

from xtrain_lessons.autograd.tensor import Tensor, no_grad
from xtrain_lessons.model.qwen3 import PRESETS, Config, Model
from xtrain_lessons.model.recompute import checkpoint, saved_bytes, saved_by_op

SMALL = Config(vocab_size=96, dim=48, n_layers=3, n_heads=4, n_kv_heads=2, head_dim=12,
               ffn_dim=128, max_seq_len=48)  # a slightly bigger model than the test preset


def grads_of(config, recompute, B=3, T=16, seed=0):
    model = Model(config.replace(recompute=recompute), seed=seed)
    rng = np.random.default_rng(1)
    ids = rng.integers(0, config.vocab_size, (B, T))
    targets = rng.integers(0, config.vocab_size, (B, T))
    loss = model.loss(ids, targets)
    loss.backward()
    return loss, {k: p.grad for k, p in model.named_parameters().items()}


@pytest.mark.parametrize("config", [PRESETS["test"], SMALL,
                                    PRESETS["test"].replace(qk_norm=False, n_kv_heads=4)],
                         ids=["test", "small", "mha-no-qknorm"])
def test_model_gradients_bit_identical(config):
    loss0, g0 = grads_of(config, recompute=False)
    loss1, g1 = grads_of(config, recompute=True)
    assert np.array_equal(loss0.data, loss1.data)
    assert g0.keys() == g1.keys()
    for name in g0:
        assert g1[name] is not None, name
        assert np.array_equal(g0[name], g1[name]), f"{name}: max |Δ| = {np.abs(g0[name] - g1[name]).max()}"


def test_model_logits_identical_and_nograd_unchanged():
    ids = np.random.default_rng(2).integers(0, 64, (2, 10))
    a = Model(PRESETS["test"], seed=3)(ids)
    b = Model(PRESETS["test"].replace(recompute=True), seed=3)(ids)
    assert np.array_equal(a.data, b.data)
    assert b.op != "checkpoint"  # the head is outside the blocks
    with no_grad():  # under no_grad checkpoint is just a call
        c = Model(PRESETS["test"].replace(recompute=True), seed=3)(ids)
    assert np.array_equal(a.data, c.data) and not c.requires_grad


def test_model_float64_bit_identical():
    model_a = Model(PRESETS["test"], seed=0, dtype=np.float64)
    model_b = Model(PRESETS["test"].replace(recompute=True), seed=0, dtype=np.float64)
    ids = np.random.default_rng(5).integers(0, 64, (2, 12))
    model_a.loss(ids, ids).backward()
    model_b.loss(ids, ids).backward()
    for (k, pa), pb in zip(model_a.named_parameters().items(), model_b.parameters()):
        assert np.array_equal(pa.grad, pb.grad), k


def test_kv_cache_path_ignores_recompute():
    model = Model(PRESETS["test"].replace(recompute=True), seed=0)
    ids = np.random.default_rng(0).integers(0, 64, (1, 6))
    cache = model.new_cache()
    got = model.forward_cached(ids, cache, 0)
    with no_grad():
        want = model(ids).data
    assert np.array_equal(got, want)


def _toy(seed=0):
    rng = np.random.default_rng(seed)
    W = Tensor(rng.standard_normal((6, 6)).astype(np.float32), requires_grad=True)
    b = Tensor(rng.standard_normal(6).astype(np.float32), requires_grad=True)
    x = Tensor(rng.standard_normal((4, 6)).astype(np.float32), requires_grad=True)
    return W, b, x


def test_closed_over_parameters_accumulate_once():
    W, b, x = _toy()

    def f(h):  # W and b are closed over; W is used twice inside, h twice
        return ((h @ W + b).tanh() @ W) * h

    def loss_of(use_ckpt):
        h = x * 2.0
        y = checkpoint(f, h) if use_ckpt else f(h)
        return (y * y).sum()

    loss_of(False).backward()
    ref = [t.grad.copy() for t in (W, b, x)]
    for t in (W, b, x):
        t.grad = None
    loss_of(True).backward()
    for name, t, r in zip("Wbx", (W, b, x), ref):
        assert np.array_equal(t.grad, r), name
    # a second backward accumulates exactly once more (no double counting)
    for t in (W, b, x):
        t.grad = None
    loss = loss_of(True)
    loss.backward()
    loss.backward()
    for name, t, r in zip("Wbx", (W, b, x), ref):
        assert np.array_equal(t.grad, 2 * r), name  # r + r is exact


def test_input_used_twice_inside():
    W, b, x = _toy(1)

    def f(u):
        return (u @ W) * u + u.exp()  # u used three times inside

    def run(use_ckpt):
        h = x.tanh()
        y = checkpoint(f, h) if use_ckpt else f(h)
        return (y * y).mean()

    run(False).backward()
    ref = [t.grad.copy() for t in (W, x)]
    W.grad = x.grad = None
    run(True).backward()
    assert np.array_equal(W.grad, ref[0]) and np.array_equal(x.grad, ref[1])


def test_sums_regrouped_across_the_boundary_agree_to_rounding():
    """A value that receives 3+ gradient contributions, some inside the checkpoint and some
    outside, is summed in another grouping ((a+b)+c vs (a+c)+b): float addition is not
    associative, so such a value agrees to rounding, not bit for bit. (The transformer has
    no such value: each weight is used inside one block only, and a block input receives
    exactly two contributions, both inside.)"""
    W, b, x = _toy(2)

    def f(u, v):
        return (u @ W) * u + v.exp()

    def run(use_ckpt):
        h = x.tanh()
        y = checkpoint(f, h, h) if use_ckpt else f(h, h)  # the same tensor as two inputs
        z = y + h  # and used again outside
        return (z * z).mean() + (W * W).sum()  # W used inside and outside

    run(False).backward()
    ref = [t.grad.copy() for t in (W, x)]
    W.grad = x.grad = None
    run(True).backward()
    for got, want in zip((W.grad, x.grad), ref):
        np.testing.assert_allclose(got, want, rtol=4 * np.finfo(np.float32).eps,
                                   atol=4 * np.finfo(np.float32).eps * np.abs(want).max())


def test_no_input_requires_grad_params_still_get_gradients():
    W, b, _ = _toy(2)
    x = Tensor(np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32))  # constant
    f = lambda h: (h @ W + b).tanh()  # noqa: E731
    (f(x) ** 2).sum().backward()
    ref = W.grad.copy(), b.grad.copy()
    W.grad = b.grad = None
    y = checkpoint(f, x)
    assert y.requires_grad
    (y ** 2).sum().backward()
    assert np.array_equal(W.grad, ref[0]) and np.array_equal(b.grad, ref[1])


def test_non_tensor_arguments_pass_through_and_errors():
    W, _, x = _toy(4)
    y = checkpoint(lambda h, k, s: (h @ W) * s + k, x, 3, np.float32(0.5))
    ref = (x @ W) * np.float32(0.5) + 3
    assert np.array_equal(y.data, ref.data)
    with pytest.raises(TypeError, match="must return a Tensor"):
        checkpoint(lambda h: h.data, x)


def test_recompute_runs_fn_again_in_backward():
    W, _, x = _toy(5)
    calls = []

    def f(h):
        calls.append(1)
        return (h @ W).tanh()

    y = checkpoint(f, x)
    assert len(calls) == 1
    y.sum().backward()
    assert len(calls) == 2


def test_saved_bytes_counts_activations():
    x = Tensor(np.ones((100, 10), np.float32), requires_grad=True)
    y = (x * 2.0).tanh()  # mul keeps its output; tanh keeps its output: 2 x 4000 bytes
    assert saved_bytes(y) == 2 * 4000
    by = saved_by_op(y)
    assert set(by) == {"mul", "tanh"} and sum(n for n, _ in by.values()) == 2
    z = checkpoint(lambda h: (h * 2.0).tanh(), x)  # keeps only its output (x is the caller's)
    assert saved_bytes(z) == 4000


@pytest.mark.parametrize("config", [PRESETS["test"], SMALL], ids=["test", "small"])
def test_memory_saved(config):
    B, T = 4, 32
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (B, T))
    full = saved_bytes(Model(config, seed=0).loss(ids, ids))
    rec = saved_bytes(Model(config.replace(recompute=True), seed=0).loss(ids, ids))
    # per block, without recompute: tens of (B, T, dim)-sized arrays plus attention probs;
    # with it: one (B, T, dim) output. The head (final norm, logits) is kept by both.
    dim_bytes = B * T * config.dim * 4
    assert full - rec >= config.n_layers * 10 * dim_bytes
    assert rec < full / 2


def test_memory_deterministic_and_grows_with_layers():
    def saved(n_layers, recompute):
        cfg = SMALL.replace(n_layers=n_layers, recompute=recompute)
        ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 16))
        return saved_bytes(Model(cfg, seed=0).loss(ids, ids))
    d_full = saved(4, False) - saved(2, False)
    d_rec = saved(4, True) - saved(2, True)
    assert saved(3, False) == saved(3, False)
    assert d_rec == 2 * 2 * 16 * SMALL.dim * 4  # one block output (B, T, dim) float32 per layer
    assert d_full > 10 * d_rec


def test_recompute_costs_exactly_one_extra_block_forward(monkeypatch):
    """The time cost of recompute, counted instead of timed: each block's projections run once
    more in backward, the lm_head does not (the time itself is measured in the T13 notebook)."""
    import xtrain_lessons.model.qwen3 as model_mod

    cfg = SMALL.replace(n_layers=3)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 12))
    calls = []
    real_linear = model_mod.linear
    monkeypatch.setattr(model_mod, "linear", lambda x, w: calls.append(1) or real_linear(x, w))
    real_head = model_mod.linear_cross_entropy  # the lm_head, fused with the loss (T07)
    monkeypatch.setattr(model_mod, "linear_cross_entropy", lambda *a, **k: calls.append(1) or real_head(*a, **k))

    def projections(recompute):
        calls.clear()
        Model(cfg.replace(recompute=recompute), seed=0).loss(ids, ids).backward()
        return len(calls)

    per_block = 7  # q, k, v, o, gate, up, down
    assert projections(False) == per_block * cfg.n_layers + 1
    assert projections(True) == 2 * per_block * cfg.n_layers + 1
