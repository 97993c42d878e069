"""`xtrain study`: the grid's shape, the held-out split, the scaling-law fit, kill and resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from xtrain_lessons.model.qwen3 import PRESETS as MODEL_PRESETS
from xtrain_lessons.measure.scaling_law import compute_optimal, fit_scaling_law, predict
from xtrain_lessons.measure.study import (
    PRESETS,
    model_overrides,
    non_embedding_params,
    plan_runs,
    split_corpus,
)
from xtrain_lessons.training.tokenizer import EOT

ROOT = Path(__file__).resolve().parents[1]
TRUE = {"E": 1.1, "A": 40.0, "alpha": 0.34, "B": 300.0, "beta": 0.29}


def _grid():
    N = np.repeat([1.4e4, 2.7e4, 5.6e4, 1.6e5, 4.4e5], 3)
    D = np.tile([4.1e4, 8.2e4, 1.64e5], 5)
    return N, D


def test_fit_recovers_known_parameters():
    N, D = _grid()
    fit = fit_scaling_law(N, D, predict(TRUE, N, D))
    for k, v in TRUE.items():
        assert abs(fit[k] - v) <= 1e-6 * v, (k, fit[k], v)
    assert fit["rms_log_error"] < 1e-9


def test_fit_with_noise_predicts_within_the_noise():
    N, D = _grid()
    rng = np.random.default_rng(0)
    noisy = predict(TRUE, N, D) * np.exp(rng.normal(0, 0.005, N.shape))
    fit = fit_scaling_law(N, D, noisy)
    assert 0.003 < fit["rms_log_error"] < 0.006
    rel = np.abs(predict(fit, N, D) / predict(TRUE, N, D) - 1)
    assert rel.max() < 0.01


def test_fit_with_the_floor_fixed():
    """E fixed at the truth: the other four are recovered; fixed elsewhere, the fit is worse (a profile)."""
    N, D = _grid()
    L = predict(TRUE, N, D)
    fit = fit_scaling_law(N, D, L, E=TRUE["E"])
    assert fit["E"] == TRUE["E"]
    for k, v in TRUE.items():
        assert abs(fit[k] - v) <= 1e-6 * v, (k, fit[k], v)
    off = [fit_scaling_law(N, D, L, E=e)["rms_log_error"] for e in (0.0, 0.5, 1.5)]
    assert min(off) > 1e-4 > fit["rms_log_error"]
    with pytest.raises(ValueError, match=r"fixed floor E must be in \[0, min L\)"):
        fit_scaling_law(N, D, L, E=float(L.min()))


def test_fit_rejects_bad_input():
    with pytest.raises(ValueError, match="at least 5 points"):
        fit_scaling_law([1, 2], [1, 2], [1, 2])
    with pytest.raises(ValueError, match="positive"):
        fit_scaling_law(*[np.arange(6.0)] * 3)


def test_compute_optimal_is_the_minimum():
    C = 1e14
    opt = compute_optimal(TRUE, C)
    Ns = np.geomspace(1e2, 1e10, 200_001)
    best = Ns[np.argmin(predict(TRUE, Ns, C / (6 * Ns)))]
    assert abs(opt["N"] / best - 1) < 1e-3
    assert abs(6 * opt["N"] * opt["D"] / C - 1) < 1e-12


@pytest.mark.parametrize("name", ["quick", "full"])
def test_presets_span_the_issue_grid(name):
    p = PRESETS[name]
    assert len(p.sizes) >= 4 and len(p.steps) >= 3
    n = [non_embedding_params(MODEL_PRESETS["tiny"].replace(vocab_size=p.vocab_size, **model_overrides(p, s)))
         for s in p.sizes]
    assert max(n) / min(n) >= 10, n
    runs = plan_runs(p)
    assert len({r.name(p) for r in runs}) == len(runs) == len(p.sizes) * len(p.steps) + len(p.extra)


def test_split_is_a_fixed_tail(tmp_path):
    docs = [f"Story {i}. " + "word " * (i % 7 + 3) for i in range(50)]
    corpus = tmp_path / "c.txt"
    corpus.write_text(f"\n{EOT}\n".join(docs) + "\n", encoding="utf-8")
    a = split_corpus(corpus, tmp_path / "a", eval_bytes=200, small_bytes=100, train_bytes=500)
    b = split_corpus(corpus, tmp_path / "b", eval_bytes=200, small_bytes=100, train_bytes=500)
    assert a == b
    for n in ("train", "eval", "small"):
        assert (tmp_path / "a" / f"{n}.txt").read_bytes() == (tmp_path / "b" / f"{n}.txt").read_bytes()

    def read(n):
        return [d.strip() for d in (tmp_path / "a" / f"{n}.txt").read_text().split(EOT) if d.strip()]

    ev, tr, sm = read("eval"), read("train"), read("small")
    assert ev == [d.strip() for d in docs[-len(ev):]] and sum(len(d) for d in ev) >= 200
    assert tr == [d.strip() for d in docs[-len(ev) - len(tr):-len(ev)]] and sum(len(d) for d in tr) <= 500
    assert sm == tr[:len(sm)] and sum(len(d) for d in sm) >= 100
    with pytest.raises(ValueError, match="too little text"):
        split_corpus(corpus, tmp_path / "c", eval_bytes=10 ** 6, small_bytes=1)


def _study(out: Path) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen([sys.executable, "-m", "xtrain_lessons.cli.study", "--preset", "micro",
                             "--out", str(out), "--no-progress"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _events(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_killed_study_resumes_without_redoing_finished_runs(tmp_path):
    p = PRESETS["micro"]
    first, second = (r.name(p) for r in plan_runs(p)[:2])
    out = tmp_path / "killed"
    proc = _study(out)
    latest = out / "runs" / second / "checkpoints" / "latest"
    deadline = time.time() + 120
    while not latest.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)  # the first run is finished, the second one has a checkpoint
    proc.wait()
    done = out / "runs" / first / "result.json"
    assert done.exists()
    kept = done.read_bytes()
    ckpt = latest.read_text().strip() if latest.exists() else None
    second_done = (out / "runs" / second / "result.json").exists()

    proc = _study(out)
    log = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, log
    assert done.read_bytes() == kept  # reused, not trained again
    ev = _events(out)
    assert [e["event"] for e in ev if e["run"] == first] == ["start", "done", "reuse"]
    # the interrupted run continued from its checkpoint (killed within milliseconds of its
    # first checkpoint, it had 3/4 of its steps to go)
    assert ckpt and not second_done
    step = int(ckpt.split("_")[-1])
    assert [e["event"] for e in ev if e["run"] == second] == ["start", "resume", "done"]
    assert next(e for e in ev if e["run"] == second and e["event"] == "resume")["step"] == step > 0
    for name in ("results.csv", "results.json", "fit.json", "curves.png", "loss_vs_flops.png", "samples.md"):
        assert (out / name).exists(), name
    rows = json.loads((out / "results.json").read_text())
    assert len(rows) == len(plan_runs(p))
    assert "fit on the grid: bits/byte =" in log and "compute-optimal at" in log

    # the same study straight through: the same numbers (resume is exact on one machine)
    straight = tmp_path / "straight"
    proc = _study(straight)
    assert proc.wait(timeout=300) == 0
    rows2 = json.loads((straight / "results.json").read_text())
    assert [r["eval_bits_per_byte"] for r in rows] == [r["eval_bits_per_byte"] for r in rows2]
    assert (out / "corpus" / "eval.txt").read_bytes() == (straight / "corpus" / "eval.txt").read_bytes()


def test_other_settings_in_the_same_directory_are_refused(tmp_path):
    from xtrain_lessons.measure.study import _prepare  # noqa: PLC0415
    import dataclasses  # noqa: PLC0415

    corpus = tmp_path / "c.txt"
    corpus.write_text(f"\n{EOT}\n".join(f"Story {i}. " + "a b c " * 40 for i in range(200)) + "\n")
    p = PRESETS["micro"]
    _prepare(tmp_path / "s", p, corpus, lambda m: None)
    _prepare(tmp_path / "s", p, corpus, lambda m: None)  # the same: fine
    with pytest.raises(ValueError, match="other settings"):
        _prepare(tmp_path / "s", dataclasses.replace(p, seq_len=16), corpus, lambda m: None)
