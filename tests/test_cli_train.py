"""`xtrain train`, `xtrain sample` and `xtrain bench train` end to end (test preset, tiny corpus)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from xtrain_lessons.cli import main

from test_train import small_corpus  # noqa: E402  (tests/ is on sys.path under pytest)

FLAGS = ["--preset", "test", "--vocab-size", "300", "--steps", "10", "--batch-size", "4",
         "--seq-len", "16", "--max-lr", "1e-2", "--warmup", "2", "--eval-every", "5",
         "--eval-batches", "2", "--sample-every", "5", "--sample-tokens", "8",
         "--checkpoint-every", "5", "--no-progress", "--no-hf-check"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_corpus(tmp_path_factory.mktemp("corpus") / "small.txt")


def _final_weights(run: Path) -> dict:
    latest = (run / "checkpoints" / "latest").read_text().strip()
    return load_file(str(run / "checkpoints" / latest / "model.safetensors"))


def test_train_resume_sample(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    with_check = [f for f in FLAGS if f != "--no-hf-check"]
    assert main.main(["train", "--data", str(corpus), "--out", str(run), *with_check]) == 0
    out = capsys.readouterr().out
    assert "summary: done at step 10/10" in out and "sample @ 5" in out
    assert (run / "hf" / "config.json").exists() and (run / "hf" / "model.safetensors").exists()
    assert "exported the model to" in out
    pytest.importorskip("transformers")
    line = next(ln for ln in out.splitlines() if ln.startswith("transformers"))
    assert "greedy 40 tokens identical on" in line and "max |Δlogit|" in line
    max_delta = float(line.split("max |Δlogit| ")[1].split(";")[0])
    assert max_delta < 1e-4, line
    for name in ("config.json", "tokenizer.json", "data", "checkpoints", "metrics.jsonl",
                 "loss.png", "samples.txt", "summary.json"):
        assert (run / name).exists(), name
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert len(metrics) == 10
    for m in metrics:
        assert {"step", "train_loss", "lr", "tokens_per_s"} <= set(m)
        assert ("val_loss" in m) == (m["step"] % 5 == 0)
    conf = json.loads((run / "config.json").read_text())
    assert conf["train"]["steps"] == 10 and conf["model"]["vocab_size"] <= 300
    assert (run / "samples.txt").read_text().count("--- step") == 2

    # stop after 4 steps, resume from the command line: the same weights as the straight run
    run2 = tmp_path / "run2"
    assert main.main(["train", "--data", str(corpus), "--out", str(run2), *FLAGS, "--stop-at", "4"]) == 0
    assert (run2 / "checkpoints" / "latest").read_text().strip() == "step_00000004"
    assert main.main(["train", "--resume", str(run2), "--no-progress"]) == 0
    a, b = _final_weights(run), _final_weights(run2)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    capsys.readouterr()

    assert main.main(["sample", str(run), "--prompt", "Once upon a time", "--max-new-tokens", "12",
                     "--seed", "1"]) == 0
    text1 = capsys.readouterr().out
    assert text1.startswith("Once upon a time") and len(text1.strip()) > len("Once upon a time")
    assert main.main(["sample", str(run), "--prompt", "Once upon a time", "--max-new-tokens", "12",
                     "--seed", "1"]) == 0
    assert capsys.readouterr().out == text1  # seeded: reproducible
    assert main.main(["sample", str(tmp_path / "missing")]) == 2


def test_config_file_and_flag_priority(corpus, tmp_path):
    cfg = tmp_path / "run.toml"
    cfg.write_text(f'preset = "test"\ndata = "{corpus}"\nsteps = 3\nbatch_size = 2\nseq_len = 8\n'
                   f'vocab_size = 280\neval_every = 0\nsample_every = 0\nsample_tokens = 0\n')
    run = tmp_path / "r"
    assert main.main(["train", "--config", str(cfg), "--out", str(run), "--steps", "2", "--no-progress"]) == 0
    conf = json.loads((run / "config.json").read_text())["train"]
    assert (conf["steps"], conf["batch_size"], conf["seq_len"]) == (2, 2, 8)  # the flag wins over the file
    assert main.main(["train", "--config", str(tmp_path / "nope.toml")]) == 2


def test_nan_stops_with_message_and_exit_code(corpus, tmp_path, capsys, monkeypatch):
    from xtrain_lessons.autograd.tensor import Tensor
    from xtrain_lessons.model.qwen3 import Model

    real = Model.loss
    calls = {"n": 0}

    def poisoned(self, *a, **k):
        calls["n"] += 1
        if calls["n"] == 4:
            return Tensor(np.array(np.inf, dtype=np.float32), requires_grad=True)
        return real(self, *a, **k)

    monkeypatch.setattr(Model, "loss", poisoned)
    run = tmp_path / "nan"
    flags = [f for f in FLAGS]
    flags[flags.index("--eval-every") + 1] = "0"
    flags[flags.index("--checkpoint-every") + 1] = "2"
    assert main.main(["train", "--data", str(corpus), "--out", str(run), *flags]) == 1
    out = capsys.readouterr().out
    assert "TRAINING STOPPED" in out and "inf" in out
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_00000002"
    assert json.loads((run / "summary.json").read_text())["status"] == "diverged"


def test_bench_train_runs(capsys):
    assert main.main(["bench", "train", "--preset", "test", "--vocab-size", "64", "--batch-size", "2",
                     "--seq-len", "16", "--steps", "1", "--peak-n", "256"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("throughput vs torch: ") and "MFU" in last
    from xtrain_lessons.measure.bench import train_flops_per_token
    from xtrain_lessons.model.qwen3 import PRESETS

    c = PRESETS["test"]
    n_matmul = c.n_params() - c.vocab_size * c.dim - c.dim - c.n_layers * (2 * c.dim + 2 * c.head_dim)
    assert train_flops_per_token(c, 16) == 6 * n_matmul + 12 * c.n_layers * 16 * c.n_heads * c.head_dim


def test_bench_rounds_and_bad_counts(capsys):
    assert main.main(["bench", "train", "--preset", "test", "--vocab-size", "64", "--batch-size", "2",
                     "--seq-len", "8", "--steps", "2", "--rounds", "2", "--peak-n", "128",
                     "--no-torch"]) == 0
    assert "2 rounds x 2 timed steps" in capsys.readouterr().out
    for bad in (["--steps", "0"], ["--rounds", "0"]):
        assert main.main(["bench", "train", "--preset", "test", "--vocab-size", "64", *bad]) == 2
        assert "must be at least 1" in capsys.readouterr().out


def test_bench_without_torch_is_graceful(capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    assert main.main(["bench", "train", "--preset", "test", "--vocab-size", "64", "--batch-size", "2",
                     "--seq-len", "8", "--steps", "1", "--peak-n", "128"]) == 0
    out = capsys.readouterr().out
    assert "torch is not installed" in out
    assert out.strip().splitlines()[-1].startswith("throughput vs torch: n/a")


def test_bench_against_eager_and_sdpa(capsys):
    """Every baseline named in --against gets a line (tok/s, MFU, step memory), the same first
    loss as the engine (same weights), and a ratio in the last line, in --against's order."""
    pytest.importorskip("torch")
    assert main.main(["bench", "train", "--preset", "test", "--vocab-size", "64", "--batch-size", "2",
                      "--seq-len", "8", "--steps", "1", "--rounds", "1", "--peak-n", "128", "--threads", "1",
                      "--against", "sdpa, eager"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    engine = next(ln for ln in lines if ln.startswith("engine:"))
    e_loss = float(engine.split("first loss ")[1].split(",")[0])
    for name in ("sdpa", "eager"):
        line = next(ln for ln in lines if ln.startswith(f"torch {name} "))
        assert "tok/s" in line and "MFU" in line and "step peak RSS" in line
        assert abs(float(line.split("first loss ")[1].split()[0]) - e_loss) < 1e-3
    assert lines[-1].startswith("throughput vs torch: sdpa ") and ", eager " in lines[-1]


def test_bench_against_autocast_bf16(capsys):
    """`amp`: the sdpa twin under torch.autocast(bfloat16) (on the CPU here): same weights, so its
    first loss is the engine's within bf16 rounding of the logits (2^-8 relative, x a few)."""
    pytest.importorskip("torch")
    assert main.main(["bench", "train", "--preset", "test", "--vocab-size", "64", "--batch-size", "2",
                      "--seq-len", "8", "--steps", "1", "--rounds", "1", "--peak-n", "128", "--threads", "1",
                      "--against", "amp"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    e_loss = float(next(ln for ln in lines if ln.startswith("engine:")).split("first loss ")[1].split(",")[0])
    amp = next(ln for ln in lines if ln.startswith("torch amp "))
    assert abs(float(amp.split("first loss ")[1].split()[0]) - e_loss) < 4 * 2 ** -8 * e_loss
    assert lines[-1].startswith("throughput vs torch: amp ")
    assert main.main(["bench", "train", "--preset", "test", "--dtype", "bf16"]) == 2  # timed on a GPU only
    assert "--device cuda" in capsys.readouterr().out


def test_bench_against_parsing(capsys):
    from xtrain_lessons.measure.bench import parse_against

    assert parse_against("eager,sdpa,compile") == ["eager", "sdpa", "compile"]
    assert parse_against(" compile , eager,compile") == ["compile", "eager"]
    for bad in ("eager,jit", "", ","):
        assert parse_against(bad) is None
        assert "--against" in capsys.readouterr().out
    assert main.main(["bench", "train", "--preset", "test", "--against", "eager,jit"]) == 2
    assert "unknown baseline jit" in capsys.readouterr().out


def test_peak_rss_delta_sees_a_step_allocation():
    from xtrain_lessons.measure.bench import peak_rss_delta

    def touch(n):
        a = np.ones(n // 8)  # float64: n bytes, every page written
        return float(a[-1])

    big = peak_rss_delta(lambda: touch(64 * 2 ** 20))
    if big is None:
        pytest.skip("no /proc/self/clear_refs here")
    small = peak_rss_delta(lambda: touch(2 ** 20))
    assert 56 * 2 ** 20 < big < 80 * 2 ** 20
    assert small < 16 * 2 ** 20


def test_default_schedule_gets_the_time_limit(monkeypatch):
    """`xtrain train` alone is promised to fit in 10 minutes; a run with --steps is not cut."""
    import types

    import xtrain_lessons.cli.train as train_mod

    seen = []

    def fake_train(cfg=None, *, overrides=None, **kw):
        seen.append(dict(overrides or {}))
        return types.SimpleNamespace(status="done", step=0)

    monkeypatch.setattr(train_mod, "train", fake_train)
    assert main.main(["train", "--no-progress"]) == 0
    assert seen[-1]["time_limit"] == train_mod.DEFAULT_RUN_TIME_LIMIT
    assert main.main(["train", "--steps", "5000", "--no-progress"]) == 0
    assert "time_limit" not in seen[-1]
    assert main.main(["train", "--time-limit", "60", "--no-progress"]) == 0
    assert seen[-1]["time_limit"] == 60
