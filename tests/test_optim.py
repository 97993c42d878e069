"""AdamW / SGD / gradient clipping against torch, on stand-in parameters (`.data`, `.grad`)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xtrain_lessons.training.optim import SGD, AdamW, clip_grad_norm, global_grad_norm

torch = pytest.importorskip("torch")


class P:
    """A duck-typed parameter: what the optimizers need and nothing more."""

    def __init__(self, data):
        self.data = data
        self.grad = None


SHAPES = [(7, 5), (5,), (3, 4, 2), (1,)]
LR, BETAS, EPS, WD = 1e-2, (0.9, 0.95), 1e-8, 0.1


def _make(dtype, seed=0):
    rng = np.random.default_rng(seed)
    init = [rng.standard_normal(s).astype(dtype) for s in SHAPES]
    mine = [P(a.copy()) for a in init]
    theirs = [torch.tensor(a.copy(), requires_grad=True) for a in init]
    return rng, mine, theirs


def _quad_problem(dtype, seed=1):
    """Random separable quadratics f(x) = ½ Σ hᵢ (xᵢ − cᵢ)², started 2–4 units from the optimum.

    Adam near an optimum is chaotic at the scale of lr (the gradient's sign flips and
    √v̂ collapses), so two correct implementations drift apart there by O(lr). Starting
    far enough away that no coordinate reaches its optimum in 1000 steps of size ≲ lr keeps
    the closed loop well conditioned, and the trajectories must then agree to rounding.
    """
    rng = np.random.default_rng(seed)
    probs = []
    for s in SHAPES:
        h = rng.uniform(0.5, 2.0, s).astype(dtype)
        c = rng.standard_normal(s).astype(dtype)
        start = (c + np.sign(rng.standard_normal(s)) * rng.uniform(2.0, 4.0, s)).astype(dtype)
        probs.append((h, c, start))
    return probs


def _np_grads(params, probs):
    for p, (h, c, _) in zip(params, probs):
        p.grad = h * (p.data - c)


def _torch_grads(params, probs):
    for p, (h, c, _) in zip(params, probs):
        p.grad = torch.from_numpy(h) * (p.detach() - torch.from_numpy(c))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_adamw_matches_torch_fed_gradients(dtype):
    """Same gradient sequence into both optimizers for 1000 steps: only the update rule differs."""
    rng, mine, theirs = _make(dtype)
    opt = AdamW(mine, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD)
    topt = torch.optim.AdamW(theirs, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    steps = 1000
    for _ in range(steps):
        for p, t in zip(mine, theirs):
            g = rng.standard_normal(p.data.shape).astype(dtype)
            p.grad = g
            t.grad = torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    err = max(float(np.max(np.abs(p.data - t.detach().numpy()))) for p, t in zip(mine, theirs))
    # Each step moves a weight by at most ~lr·(1+wd|θ|); a rounding difference per step is a few
    # ulps of that, and differences add up at worst linearly over the steps.
    tol = steps * LR * 8 * np.finfo(dtype).eps * 10
    assert err <= tol, (err, tol)
    if dtype == np.float64:
        assert err < 1e-12


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_adamw_matches_torch_closed_loop_quadratic(dtype):
    """Each optimizer follows its own trajectory (gradients from its own weights) for 1000 steps."""
    probs = _quad_problem(dtype)
    mine = [P(st.copy()) for _, _, st in probs]
    theirs = [torch.tensor(st.copy(), requires_grad=True) for _, _, st in probs]
    lr = 1e-3
    opt = AdamW(mine, lr=lr, betas=BETAS, eps=EPS, weight_decay=WD)
    topt = torch.optim.AdamW(theirs, lr=lr, betas=BETAS, eps=EPS, weight_decay=WD, foreach=False)
    f0 = sum(float((h * (st - c) ** 2).sum()) / 2 for h, c, st in probs)
    steps = 1000
    for _ in range(steps):
        _np_grads(mine, probs)
        _torch_grads(theirs, probs)
        opt.step()
        topt.step()
    err = max(float(np.max(np.abs(p.data - t.detach().numpy()))) for p, t in zip(mine, theirs))
    tol = steps * lr * 8 * np.finfo(dtype).eps * 10
    assert err <= tol, (err, tol)
    f1 = sum(float((h * (p.data - c) ** 2).sum()) / 2 for p, (h, c, _) in zip(mine, probs))
    assert f1 < 0.7 * f0  # and the problem was actually being optimised


def test_adamw_named_groups_do_not_decay_1d_params():
    rng = np.random.default_rng(5)
    named = {"w": P(rng.standard_normal((4, 3))), "norm": P(rng.standard_normal(3)),
             "emb": P(rng.standard_normal((6, 3)))}
    opt = AdamW(named, lr=LR, weight_decay=WD)
    wd_of = {n: g["weight_decay"] for g in opt.groups for n, _ in g["params"]}
    assert wd_of == {"w": WD, "emb": WD, "norm": 0.0}
    tw = {n: torch.tensor(p.data.copy(), requires_grad=True) for n, p in named.items()}
    topt = torch.optim.AdamW([{"params": [tw["w"], tw["emb"]]},
                              {"params": [tw["norm"]], "weight_decay": 0.0}],
                             lr=LR, weight_decay=WD, foreach=False)
    for _ in range(50):
        for n, p in named.items():
            g = rng.standard_normal(p.data.shape)
            p.grad, tw[n].grad = g, torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    for n, p in named.items():
        np.testing.assert_allclose(p.data, tw[n].detach().numpy(), rtol=0, atol=1e-13)


def test_adamw_pure_decay_when_gradient_is_zero():
    """With g = 0 the moments stay 0 and only the decoupled decay acts: θ_t = θ₀(1 − lr·λ)^t."""
    p = P(np.array([1.0, -2.0, 3.0]))
    opt = AdamW([p], lr=0.1, weight_decay=0.5)
    for _ in range(10):
        p.grad = np.zeros(3)
        opt.step()
    np.testing.assert_allclose(p.data, np.array([1.0, -2.0, 3.0]) * (1 - 0.05) ** 10, rtol=1e-14)


def test_adamw_skips_params_without_grad_like_torch():
    rng, mine, theirs = _make(np.float64, seed=7)
    opt = AdamW(mine, lr=LR, weight_decay=WD)
    topt = torch.optim.AdamW(theirs, lr=LR, weight_decay=WD, foreach=False)
    for k in range(20):
        for i, (p, t) in enumerate(zip(mine, theirs)):
            if (k + i) % 3 == 0:  # this parameter got no gradient this step
                p.grad, t.grad = None, None
            else:
                g = rng.standard_normal(p.data.shape)
                p.grad, t.grad = g, torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    for p, t in zip(mine, theirs):
        np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=0, atol=1e-13)
    assert opt.state["0"]["step"] == int(topt.state[theirs[0]]["step"])


def test_adamw_state_dict_resume_is_bit_exact():
    rng = np.random.default_rng(11)
    grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(20)]
    init = [np.random.default_rng(12).standard_normal(s).astype(np.float32) for s in SHAPES]

    def named(arrs):
        return {f"p{i}": P(a.copy()) for i, a in enumerate(arrs)}

    straight = named(init)
    opt = AdamW(straight, lr=LR, weight_decay=WD)
    for k in range(20):
        for p, g in zip(straight.values(), grads[k]):
            p.grad = g
        opt.step(lr=LR * (k + 1) / 20)

    first = named(init)
    opt1 = AdamW(first, lr=LR, weight_decay=WD)
    for k in range(8):
        for p, g in zip(first.values(), grads[k]):
            p.grad = g
        opt1.step(lr=LR * (k + 1) / 20)
    sd = opt1.state_dict()
    meta = json.loads(json.dumps(sd["meta"]))  # JSON-able
    tensors = {k: v.copy() for k, v in sd["tensors"].items()}
    assert set(tensors) == {f"p{i}.{s}" for i in range(len(SHAPES)) for s in ("exp_avg", "exp_avg_sq")}

    second = {n: P(p.data.copy()) for n, p in first.items()}
    opt2 = AdamW(second, lr=123.0, weight_decay=0.0)
    opt2.load_state_dict({"tensors": tensors, "meta": meta})
    assert opt2.groups[0]["weight_decay"] == WD
    for k in range(8, 20):
        for p, g in zip(second.values(), grads[k]):
            p.grad = g
        opt2.step(lr=LR * (k + 1) / 20)
    for n in straight:
        assert np.array_equal(straight[n].data, second[n].data), n


def test_load_state_dict_rejects_mismatch():
    a = {"w": P(np.zeros((2, 2)))}
    b = {"v": P(np.zeros((2, 2)))}
    opt = AdamW(a)
    a["w"].grad = np.ones((2, 2))
    opt.step()
    with pytest.raises(ValueError):
        AdamW(b).load_state_dict(opt.state_dict())
    with pytest.raises(ValueError):
        SGD(a).load_state_dict(opt.state_dict())


@pytest.mark.parametrize("kw", [dict(), dict(momentum=0.9), dict(momentum=0.9, nesterov=True),
                                dict(momentum=0.8, dampening=0.1, weight_decay=0.01)])
def test_sgd_matches_torch(kw):
    rng, mine, theirs = _make(np.float64, seed=2)
    opt = SGD(mine, lr=0.05, **kw)
    topt = torch.optim.SGD(theirs, lr=0.05, foreach=False, **kw)
    for _ in range(200):
        for p, t in zip(mine, theirs):
            g = rng.standard_normal(p.data.shape)
            p.grad, t.grad = g, torch.from_numpy(g.copy())
        opt.step()
        topt.step()
    for p, t in zip(mine, theirs):
        np.testing.assert_allclose(p.data, t.detach().numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_clip_grad_norm_matches_torch(max_norm, dtype):
    rng = np.random.default_rng(4)
    mine = [P(rng.standard_normal(s).astype(dtype)) for s in SHAPES]
    theirs = [torch.tensor(p.data.copy(), requires_grad=True) for p in mine]
    for i, (p, t) in enumerate(zip(mine, theirs)):
        if i == 1:
            continue  # a parameter without gradient is skipped
        g = rng.standard_normal(p.data.shape).astype(dtype)
        p.grad, t.grad = g, torch.from_numpy(g.copy())
    norm = clip_grad_norm(mine, max_norm)
    tnorm = float(torch.nn.utils.clip_grad_norm_(theirs, max_norm))
    tol = 10 * float(np.finfo(dtype).eps)
    assert abs(norm - tnorm) <= tol * tnorm
    for p, t in zip(mine, theirs):
        if t.grad is None:
            assert p.grad is None
        else:
            np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=tol, atol=tol)
    after = global_grad_norm(mine)
    assert after <= max_norm * (1 + tol)
    if max_norm > norm:
        assert after == pytest.approx(norm, rel=tol)


def test_clip_grad_norm_reports_non_finite_without_touching_grads():
    p = P(np.zeros(3, dtype=np.float32))
    p.grad = np.array([1.0, np.inf, 2.0], dtype=np.float32)
    assert not np.isfinite(clip_grad_norm([p], 1.0))
    assert p.grad[0] == 1.0
