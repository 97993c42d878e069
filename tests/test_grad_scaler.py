"""T12b fp16 loss scaling: GradScaler against torch.amp.GradScaler on the same gradient
sequence (bit-identical unscaled gradients, skips and scales), its skip/back-off/growth
rules, and `xtrain train --dtype fp16` (skipped steps and the scale in metrics.jsonl)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from xtrain_lessons.training.optim.grad_scaler import GradScaler


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


# ------------------------------------------------------------------ in the training loop
from functools import partial  # noqa: E402
import json  # noqa: E402

from xtrain_lessons.cli import main  # noqa: E402
from xtrain_lessons.training import loop  # noqa: E402
from xtrain_lessons.training.config import TrainConfig  # noqa: E402

from test_train import small_corpus  # noqa: E402

SMALL = dict(preset="tiny", model={"n_layers": 2, "dim": 64, "n_heads": 2, "n_kv_heads": 2, "head_dim": 32,
                                   "ffn_dim": 192},
             batch_size=8, seq_len=64, vocab_size=512, eval_every=0, sample_every=0, checkpoint_every=0,
             sample_tokens=0, threads=1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_corpus(tmp_path_factory.mktemp("corpus") / "small.txt")


def _metrics(run):
    return [json.loads(ln) for ln in (run / "metrics.jsonl").read_text().splitlines()]


def test_xtrain_train_dtype_fp16_logs_the_scale(corpus, tmp_path):
    run = tmp_path / "run"
    assert main.main(["train", "--data", str(corpus), "--out", str(run), "--preset", "test", "--vocab-size",
                      "300", "--steps", "6", "--batch-size", "4", "--seq-len", "16", "--dtype", "fp16",
                      "--accum-steps", "2", "--eval-every", "0", "--sample-every", "0", "--sample-tokens",
                      "0", "--no-progress", "--no-hf-check"]) == 0
    m = _metrics(run)
    assert [r["loss_scale"] for r in m] == [2.0 ** 16] * 6 and m[-1]["skipped_steps"] == 0
    assert all(np.isfinite(r["train_loss"]) and r["grad_norm"] > 0 for r in m)


def test_overflowing_steps_are_skipped_and_the_scale_backs_off(corpus, tmp_path, monkeypatch):
    from xtrain_lessons.training.optim import AdamW  # noqa: PLC0415

    calls = []
    real_clip = AdamW.clip_grad_norm

    def counting(self, max_norm, eps=1e-6, scale_state=None):  # the unscale is inside the clip's factor
        calls.append(scale_state is not None)
        return real_clip(self, max_norm, eps, scale_state)

    monkeypatch.setattr(AdamW, "clip_grad_norm", counting)
    monkeypatch.setattr(loop.trainer, "GradScaler", partial(GradScaler, init_scale=2.0 ** 24))
    cfg = TrainConfig(**{**SMALL, "preset": "test", "model": {}}, steps=12, accum_steps=2, dtype="fp16",
                      data=str(corpus), out=str(tmp_path / "run"))
    r = loop.train(cfg, progress=False, log=lambda s: None)
    assert r.status == "done" and calls == [True] * 12  # once per optimizer step, not per micro-batch
    m = _metrics(tmp_path / "run")
    skipped = [r["grad_norm"] is None for r in m]
    n_skip = m[-1]["skipped_steps"]
    assert 0 < n_skip < 12 and sum(skipped) == n_skip and skipped[:n_skip] == [True] * n_skip
    scales = [r["loss_scale"] for r in m]
    assert scales[:n_skip + 1] == [2.0 ** (24 - k) for k in range(n_skip + 1)]  # halved per skip


def test_a_fixed_huge_scale_skips_every_step_and_leaves_the_weights(corpus, tmp_path):
    cfg = TrainConfig(**{**SMALL, "preset": "test", "model": {}}, steps=3, dtype="fp16", loss_scale=1e30,
                      data=str(corpus), out=str(tmp_path / "run"))
    from xtrain_lessons.model.qwen3 import Model  # noqa: PLC0415
    r = loop.train(cfg, progress=False, log=lambda s: None)
    init = Model(r.model.config, seed=cfg.seed)
    assert _metrics(tmp_path / "run")[-1]["skipped_steps"] == 3
    for n, p in r.model.named_parameters().items():
        np.testing.assert_array_equal(p.data, init.params[n].data)


@pytest.mark.slow
def test_fp16_tracks_float32(corpus, tmp_path):
    """Done-when (on a small config; the default takes minutes): the mean loss of the last 20
    steps of an fp16 run with dynamic scaling is within 2% of the float32 run's."""
    means = {}
    for dt in ("float32", "fp16"):
        cfg = TrainConfig(**SMALL, steps=120, dtype=dt, data=str(corpus), out=str(tmp_path / dt))
        means[dt] = float(np.mean(loop.train(cfg, progress=False, log=lambda s: None).losses[-20:]))
    assert abs(means["fp16"] / means["float32"] - 1) < 0.02, means


