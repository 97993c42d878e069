"""Faults that need real processes (issue 21): kill -9 in the middle of a checkpoint write and
an exact resume, SIGTERM to a run, SIGTERM and SIGKILL to `xtrain launch` (no orphans, checked
by pid), two writers of one run directory. Tiny runs, bounded by subprocess timeouts."""

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
from safetensors.numpy import load_file
from test_faults import FLAGS, corpus, trained  # the fixtures are shared

from xtrain_lessons.cli import main
from xtrain_lessons.training.checkpoint import latest_checkpoint

ROOT = Path(__file__).resolve().parents[1]
XTRAIN = [sys.executable, "-m", "xtrain_lessons.cli.main"]
LONG = ["--preset", "test", "--vocab-size", "300", "--steps", "100000", "--batch-size", "2", "--seq-len", "16",
        "--eval-every", "0", "--sample-every", "0", "--sample-tokens", "0", "--checkpoint-every", "0",
        "--no-progress", "--no-export", "--threads", "1"]
pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists() or os.name != "posix",
                                reason="needs POSIX signals and /proc")


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}


def _wait_for_steps(metrics: Path, n: int, proc, timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not (metrics.exists() and metrics.read_text().count("\n") >= n):
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "training did not start in time"
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        out += [int(c) for c in (task / "children").read_text().split()]
    return out


def _weights(run: Path) -> dict:
    return load_file(str(latest_checkpoint(run / "checkpoints") / "model.safetensors"))


DIE_IN_SECOND_CHECKPOINT = """
import os, signal, sys
import safetensors.numpy
real, calls = safetensors.numpy.save_file, []
def dying(tensors, filename, metadata=None):
    real(tensors, filename, metadata=metadata)
    calls.append(filename)
    if len(calls) == 3:  # the model file of the 2nd checkpoint is written, its optimizer not
        os.kill(os.getpid(), signal.SIGKILL)
safetensors.numpy.save_file = dying
from xtrain_lessons.cli import main
sys.exit(main.main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_kill_9_during_a_checkpoint_write_then_resume_is_exact(corpus, trained, tmp_path):
    run = tmp_path / "killed"
    p = subprocess.run([sys.executable, "-c", DIE_IN_SECOND_CHECKPOINT, "train", "--data", str(corpus),
                        "--out", str(run), *FLAGS], env=_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGKILL, p.stderr[-2000:]
    ck = run / "checkpoints"
    assert latest_checkpoint(ck).name == "step_00000002"  # the half-written step 4 is not latest
    assert any(q.name.startswith(".tmp-step_00000004") for q in ck.iterdir())
    assert (run / ".lock").exists()  # left by the killed process: stale, taken over below
    assert main.main(["train", "--resume", str(run), "--no-progress", "--no-export"]) == 0
    a, b = _weights(trained), _weights(run)
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    assert not any(q.name.startswith(".tmp") for q in ck.iterdir())
    rows = [json.loads(s)["step"] for s in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2, 3, 4, 5, 6]


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits(corpus, tmp_path):
    run = tmp_path / "term"
    p = subprocess.Popen([*XTRAIN, "train", "--data", str(corpus), "--out", str(run), *LONG], env=_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_steps(run / "metrics.jsonl", 3, p)
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 130, err[-2000:]
    step = json.loads((run / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    assert f"interrupted by SIGTERM: checkpoint saved at step {step}" in out
    assert latest_checkpoint(run / "checkpoints").name == f"step_{step:08d}"
    assert not (run / ".lock").exists()


def _launch(corpus, run):
    return subprocess.Popen([*XTRAIN, "launch", "--nproc", "2", "--grace", "30", "--max-time", "150", "--",
                             "xtrain", "train", "--data", str(corpus), "--out", str(run), *LONG],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


@pytest.mark.slow
def test_launcher_forwards_sigterm_and_the_workers_checkpoint(corpus, tmp_path):
    run = tmp_path / "dp"
    launcher = _launch(corpus, run)
    try:
        _wait_for_steps(run / "metrics.jsonl", 2, launcher)
        workers = _children(launcher.pid)
        assert len(workers) == 2
        launcher.send_signal(signal.SIGTERM)
        out, err = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
            launcher.wait()
    assert launcher.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert "SIGTERM; forwarding it to the workers" in err
    assert "interrupted by SIGTERM: checkpoint saved" in out, out[-2000:] + "\n--- stderr ---\n" + err[-3000:]
    assert latest_checkpoint(run / "checkpoints") is not None
    assert not any(_alive(w) for w in workers)


@pytest.mark.slow
def test_launcher_sigkill_leaves_no_orphans(corpus, tmp_path):
    run = tmp_path / "dp"
    launcher = _launch(corpus, run)
    try:
        _wait_for_steps(run / "metrics.jsonl", 2, launcher)
        workers = _children(launcher.pid)
        assert len(workers) == 2 and all(_alive(w) for w in workers)
        launcher.kill()  # SIGKILL: no handler runs in the launcher
        launcher.wait(timeout=10)
        deadline = time.monotonic() + 10
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        orphans = [w for w in workers if _alive(w)]
    finally:
        for w in workers if "workers" in dir() else []:
            if _alive(w):
                os.kill(w, signal.SIGKILL)
    assert orphans == [], f"workers {orphans} outlived the launcher"


@pytest.mark.slow
def test_two_writers_of_one_run_directory(corpus, tmp_path, capsys):
    run = tmp_path / "shared"
    first = subprocess.Popen([*XTRAIN, "train", "--data", str(corpus), "--out", str(run), *LONG], env=_env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_steps(run / "metrics.jsonl", 2, first)
        for argv in (["train", "--data", str(corpus), "--out", str(run), *LONG],
                     ["train", "--resume", str(run), "--no-progress"]):
            assert main.main(argv) == 1
            err = capsys.readouterr().err.strip()
            assert err == (f"xtrain train: error: {run} is in use by process {first.pid} ({run / '.lock'}): "
                           f"wait for it to finish or stop it; if that process is gone, delete {run / '.lock'}")
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=60)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    steps = [json.loads(s)["step"] for s in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, len(steps) + 1))  # one writer: no duplicate rows


def _ranks_stop_check(monkeypatch, during_all_reduce=None, peer=(0.0, 0.0, 0.0)):
    """Trainer._should_stop of one rank of two, its all-reduce replaced: `during_all_reduce`
    runs inside it (a signal arriving then), `peer` is what the other rank contributes."""
    from types import SimpleNamespace

    from xtrain_lessons.training import loop

    def fake_agree_max(values):
        if during_all_reduce:
            during_all_reduce()
        return [max(float(v), p) for v, p in zip(values, peer)]

    monkeypatch.setattr(loop.step, "agree_max", fake_agree_max)
    trainer = SimpleNamespace(cfg=SimpleNamespace(time_limit=0), t_start=0.0, ddp=object(), status="done",
                              signum=None)
    return trainer, lambda sigint: loop.Trainer._should_stop(trainer, sigint)


def test_a_signal_during_the_ranks_agreement_is_not_lost(monkeypatch):
    """The handler ran while the ranks agreed on 'no stop' (both ranks get the launcher's
    signal at once, while they wait in that all-reduce): the next boundary stops."""
    from xtrain_lessons.training.loop.run import _SigintDefer

    sigint = _SigintDefer()
    trainer, should_stop = _ranks_stop_check(
        monkeypatch, during_all_reduce=lambda: sigint._handler(signal.SIGTERM, None) if not sigint.requested else None)
    assert not should_stop(sigint)  # this step: both ranks had agreed to go on
    assert should_stop(sigint) and trainer.status == "interrupted" and trainer.signum == signal.SIGTERM


def test_a_rank_stopped_by_its_peer_takes_its_own_signal_as_the_first(monkeypatch):
    """The peer got SIGTERM first: this rank stops, naming it; its own SIGTERM, a moment later
    (while it saves), is a first signal, not a second one (no KeyboardInterrupt)."""
    from xtrain_lessons.training.loop.run import _SigintDefer

    sigint = _SigintDefer()
    trainer, should_stop = _ranks_stop_check(monkeypatch, peer=(1.0, 0.0, float(signal.SIGTERM)))
    assert should_stop(sigint) and trainer.status == "interrupted" and trainer.signum == signal.SIGTERM
    sigint._handler(signal.SIGTERM, None)  # no KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        sigint._handler(signal.SIGTERM, None)  # a real second one still stops at once
