"""The training loop (library level): config files, exact resume, Ctrl-C, NaN, metrics, plot."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from xtrain_lessons.training.loop import run as train_mod
from xtrain_lessons.training.checkpoint import latest_checkpoint, list_checkpoints
from xtrain_lessons.training.config import TrainConfig
from xtrain_lessons.training.loop import train
from xtrain_lessons.training.metrics import plot_metrics, read_metrics
from xtrain_lessons.training.validation import evaluate

ROOT = Path(__file__).resolve().parents[1]


def small_corpus(path: Path, n_bytes: int = 30_000) -> Path:
    """The first stories of the shipped corpus (whole documents), or a synthetic stand-in."""
    src = ROOT / "data" / "stories.txt"
    if src.exists():
        text = src.read_text(encoding="utf-8")[:n_bytes]
        text = text[: text.rfind("<|endoftext|>")] + "<|endoftext|>\n"
    else:
        rng = np.random.default_rng(0)
        words = "the cat dog sat ran on a mat big red sun happy tom and sue went to play".split()
        docs = [" ".join(rng.choice(words, 60)) + "." for _ in range(120)]
        text = "\n<|endoftext|>\n".join(docs) + "\n<|endoftext|>\n"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_corpus(tmp_path_factory.mktemp("corpus") / "small.txt")


def tiny_cfg(corpus, out, **kw) -> TrainConfig:
    base = dict(preset="test", data=str(corpus), out=str(out), vocab_size=300, steps=12,
                batch_size=4, seq_len=16, max_lr=1e-2, min_lr=1e-3, warmup=2, eval_every=4,
                eval_batches=2, sample_every=6, sample_tokens=8, checkpoint_every=4,
                keep_checkpoints=3)
    base.update(kw)
    return TrainConfig(**base)


def params_of(model):
    return {k: v.data.copy() for k, v in model.named_parameters().items()}


def test_config_files_and_validation(tmp_path):
    (tmp_path / "a.toml").write_text('[train]\npreset = "test"\nsteps = 7\nmax_lr = 0.002\n'
                                     'model = { n_layers = 1 }\n')
    c = TrainConfig.from_file(tmp_path / "a.toml")
    assert (c.preset, c.steps, c.max_lr, c.model) == ("test", 7, 0.002, {"n_layers": 1})
    (tmp_path / "b.json").write_text(json.dumps({"steps": 9, "batch_size": 3}))
    c = TrainConfig.from_file(tmp_path / "b.json")
    assert (c.steps, c.batch_size, c.seq_len) == (9, 3, TrainConfig().seq_len)
    assert TrainConfig.from_dict(c.to_dict()) == c
    (tmp_path / "bad.json").write_text(json.dumps({"stepz": 9}))
    with pytest.raises(ValueError, match="stepz"):
        TrainConfig.from_file(tmp_path / "bad.json")
    with pytest.raises(ValueError, match="steps"):
        TrainConfig(steps=0).validate()


def test_train_learns_writes_run_dir_and_resumes_exactly(corpus, tmp_path):
    straight = train(tiny_cfg(corpus, tmp_path / "a"), progress=False, log=lambda s: None)
    assert straight.status == "done" and straight.step == 12
    run = tmp_path / "a"
    for name in ("config.json", "tokenizer.json", "metrics.jsonl", "samples.txt", "loss.png",
                 "summary.json", "data/train.bin", "data/val.bin", "checkpoints/latest"):
        assert (run / name).exists(), name
    m = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in m] == list(range(1, 13))
    assert all({"step", "train_loss", "lr", "tokens_per_s", "grad_norm"} <= set(r) for r in m)
    assert [r["step"] for r in m if "val_loss" in r] == [4, 8, 12]
    assert m[-1]["lr"] == pytest.approx(1e-3)  # the cosine ends at min_lr on the last update
    assert np.mean([r["train_loss"] for r in m[-3:]]) < m[0]["train_loss"] - 0.3
    assert json.loads((run / "summary.json").read_text())["status"] == "done"

    # k steps, stop; then resume to N: bit-identical to N straight
    part = train(tiny_cfg(corpus, tmp_path / "b"), stop_at=5, progress=False, log=lambda s: None)
    assert part.status == "stopped" and latest_checkpoint(tmp_path / "b" / "checkpoints").name.endswith("05")
    resumed = train(resume=tmp_path / "b", progress=False, log=lambda s: None)
    assert resumed.status == "done" and resumed.step == 12
    a, b = params_of(straight.model), params_of(resumed.model)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    mb = read_metrics(tmp_path / "b" / "metrics.jsonl")
    assert [r["train_loss"] for r in mb] == [r["train_loss"] for r in m]

    # resume with more steps continues the same run (the schedule is then the new one)
    more = train(resume=tmp_path / "b", overrides={"steps": 14}, progress=False, log=lambda s: None)
    assert more.step == 14
    with pytest.raises(ValueError, match="seq_len"):
        train(resume=tmp_path / "b", overrides={"seq_len": 8}, progress=False, log=lambda s: None)


def test_ctrl_c_saves_a_checkpoint_and_resume_is_still_exact(corpus, tmp_path, monkeypatch):
    straight = train(tiny_cfg(corpus, tmp_path / "a", steps=8), progress=False, log=lambda s: None)

    from xtrain_lessons.training.data import TokenDataset

    real = TokenDataset.get_batch
    calls = {"n": 0}

    def interrupted_get_batch(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 6:  # Ctrl-C while fetching the 6th batch (5 steps done)
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(TokenDataset, "get_batch", interrupted_get_batch)
    lines = []
    r = train(tiny_cfg(corpus, tmp_path / "b", steps=8, checkpoint_every=0), progress=False,
              log=lines.append)
    assert r.status == "interrupted" and r.step == 5
    assert any("--resume" in s for s in lines)
    assert latest_checkpoint(tmp_path / "b" / "checkpoints").name == "step_00000005"
    monkeypatch.setattr(TokenDataset, "get_batch", real)
    resumed = train(resume=tmp_path / "b", progress=False, log=lambda s: None)
    a, b = params_of(straight.model), params_of(resumed.model)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_nan_loss_stops_and_keeps_last_good_checkpoint(corpus, tmp_path, monkeypatch):
    from xtrain_lessons.autograd.tensor import Tensor
    from xtrain_lessons.model.qwen3 import Model

    real = Model.loss
    calls = {"n": 0}

    def poisoned(self, x, y, *a, **k):
        out = real(self, x, y, *a, **k)
        calls["n"] += 1
        if calls["n"] == 7:  # the 7th training loss (eval disabled) is NaN
            return Tensor(np.array(np.nan, dtype=np.float32), requires_grad=True)
        return out

    monkeypatch.setattr(Model, "loss", poisoned)
    lines = []
    r = train(tiny_cfg(corpus, tmp_path / "n", checkpoint_every=2, eval_every=0, sample_every=0),
              progress=False, log=lines.append)
    assert r.status == "diverged" and r.step == 6
    assert "nan" in r.summary["message"].lower() and any("TRAINING STOPPED" in s for s in lines)
    ck = tmp_path / "n" / "checkpoints"
    assert latest_checkpoint(ck).name == "step_00000006"
    assert [p.name for p in list_checkpoints(ck)][-1] == "step_00000006"
    # the checkpoint holds the weights of step 6, not something touched by the NaN step
    from xtrain_lessons.training.checkpoint import load_checkpoint

    fresh = Model(r.model.config, seed=123)
    load_checkpoint(ck, fresh)
    for k, v in r.model.named_parameters().items():
        assert np.array_equal(fresh.named_parameters()[k].data, v.data)
        assert np.all(np.isfinite(v.data))


def test_evaluate_and_plot(corpus, tmp_path):
    r = train(tiny_cfg(corpus, tmp_path / "e", steps=4, eval_every=0, sample_every=0, sample_tokens=0),
              progress=False, log=lambda s: None)
    from xtrain_lessons.training.data import TokenDataset

    val = TokenDataset(tmp_path / "e" / "data", "val")
    v1 = evaluate(r.model, val, 4, 16, 2)
    assert np.isfinite(v1) and v1 == evaluate(r.model, val, 4, 16, 2)  # deterministic
    plot_metrics([{"step": 1, "train_loss": 3.0}, {"step": 2, "train_loss": 2.5, "val_loss": 2.7}],
                 tmp_path / "p.png")
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"
    assert train_mod.TrainResult  # public


def test_real_sigint_finishes_the_step_then_saves(corpus, tmp_path, monkeypatch):
    """A real SIGINT (what Ctrl-C sends) is deferred to the end of the step in progress."""
    import os
    import signal

    from xtrain_lessons.training.data import TokenDataset

    real = TokenDataset.get_batch
    calls = {"n": 0}

    def get_batch_then_ctrl_c(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 3:
            os.kill(os.getpid(), signal.SIGINT)
        return real(self, *a, **k)

    monkeypatch.setattr(TokenDataset, "get_batch", get_batch_then_ctrl_c)
    before = signal.getsignal(signal.SIGINT)
    r = train(tiny_cfg(corpus, tmp_path / "s", steps=8, eval_every=0, sample_every=0, sample_tokens=0),
              progress=False, log=lambda s: None)
    assert r.status == "interrupted" and r.step == 3  # the 3rd step was completed, then stop
    assert latest_checkpoint(tmp_path / "s" / "checkpoints").name == "step_00000003"
    assert signal.getsignal(signal.SIGINT) is before  # handler restored


def test_time_limit_and_existing_run_dir(corpus, tmp_path):
    cfg = tiny_cfg(corpus, tmp_path / "t", steps=8, eval_every=0, sample_every=0, sample_tokens=0,
                   checkpoint_every=3)
    r = train(cfg.replace(time_limit=1e-9), progress=False, log=lambda s: None)
    assert r.status == "time_limit" and r.step == 0
    r = train(cfg.replace(time_limit=None, out=str(tmp_path / "u")), stop_at=3, progress=False,
              log=lambda s: None)
    assert r.step == 3
    with pytest.raises(ValueError, match="--resume"):  # never silently mixes two runs
        train(cfg.replace(out=str(tmp_path / "u")), progress=False, log=lambda s: None)


# ----- T07b: host synchronisations only at logging points (TrainConfig.log_every) -----------

def _metrics(run):
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_log_every_reads_at_logging_points_with_the_same_bits_and_metrics(corpus, tmp_path):
    """log_every=5: loss and gradient norm stay on the device, clipping and the finite check
    run there, the values are read every 5 steps (and at eval / sample / checkpoint / the
    end). The weights, and every metric but the timings, equal the step-by-step run's."""
    kw = dict(steps=13, eval_every=6, sample_every=0, checkpoint_every=0, grad_clip=0.05)
    a = train(tiny_cfg(corpus, tmp_path / "a", log_every=1, **kw), progress=False, log=lambda s: None)
    b = train(tiny_cfg(corpus, tmp_path / "b", log_every=5, **kw), progress=False, log=lambda s: None)
    assert a.status == b.status == "done" and a.step == b.step == 13
    pa, pb = params_of(a.model), params_of(b.model)
    assert all(np.array_equal(pa[k], pb[k]) for k in pa)
    drop = ("tokens_per_s", "tokens_per_s_per_rank", "elapsed_s")
    ma = [{k: v for k, v in m.items() if k not in drop} for m in _metrics(tmp_path / "a")]
    mb = [{k: v for k, v in m.items() if k not in drop} for m in _metrics(tmp_path / "b")]
    assert ma == mb and [m["step"] for m in mb] == list(range(1, 14))
    assert any(m["grad_norm"] > 0.05 for m in mb)  # clipping did happen (on the device)
    assert [m["step"] for m in mb if "val_loss" in m] == [6, 12, 13]