# ------------------------------------------------------------------ T12b.1's check fails wrong solutions
UPDATE_CASES = [(65536.0, 0, True), (65536.0, 1999, False), (65536.0, 1998, False), (1024.0, 5, True),
                (3.0e38, 2, False, 2.0, 0.5, 3), (8.0, 0, False, 4.0, 0.25, 1), (8.0, 2, True, 4.0, 0.25, 3)]


def update_scale_reference(scale, tracker, found_inf, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
    s = GradScaler(init_scale=scale, growth_factor=growth_factor, backoff_factor=backoff_factor,
                   growth_interval=growth_interval)
    s._growth_tracker, s.found_inf = tracker, bool(found_inf)
    s.update()
    return np.float32(s.get_scale()), s._growth_tracker


def test_update_scale_check_fails_the_mutants(capsys):
    from mutants.T12b_fp16 import UPDATE_SCALE_MUTANTS  # noqa: PLC0415
    from xtrain_lessons.course.checks import check_fn  # noqa: PLC0415

    for wrong in UPDATE_SCALE_MUTANTS:
        assert check_fn("T12b.1", wrong, reference=update_scale_reference, cases=UPDATE_CASES) \
            is not wrong, wrong.__name__  # the reference (wrapped as a fallback) is handed on
        assert "fail" in capsys.readouterr().out


def test_step_unscales_first_when_unscale_was_not_called():
    from xtrain_lessons.autograd.tensor import Tensor  # noqa: PLC0415
    from xtrain_lessons.training.optim import AdamW  # noqa: PLC0415

    w = Tensor(np.ones(3, np.float32), requires_grad=True)
    w.grad = np.array([4.0, 0.0, -4.0], np.float32)
    s = GradScaler(init_scale=4.0)
    assert s.step(AdamW([w], lr=0.1, weight_decay=0.0)) is True
    np.testing.assert_array_equal(w.grad, [1.0, 0.0, -1.0])  # unscaled before the update
    s.update()


def test_fp16_resume_is_exact_and_keeps_the_scale(corpus, tmp_path, monkeypatch):
    """The scaler's state (scale, clean-step count, skips) is in the checkpoint: k steps, stop,
    resume to N equals N straight, skipped steps and scales included."""
    monkeypatch.setattr(loop.trainer, "GradScaler", partial(GradScaler, init_scale=2.0 ** 22, growth_interval=3))
    cfg = TrainConfig(**{**SMALL, "preset": "test", "model": {}}, steps=8, dtype="fp16", data=str(corpus))
    a = loop.train(cfg.replace(out=str(tmp_path / "a")), progress=False, log=lambda s: None)
    loop.train(cfg.replace(out=str(tmp_path / "b")), stop_at=4, progress=False, log=lambda s: None)
    b = loop.train(resume=tmp_path / "b", progress=False, log=lambda s: None)
    ma, mb = _metrics(tmp_path / "a"), _metrics(tmp_path / "b")
    key = ("train_loss", "loss_scale", "skipped_steps", "grad_norm")
    assert [[m[k] for k in key] for m in ma] == [[m[k] for k in key] for m in mb]
    assert ma[-1]["skipped_steps"] > 0  # the state that had to survive the resume
    for n, p in a.model.named_parameters().items():
        np.testing.assert_array_equal(p.data, b.model.named_parameters()[n].data)


def test_bad_loss_scale_is_one_clear_line():
    with pytest.raises(ValueError, match="for dtype fp16"):
        TrainConfig(loss_scale=8.0).validate()
    with pytest.raises(ValueError, match=">= 0"):
        TrainConfig(dtype="fp16", loss_scale=-1.0).validate()
