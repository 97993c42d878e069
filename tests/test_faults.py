"""Faults and bad input (issue 21), in process: every expected failure is one line naming the
file, flag or value, exit 2 (usage) or 1 (runtime), no traceback; no silent wrong resume;
a full disk leaves earlier checkpoints intact; a divergence leaves `latest` on a good one.

Signals, kill -9 and the launcher are in test_faults_signals.py (subprocesses)."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file
from test_train import small_corpus

from xtrain_lessons.cli import main
from xtrain_lessons.training import checkpoint as ckpt_mod
from xtrain_lessons.training.checkpoint import latest_checkpoint, list_checkpoints
from xtrain_lessons.training.rundir import RunDirError, RunLock

FLAGS = ["--preset", "test", "--vocab-size", "300", "--steps", "6", "--batch-size", "4",
         "--seq-len", "16", "--max-lr", "1e-2", "--warmup", "2", "--eval-every", "2",
         "--eval-batches", "2", "--sample-every", "0", "--sample-tokens", "0",
         "--checkpoint-every", "2", "--keep-checkpoints", "3", "--no-progress", "--no-export"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_corpus(tmp_path_factory.mktemp("corpus") / "small.txt")


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    """A finished 6-step run with checkpoints at steps 2, 4 and 6 (copy it before changing it)."""
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main.main(["train", "--data", str(corpus), "--out", str(run), *FLAGS]) == 0
    return run


@pytest.fixture
def run(trained, tmp_path):
    dst = tmp_path / "run"
    shutil.copytree(trained, dst)
    return dst


def fails(capsys, argv, code) -> str:
    """Run `xtrain argv`: exit `code`, and one line on stderr, no traceback. Returns that line."""
    assert main.main([str(a) for a in argv]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert err and "Traceback" not in "\n".join(err), err
    line = err[-1]
    assert line.startswith(f"xtrain {argv[0]}: error: "), line
    return line


# ----- bad arguments and bad config values ---------------------------------------------------

@pytest.mark.parametrize("extra, needle", [
    (["--model", "nosuch=1"], "unknown model key nosuch"),
    (["--model", "n_layers=two"], "model n_layers must be int"),
    (["--model", "n_layers"], "--model expects KEY=VALUE"),
    (["--grad-clip", "-1"], "grad_clip must be a finite number >= 0"),
    (["--grad-clip", "nan"], "grad_clip must be a finite number >= 0, got nan"),
    (["--time-limit", "-1"], "time_limit must be a finite number"),
    (["--stop-at", "0"], "--stop-at must be a positive number"),
    (["--stop-at", "-3"], "--stop-at must be a positive number"),
    (["--steps", "0"], "steps must be a positive integer"),
    (["--max-lr", "inf"], "max_lr must be a finite number"),
    (["--spike-factor", "0.5"], "spike_factor must be 0 (off) or > 1"),
    (["--dtype", "fp8"], "dtype must be 'float32', 'bf16' or 'fp16'"),
    (["--preset", "huge"], "preset must be one of"),
    (["--from-checkpoint", "step_00000002"], "--from-checkpoint needs --resume"),
])
def test_bad_train_flags(corpus, tmp_path, capsys, extra, needle):
    line = fails(capsys, ["train", "--data", corpus, "--out", tmp_path / "r", *FLAGS, *extra], 2)
    assert needle in line
    assert not (tmp_path / "r" / "checkpoints").exists()


@pytest.mark.parametrize("toml, needle", [
    ('preset = "test"\nmodel = { nosuch = 1 }\n', "unknown model key nosuch"),
    ('preset = "test"\nsteps = "ten"\n', "steps must be int, got 'ten'"),
    ('preset = "test"\nnosuch = 1\n', "unknown TrainConfig key nosuch"),
    ('preset = "test"\nsteps = 3\nsteps = \n', "is not valid TOML"),
])
def test_bad_config_file_names_the_file(tmp_path, capsys, toml, needle):
    cfg = tmp_path / "run.toml"
    cfg.write_text(toml)
    line = fails(capsys, ["train", "--config", cfg, "--out", tmp_path / "r"], 2)
    assert needle in line and str(cfg) in line


def test_data_that_is_a_directory_or_not_utf8(tmp_path, capsys):
    line = fails(capsys, ["train", "--data", tmp_path, "--out", tmp_path / "r", *FLAGS], 2)
    assert f"--data {tmp_path} is a directory" in line
    bad = tmp_path / "latin1.txt"
    bad.write_bytes(("Once upon a time " * 50).encode() + b"caf\xe9 " + b"more text " * 50)
    line = fails(capsys, ["train", "--data", bad, "--out", tmp_path / "r2", *FLAGS], 2)
    assert f"{bad} is not valid UTF-8 (byte {17 * 50 + 3}" in line


@pytest.mark.parametrize("extra, needle", [
    (["--temperature", "-1"], "--temperature must be a finite number >= 0"),
    (["--temperature", "nan"], "--temperature must be a finite number >= 0 (0: greedy), got nan"),
    (["--top-k", "0"], "--top-k must be >= 1"),
    (["--top-p", "0"], "--top-p must be in (0, 1]"),
    (["--top-p", "2"], "--top-p must be in (0, 1]"),
    (["--max-new-tokens", "0"], "--max-new-tokens must be >= 1"),
    (["--max-new-tokens", "100000000"], "is more than the model's context of 32 tokens: give at most 32"),
])
def test_bad_sample_flags(trained, capsys, extra, needle):
    assert needle in fails(capsys, ["sample", trained, *extra], 2)


def test_sample_on_broken_or_foreign_folders(run, tmp_path, capsys):
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "qwen3"}')
    (hf / "model.safetensors").write_bytes(b"")
    assert "looks like a Hugging Face model folder" in fails(capsys, ["sample", hf], 2)
    step = run / "checkpoints" / "step_00000006"
    state = json.loads((step / "state.json").read_text())
    state["model_config"]["dim"] = "wide"
    (step / "state.json").write_text(json.dumps(state))
    assert "model config of" in fails(capsys, ["sample", run], 2)
    (run / "checkpoints" / "latest").write_text("step_00000004\n")
    tok = (run / "tokenizer.json").read_text()
    (run / "tokenizer.json").write_text(tok[: len(tok) // 2])
    line = fails(capsys, ["sample", run], 2)
    assert "tokenizer.json is not a valid tokenizer.json" in line


def test_invalid_run_config(run, capsys):
    step = run / "checkpoints" / "step_00000006"
    state = json.loads((step / "state.json").read_text())
    state["model_config"] = None  # the model config then comes from config.json
    (step / "state.json").write_text(json.dumps(state))
    conf = json.loads((run / "config.json").read_text())
    (run / "config.json").write_text(json.dumps({**conf, "model": {**conf["model"], "dim": "x"}}))
    assert "model config dim must be int, got 'x'" in fails(capsys, ["sample", run], 2)
    (run / "config.json").write_text(json.dumps({**conf, "train": {**conf["train"], "steps": "x"}}))
    line = fails(capsys, ["train", "--resume", run, "--no-progress"], 2)
    assert f"{run / 'config.json'}: TrainConfig steps must be int, got 'x'" in line
    (run / "config.json").write_text("{")
    assert "config.json is not valid JSON" in fails(capsys, ["sample", run], 2)


def test_disk_full_during_the_export(trained, tmp_path, capsys, monkeypatch):
    from safetensors import SafetensorError

    from xtrain_lessons.interop import hf

    def full(*a, **k):
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(hf, "save_file", full)
    line = fails(capsys, ["export", trained, "--out", tmp_path / "hf"], 1)
    assert "no space left on device" in line
    assert list(tmp_path.iterdir()) == []  # no half-written folder


def test_export_onto_a_file_and_import_of_a_bad_tokenizer(trained, tmp_path, capsys):
    f = tmp_path / "file.txt"
    f.write_text("x")
    assert "is a file: give a folder" in fails(capsys, ["export", trained, "--out", f], 1)
    hf = tmp_path / "hf"
    assert main.main(["export", str(trained), "--out", str(hf)]) == 0
    (hf / "tokenizer.json").write_text("not json {")
    capsys.readouterr()
    line = fails(capsys, ["import-hf", hf, "--out", tmp_path / "imported"], 1)
    assert "tokenizer.json is not a readable tokenizer.json" in line


def test_fetch_refuses_an_unverifiable_download(tmp_path, capsys):
    line = fails(capsys, ["data", "fetch", "tinystories", "--out", tmp_path, "--quiet"], 1)
    assert "no sha256 is pinned" in line and "--sha256" in line
    assert list(tmp_path.iterdir()) == []


def test_debug_shows_the_traceback(corpus, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="grad_clip"):
        main.main(["train", "--debug", "--data", str(corpus), "--out", str(tmp_path / "r"), *FLAGS,
                   "--grad-clip", "-1"])
    monkeypatch.setenv("XTRAIN_DEBUG", "1")
    with pytest.raises(ValueError, match="grad_clip"):
        main.main(["train", "--data", str(corpus), "--out", str(tmp_path / "r"), *FLAGS, "--grad-clip", "-1"])


# ----- resume: identity, corruption, the previous intact checkpoint --------------------------

def _flip_byte(p: Path, at: int) -> None:
    b = bytearray(p.read_bytes())
    b[at] ^= 0xFF
    p.write_bytes(bytes(b))


CORRUPTIONS = {
    "truncated model": lambda s: (s / "model.safetensors").write_bytes((s / "model.safetensors").read_bytes()[:100]),
    "flipped model": lambda s: _flip_byte(s / "model.safetensors", -5),
    "flipped header": lambda s: _flip_byte(s / "model.safetensors", 20),
    "truncated optimizer": lambda s: (s / "optimizer.safetensors").write_bytes(b""),
    "truncated state": lambda s: (s / "state.json").write_text((s / "state.json").read_text()[:200]),
    "missing model": lambda s: (s / "model.safetensors").unlink(),
}


@pytest.mark.parametrize("how", sorted(CORRUPTIONS))
def test_corrupt_latest_names_the_previous_intact_one(run, capsys, how):
    CORRUPTIONS[how](run / "checkpoints" / "step_00000006")
    line = fails(capsys, ["train", "--resume", run, "--no-progress"], 1)
    assert "step_00000006" in line
    assert "The previous intact checkpoint is step_00000004" in line
    assert f"--resume {run} --from-checkpoint step_00000004" in line


def test_sample_on_a_corrupt_latest_names_the_previous_one(run, capsys):
    CORRUPTIONS["flipped model"](run / "checkpoints" / "step_00000006")
    line = fails(capsys, ["sample", run, "--max-new-tokens", "4"], 2)
    prev = run / "checkpoints" / "step_00000004"
    assert f"The previous intact checkpoint is {prev}" in line
    assert main.main(["sample", str(prev), "--max-new-tokens", "4"]) == 0


def test_resume_from_the_previous_checkpoint_is_exact(run, trained, capsys):
    CORRUPTIONS["flipped model"](run / "checkpoints" / "step_00000006")
    assert main.main(["train", "--resume", str(run), "--from-checkpoint", "step_00000004", "--no-progress",
                      "--no-export"]) == 0
    assert latest_checkpoint(run / "checkpoints").name == "step_00000006"
    assert any(p.name.startswith(".abandoned-step_00000006") for p in (run / "checkpoints").iterdir())
    a = load_file(str(trained / "checkpoints" / "step_00000006" / "model.safetensors"))
    b = load_file(str(run / "checkpoints" / "step_00000006" / "model.safetensors"))
    assert all(np.array_equal(a[k], b[k]) for k in a)
    rows = [json.loads(s)["step"] for s in (run / "metrics.jsonl").read_text().splitlines()]
    assert rows == [1, 2, 3, 4, 5, 6]  # no duplicate rows


def test_checkpoint_of_another_run_is_refused(run, corpus, tmp_path, capsys):
    other = tmp_path / "other"
    assert main.main(["train", "--data", str(corpus), "--out", str(other), *FLAGS, "--seed", "1",
                      "--stop-at", "2"]) == 0
    capsys.readouterr()
    ck = run / "checkpoints"
    shutil.rmtree(ck / "step_00000006")
    shutil.copytree(other / "checkpoints" / "step_00000002", ck / "step_00000006")
    line = fails(capsys, ["train", "--resume", run, "--no-progress"], 1)
    assert "records step 2, but its directory is named step_00000006" in line
    # a checkpoint copied under its own name: the same refusal
    shutil.rmtree(ck / "step_00000006")
    shutil.rmtree(ck / "step_00000002")
    shutil.copytree(other / "checkpoints" / "step_00000002", ck / "step_00000002")
    (ck / "latest").write_text("step_00000002\n")
    assert "belongs to run" in fails(capsys, ["train", "--resume", run, "--no-progress"], 1)


def test_latest_cannot_leave_the_run_and_step_names_must_match(run, capsys):
    ck = run / "checkpoints"
    (ck / "latest").write_text("../../elsewhere/checkpoints/step_00000006\n")
    assert "not a step directory inside" in fails(capsys, ["train", "--resume", run, "--no-progress"], 1)
    (ck / "latest").write_text("/tmp\n")
    assert "not a step directory inside" in fails(capsys, ["train", "--resume", run, "--no-progress"], 1)
    os.rename(ck / "step_00000006", ck / "step_00000008")
    (ck / "latest").write_text("step_00000008\n")
    line = fails(capsys, ["train", "--resume", run, "--no-progress"], 1)
    assert "records step 6, but its directory is named step_00000008" in line


def test_vocabulary_and_size_mismatch(run, capsys):
    conf = json.loads((run / "config.json").read_text())
    conf["model"]["vocab_size"] += 10
    (run / "config.json").write_text(json.dumps(conf))
    line = fails(capsys, ["train", "--resume", run, "--no-progress"], 1)
    assert "different model config" in line and "vocab_size" in line
    conf["model"]["vocab_size"] -= 10
    conf["model"]["dim"] = 64
    conf["model"]["head_dim"] = 16
    (run / "config.json").write_text(json.dumps(conf))
    assert "different model config" in fails(capsys, ["train", "--resume", run, "--no-progress"], 1)


# ----- disk full, two writers, divergence -------------------------------------------------------

def test_disk_full_during_a_checkpoint(run, capsys, monkeypatch):
    from safetensors import SafetensorError

    def full(*a, **k):
        # the text safetensors gives on a full tmpfs
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(ckpt_mod.state.safetensors.numpy, "save_file", full)
    line = fails(capsys, ["train", "--resume", run, "--steps", "8", "--no-progress", "--no-export"], 1)
    assert "no space left on device writing checkpoint step_00000008" in line
    assert "`latest` still names step_00000006" in line
    ck = run / "checkpoints"
    assert latest_checkpoint(ck).name == "step_00000006"
    assert not [p for p in ck.iterdir() if p.name.startswith(".tmp")]  # nothing half-written
    assert not (run / ".lock").exists()
    monkeypatch.undo()
    assert main.main(["train", "--resume", str(run), "--steps", "8", "--no-progress", "--no-export"]) == 0
    assert latest_checkpoint(ck).name == "step_00000008"


def test_disk_full_while_preparing_data(corpus, tmp_path, capsys, monkeypatch):
    from xtrain_lessons.training import data as data_mod

    real = data_mod.atomic_write_bytes

    def full(path, data):
        if str(path).endswith(".bin"):
            raise OSError(errno.ENOSPC, "No space left on device", str(path))
        return real(path, data)

    monkeypatch.setattr(data_mod, "atomic_write_bytes", full)
    line = fails(capsys, ["data", "prepare", corpus, "--out", tmp_path / "d", "--vocab-size", "300"], 1)
    assert "no space left on device writing" in line and "train.bin" in line
    assert not (tmp_path / "d" / "data.json").exists()


def test_a_second_writer_gets_the_holders_pid(run, capsys):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / ".lock").write_text(f"{holder.pid} {os.uname().nodename}\n")
        line = fails(capsys, ["train", "--resume", run, "--no-progress"], 1)
        assert f"is in use by process {holder.pid}" in line
    finally:
        holder.kill()
        holder.wait()
    # the holder is gone: a stale lock is taken over
    assert main.main(["train", "--resume", str(run), "--steps", "7", "--no-progress", "--no-export"]) == 0
    assert not (run / ".lock").exists()


def test_run_lock_is_exclusive(tmp_path):
    with RunLock(tmp_path):
        with pytest.raises(RunDirError, match=f"in use by process {os.getpid()}"):
            RunLock(tmp_path).acquire()
    assert not (tmp_path / ".lock").exists()


def test_divergence_leaves_latest_on_a_good_checkpoint(corpus, tmp_path, capsys):
    """lr warming up to 10: the loss climbs from step 2 on and the spike guard stops the run
    at step 3; the checkpoints of steps 2 and 3 are already worse, so `latest` goes back to
    the best one (the lowest validation loss), the checkpoint of step 1."""
    run = tmp_path / "div"
    flags = list(FLAGS)
    flags[flags.index("--max-lr") + 1] = "10"
    flags[flags.index("--warmup") + 1] = "20"
    code = main.main(["train", "--data", str(corpus), "--out", str(run), *flags, "--steps", "40",
                      "--checkpoint-every", "1", "--eval-every", "1", "--grad-clip", "0"])
    out = capsys.readouterr().out
    assert code == 1 and "TRAINING STOPPED: loss" in out and "over 3 x the lowest" in out, out[-2000:]
    ck = run / "checkpoints"
    scores = {p.name: json.loads((p / "state.json").read_text())["extra"]["score"] for p in list_checkpoints(ck)}
    best = min(scores, key=scores.get)
    assert best != max(scores) and scores[max(scores)] > scores[best]  # the newest one is worse
    assert latest_checkpoint(ck).name == (ck / "best").read_text().strip() == best
    assert f"latest now names {best}" in out
    # what a resume continues from is that checkpoint: resuming with a sane lr works
    assert main.main(["train", "--resume", str(run), "--max-lr", "1e-2", "--steps", "6", "--no-progress",
                      "--no-export"]) == 0


def _mount_tmpfs(path: Path, size_kb: int) -> bool:
    if os.geteuid() != 0 or not shutil.which("mount"):
        return False
    path.mkdir()
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_kb}k", "tmpfs", str(path)],
                          capture_output=True).returncode == 0


def test_disk_full_on_a_real_small_tmpfs(trained, tmp_path, capsys):
    """A real ENOSPC: the run on a tmpfs with room for it and ~100 kB more (skipped where
    mounting is not allowed)."""
    used = sum(p.stat().st_size for p in trained.rglob("*") if p.is_file()) // 1024
    mnt = tmp_path / "small"
    if not _mount_tmpfs(mnt, used + 100):
        pytest.skip("cannot mount a tmpfs here (needs root)")
    try:
        run = mnt / "run"
        shutil.copytree(trained, run)
        line = fails(capsys, ["train", "--resume", run, "--steps", "8", "--no-progress", "--no-export"], 1)
        assert "no space left on device" in line
        ck = run / "checkpoints"
        assert latest_checkpoint(ck).name == "step_00000006"
        assert not [p for p in ck.iterdir() if p.name.startswith(".tmp")]
        ckpt_mod.verify_checkpoint(ck / "step_00000006")
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)