def test_log_every_nan_skips_the_update_on_the_device_and_stops_at_the_logging_point(
        corpus, tmp_path, monkeypatch):
    """A NaN at step 7 with log_every=5: its update and the later ones are skipped on the
    device, the run stops when the values are read (step 10), and the model holds the
    weights of step 6, as the step-by-step run (which stops before the update) does."""
    from xtrain_lessons.autograd.tensor import Tensor
    from xtrain_lessons.model.qwen3 import Model

    real = Model.loss

    def run(out, log_every):
        calls = {"n": 0}

        def poisoned(self, x, y, *a, **k):
            out = real(self, x, y, *a, **k)
            calls["n"] += 1
            if calls["n"] == 7:
                return Tensor(np.array(np.nan, dtype=np.float32), requires_grad=True)
            return out

        monkeypatch.setattr(Model, "loss", poisoned)
        lines = []
        r = train(tiny_cfg(corpus, out, log_every=log_every, eval_every=0, sample_every=0,
                           checkpoint_every=0), progress=False, log=lines.append)
        return r, lines, calls["n"]

    step_by_step, _, n1 = run(tmp_path / "s", 1)
    deferred, lines, n5 = run(tmp_path / "d", 5)
    assert (n1, n5) == (7, 10)  # the deferred run went on to the logging point at step 10
    assert step_by_step.status == deferred.status == "diverged"
    assert deferred.step == step_by_step.step == 6
    msg = deferred.summary["message"]
    assert "nan" in msg.lower() and "skipped on the device" in msg and "step 6" in msg
    assert any("TRAINING STOPPED" in s for s in lines)
    a, b = params_of(step_by_step.model), params_of(deferred.model)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert [m["step"] for m in _metrics(tmp_path / "d")] == [1, 2, 3, 4, 5, 6]
    assert not (tmp_path / "d" / "checkpoints" / "latest").exists()  # nothing saved


