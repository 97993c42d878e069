"""T12 fp16 loss scaling: GradScaler against torch.amp.GradScaler on the same gradient
sequence (bit-identical unscaled gradients, skips and scales), its skip/back-off/growth
rules, and `xtrain train --dtype fp16` (skipped steps and the scale in metrics.jsonl)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from xtrain_lessons.training.grad_scaler import GradScaler


def _grad_sequence(n_steps=12, seed=0):
    """Per step: two gradients (as the scaled backward would leave them), some with inf/NaN."""
    rng = np.random.default_rng(seed)
    seq = []
    for k in range(n_steps):
        g = [(rng.standard_normal((3, 5)) * 10.0 ** rng.integers(-3, 4)).astype(np.float32),
             (rng.standard_normal(7) * 1e3).astype(np.float32)]
        if k in (2, 3, 8):
            g[k % 2].flat[k] = np.inf if k != 3 else np.nan
        seq.append(g)
    return seq


@pytest.mark.parametrize("init_scale,interval", [(2.0 ** 16, 3), (1000.0, 2), (3.0e38, 1)])
def test_parity_with_torch_grad_scaler(init_scale, interval):
    torch = pytest.importorskip("torch")
    ours = GradScaler(init_scale=init_scale, growth_interval=interval)
    theirs = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=interval)
    tp = [torch.nn.Parameter(torch.zeros(3, 5)), torch.nn.Parameter(torch.zeros(7))]
    topt = torch.optim.SGD(tp, lr=0.0)
    for grads in _grad_sequence():
        op = [SimpleNamespace(grad=g.copy()) for g in grads]
        for p, g in zip(tp, grads):
            p.grad = torch.from_numpy(g.copy())
        loss = np.float32(2.75)  # the scaled loss, as backward would be seeded with it
        assert np.float32(ours.scale(loss)) == theirs.scale(torch.tensor(loss)).item()
        found = ours.unscale_(op)
        theirs.unscale_(topt)
        t_found = sum(v.item() for v in theirs._per_optimizer_states[id(topt)]["found_inf_per_device"].values())
        assert found == bool(t_found)
        for p, q in zip(op, tp):  # the unscaled gradients, bit for bit (NaN where torch has NaN)
            np.testing.assert_array_equal(p.grad.view(np.uint32), q.grad.numpy().view(np.uint32))
        theirs.step(topt)
        ours.update()
        theirs.update()
        assert np.float32(ours.get_scale()) == np.float32(theirs.get_scale())
        assert ours._growth_tracker == theirs._get_growth_tracker()


def test_defaults_are_torch_defaults():
    torch = pytest.importorskip("torch")
    t = torch.amp.GradScaler("cpu")
    s = GradScaler()
    assert (s.get_scale(), s.growth_factor, s.backoff_factor, s.growth_interval) == (
        t.get_scale(), t.get_growth_factor(), t.get_backoff_factor(), t.get_growth_interval())


class _CountingOpt:
    def __init__(self):
        self.steps = 0

    def step(self, *a, **k):
        self.steps += 1


def test_inf_skips_the_step_and_halves_the_scale_then_grows_after_the_interval():
    s, opt = GradScaler(init_scale=8.0, growth_interval=3), _CountingOpt()
    p = SimpleNamespace(grad=np.array([1.0, np.inf], np.float32))
    assert s.unscale_([p]) is True and s.step(opt) is False
    s.update()
    assert s.get_scale() == 4.0 and opt.steps == 0 and s.skipped_steps == 1
    for k in range(3):
        p.grad = np.array([8.0, 4.0], np.float32)
        assert s.unscale_([p]) is False
        np.testing.assert_array_equal(p.grad, [2.0, 1.0])  # divided by the scale 4
        assert s.step(opt) is True
        s.update()
        assert s.get_scale() == (4.0 if k < 2 else 8.0)  # grows on the 3rd clean step
    assert opt.steps == 3


def test_unscale_twice_is_an_error():
    s = GradScaler()
    p = SimpleNamespace(grad=np.ones(2, np.float32))
    s.unscale_([p])
    with pytest.raises(RuntimeError):
        s.unscale_([p])


def test_an_inf_on_one_rank_makes_every_rank_skip():
    class FakeDist:  # rank 0's flag is False, another rank reported True
        def world_size(self):
            return 2

        def all_reduce(self, a, op):
            assert op == "max"
            a[...] = np.maximum(a, 1.0)

    s = GradScaler()
    assert s.unscale_([SimpleNamespace(grad=np.ones(2, np.float32))], dist=FakeDist()) is True
