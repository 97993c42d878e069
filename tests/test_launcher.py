"""T17: `xtrain launch` — torchrun's environment, `xtrain train` on 2 ranks equal to 1 rank with
the double batch, and a dying worker that stops the group with a clear error, never a hang."""

import json
import subprocess
import sys
import time

import numpy as np
import pytest

from xtrain_lessons.parallel.launch import free_port, worker_env

XTRAIN = [sys.executable, "-m", "xtrain_lessons.cli.main"]


def test_worker_env_is_torchrun_compatible():
    env = worker_env(1, 2, "127.0.0.1", 29511, base={})
    assert {k: env[k] for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")} == {
        "RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    assert env["OMP_NUM_THREADS"] == "1"
    assert 0 < free_port() < 65536


def test_launch_runs_every_rank(tmp_path):
    code = ("import os, pathlib; pathlib.Path(r'%s', os.environ['RANK']).write_text("
            "os.environ['WORLD_SIZE'] + ' ' + os.environ['MASTER_ADDR'])" % tmp_path)
    p = subprocess.run([*XTRAIN, "launch", "--nproc", "3", "--", "python", "-c", code],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert sorted(f.name for f in tmp_path.iterdir()) == ["0", "1", "2"]
    assert (tmp_path / "2").read_text() == "3 127.0.0.1"


def test_a_worker_that_exits_stops_the_others():
    code = "import os, sys, time; sys.exit(7) if os.environ['RANK'] == '1' else time.sleep(600)"
    t0 = time.monotonic()
    p = subprocess.run([*XTRAIN, "launch", "--nproc", "2", "--grace", "2", "--", "python", "-c", code],
                       capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - t0
    assert p.returncode == 7
    assert "rank 1 exited with code 7" in p.stderr
    assert elapsed < 30


def test_a_worker_dying_in_training_is_a_bounded_error(tmp_path):
    """Rank 1 exits in the middle of DDP training; rank 0 is blocked in an all-reduce. The
    launcher must exit non-zero, name the rank, and not hang (gloo's error or the kill)."""
    t0 = time.monotonic()
    p = subprocess.run([*XTRAIN, "launch", "--nproc", "2", "--grace", "3", "--max-time", "60", "--",
                        "python", "-m", "xtrain_lessons.measure.ddp_experiments", "equiv", "--steps", "6", "--die-rank", "1",
                        "--die-step", "2", "--out", str(tmp_path / "never.npz")],
                       capture_output=True, text=True, timeout=90)
    elapsed = time.monotonic() - t0
    assert p.returncode != 0
    assert "rank 1 exited with code 3" in p.stderr, p.stderr[-2000:]
    assert elapsed < 60
    assert not (tmp_path / "never.npz").exists()


TRAIN = ["--preset", "test", "--vocab-size", "300", "--steps", "3", "--seq-len", "16", "--warmup", "1",
         "--eval-every", "0", "--sample-every", "0", "--sample-tokens", "0", "--no-export", "--no-progress"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("launch")
    text = d / "t.txt"
    text.write_text(("Once upon a time there was a cat. It liked milk.\n<|endoftext|>\n"
                     "The dog ran to the park and played.\n<|endoftext|>\n") * 60, encoding="utf-8")
    return d, text


def test_xtrain_train_two_ranks_equal_one_rank(corpus):
    from xtrain_lessons.training.checkpoint import load_model_tensors

    d, text = corpus
    p2 = subprocess.run([*XTRAIN, "launch", "--nproc", "2", "--max-time", "80", "--", "xtrain", "train",
                         "--data", str(text), *TRAIN, "--batch-size", "2", "--out", str(d / "two")],
                        capture_output=True, text=True, timeout=90)
    assert p2.returncode == 0, p2.stderr[-3000:]
    p1 = subprocess.run([*XTRAIN, "train", "--data", str(text), *TRAIN, "--batch-size", "4",
                         "--out", str(d / "one")], capture_output=True, text=True, timeout=60)
    assert p1.returncode == 0, p1.stderr[-3000:]
    # only rank 0 logs and checkpoints
    assert p2.stdout.count("summary: done") == 1
    assert not (d / "two" / ".rank1" / "checkpoints").exists()
    m2 = [json.loads(x) for x in (d / "two" / "metrics.jsonl").read_text().splitlines()]
    m1 = [json.loads(x) for x in (d / "one" / "metrics.jsonl").read_text().splitlines()]
    assert [m["tokens"] for m in m2] == [m["tokens"] for m in m1]
    assert max(abs(a["train_loss"] - b["train_loss"]) for a, b in zip(m1, m2)) <= 2e-6  # 6 decimals
    t1, t2 = load_model_tensors(d / "one"), load_model_tensors(d / "two")
    assert max(float(np.abs(t1[k] - t2[k]).max()) for k in t1) <= 1e-6
    # 2 ranks average (g0 + g1) / 2; one process accumulating 2 micro-steps computes
    # g0 / 2 + g1 / 2: halving is exact, so the two are bit-identical
    pa = subprocess.run([*XTRAIN, "train", "--data", str(text), *TRAIN, "--batch-size", "2", "--accum-steps", "2",
                         "--out", str(d / "acc")], capture_output=True, text=True, timeout=60)
    assert pa.returncode == 0, pa.stderr[-3000:]
    ta = load_model_tensors(d / "acc")
    assert all(np.array_equal(ta[k], t2[k]) for k in ta)


def _children(pid):
    out = []
    for task in __import__("pathlib").Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _rank_of(pid):
    env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
    return next(int(e[5:]) for e in env if e.startswith(b"RANK="))


@pytest.mark.skipif(not __import__("pathlib").Path("/proc/self/task").exists(), reason="needs /proc")
def test_xtrain_train_rank_killed_mid_run(corpus):
    """SIGKILL rank 1 of a running `xtrain train`: rank 0 reports the broken collective, the
    launcher exits non-zero naming rank 1, well within the bound."""
    import os
    import signal

    d, text = corpus
    args = [a if a != "3" else "100000" for a in TRAIN]  # --steps 100000: still running when killed
    launcher = subprocess.Popen([*XTRAIN, "launch", "--nproc", "2", "--grace", "3", "--max-time", "80", "--",
                                 "xtrain", "train", "--data", str(text), *args, "--batch-size", "2",
                                 "--out", str(d / "killed")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        metrics = d / "killed" / "metrics.jsonl"
        deadline = time.monotonic() + 60
        while not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            assert time.monotonic() < deadline and launcher.poll() is None, "training did not start"
            time.sleep(0.1)
        victim = next(p for p in _children(launcher.pid) if _rank_of(p) == 1)
        t0 = time.monotonic()
        os.kill(victim, signal.SIGKILL)
        out, err = launcher.communicate(timeout=60)
        elapsed = time.monotonic() - t0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
    assert launcher.returncode != 0
    assert "rank 1 exited with code -9" in err, err[-2000:]
    assert elapsed < 30


def test_xtrain_train_two_ranks_resume_is_exact(corpus):
    """Stop a 2-rank run after 2 of 3 steps, resume it under the launcher: the checkpoint equals
    the straight 3-step 2-rank run bit for bit (rank 0's data generator state is the run's)."""
    from xtrain_lessons.training.checkpoint import load_model_tensors

    d, text = corpus
    launch = [*XTRAIN, "launch", "--nproc", "2", "--max-time", "80", "--"]
    if not (d / "two" / "checkpoints").exists():
        subprocess.run([*launch, "xtrain", "train", "--data", str(text), *TRAIN, "--batch-size", "2",
                        "--out", str(d / "two")], check=True, capture_output=True, timeout=90)
    p = subprocess.run([*launch, "xtrain", "train", "--data", str(text), *TRAIN, "--batch-size", "2",
                        "--stop-at", "2", "--out", str(d / "resumed")], capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr[-3000:]
    p = subprocess.run([*launch, "xtrain", "train", "--resume", str(d / "resumed"), "--no-export", "--no-progress"],
                       capture_output=True, text=True, timeout=90)
    assert p.returncode == 0, p.stderr[-3000:]
    a, b = load_model_tensors(d / "two"), load_model_tensors(d / "resumed")
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_xtrain_train_two_ranks_fp16_and_tokens_per_rank(corpus):
    """fp16 under DDP (one loss scale, the same skips on every rank: they agree by an
    all-reduce) equals one process accumulating the same two micro-batches; metrics.jsonl
    and the log carry per-rank and global tokens/s."""
    from xtrain_lessons.training.checkpoint import load_model_tensors

    d, text = corpus
    fp16 = ["--dtype", "fp16", "--batch-size", "2", "--eval-every", "3", "--eval-batches", "1"]
    p2 = subprocess.run([*XTRAIN, "launch", "--nproc", "2", "--max-time", "80", "--", "xtrain", "train",
                         "--data", str(text), *TRAIN, *fp16, "--out", str(d / "two16")],
                        capture_output=True, text=True, timeout=90)
    assert p2.returncode == 0, p2.stderr[-3000:]
    assert "tok/s per rank" in p2.stdout and " global" in p2.stdout
    pa = subprocess.run([*XTRAIN, "train", "--data", str(text), *TRAIN, *fp16, "--accum-steps", "2",
                         "--out", str(d / "acc16")], capture_output=True, text=True, timeout=60)
    assert pa.returncode == 0, pa.stderr[-3000:]
    m2 = [json.loads(x) for x in (d / "two16" / "metrics.jsonl").read_text().splitlines()]
    ma = [json.loads(x) for x in (d / "acc16" / "metrics.jsonl").read_text().splitlines()]
    for a, b in zip(ma, m2):
        assert abs(a["train_loss"] - b["train_loss"]) <= 2e-6
        assert a["loss_scale"] == b["loss_scale"] and a["skipped_steps"] == b["skipped_steps"]
        assert b["tokens_per_s_per_rank"] == pytest.approx(b["tokens_per_s"] / 2, abs=0.1)
        assert a["tokens_per_s_per_rank"] == a["tokens_per_s"]
    t2, ta = load_model_tensors(d / "two16"), load_model_tensors(d / "acc16")
    assert max(float(np.abs(t2[k] - ta[k]).max()) for k in t2) <= 1e-6