def test_log_every_rejects_negative(corpus, tmp_path):
    with pytest.raises(ValueError, match="log_every"):
        tiny_cfg(corpus, tmp_path / "x", log_every=-1).validate()


def test_threads_default_explicit_and_under_a_launcher(corpus, tmp_path, monkeypatch):
    """threads=0 (the default) runs on the process's threads (a new process: every core),
    N runs on N and gives the process its setting back; under a launcher the default is this
    process's share of the cores."""
    from xtrain_lessons.runtime import cpu_threads

    def header(out, **kw):
        lines = []
        train(tiny_cfg(corpus, tmp_path / out, steps=1, eval_every=0, sample_every=0, **kw),
              progress=False, log=lines.append)
        return next(line for line in lines if line.startswith("run "))

    before = cpu_threads.get_threads()
    assert TrainConfig().threads == 0
    assert f"on cpu, {before} thread(s):" in header("default")
    assert "on cpu, 3 thread(s):" in header("three", threads=3)
    assert cpu_threads.get_threads() == before
    monkeypatch.setattr(train_mod.os, "cpu_count", lambda: 6)
    assert train_mod._cores_per_process() == 0  # not launched: threads as they are
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert train_mod._cores_per_process() == 3
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert train_mod._cores_per_process() == 1


def test_progress_lines_without_a_terminal(corpus, tmp_path):
    # no progress bar (a notebook, a CI log): a line every steps // 25 steps, eval lines aside
    lines = []
    train(tiny_cfg(corpus, tmp_path / "p", steps=50, eval_every=0, sample_every=0), progress=False,
          log=lines.append)
    steps = [int(s.split()[1].split("/")[0]) for s in lines if s.startswith("step") and "/50:" in s]
    assert steps == list(range(2, 51, 2)), lines
