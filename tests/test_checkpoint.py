"""Checkpoints: round trip, atomic `latest`, clear errors, and bit-exact resume."""

from __future__ import annotations

import json

import numpy as np
import pytest

from xtrain_lessons.training import checkpoint as ck
from xtrain_lessons.training.checkpoint import (
    CheckpointCorruptError,
    CheckpointMismatchError,
    CheckpointNotFoundError,
    CheckpointVersionError,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.training.optim import AdamW, clip_grad_norm
from xtrain_lessons.training.optim.schedule import lr_at

CFG = PRESETS["test"]


def _train_steps(model, opt, rng, start, stop, total=10):
    """A few real optimizer steps on random tokens drawn from `rng` (the data stream)."""
    for step in range(start, stop):
        ids = rng.integers(0, CFG.vocab_size, size=(3, 9))
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        opt.zero_grad()
        loss.backward()
        clip_grad_norm(model.named_parameters(), 1.0)
        opt.step(lr=lr_at(step, 1e-2, 1e-3, 2, total))


def _fresh(seed=0):
    m = Model(CFG, seed=seed)
    return m, AdamW(m.named_parameters(), lr=1e-2, weight_decay=0.1)


def test_resume_is_bit_exact(tmp_path):
    m1, o1 = _fresh()
    rng1 = np.random.default_rng(123)
    _train_steps(m1, o1, rng1, 0, 10)

    m2, o2 = _fresh()
    rng2 = np.random.default_rng(123)
    _train_steps(m2, o2, rng2, 0, 4)
    save_checkpoint(tmp_path / "ck", 4, m2, o2, rng=rng2, tokenizer_hash="abc",
                    train_config={"steps": 10})
    del m2, o2, rng2

    m3, o3 = _fresh(seed=99)  # a different init: everything must come from the checkpoint
    c = load_checkpoint(tmp_path / "ck", m3, o3, expected_tokenizer_hash="abc")
    assert c.step == 4 and c.train_config == {"steps": 10}
    _train_steps(m3, o3, c.rng(), c.step, 10)
    p1, p3 = m1.named_parameters(), m3.named_parameters()
    for name in p1:
        assert np.array_equal(p1[name].data, p3[name].data), name


def test_round_trip_and_rng(tmp_path):
    m, o = _fresh()
    rng = np.random.default_rng(5)
    _train_steps(m, o, rng, 0, 2)
    path = save_checkpoint(tmp_path, 2, m, o, rng=rng, data_position={"epoch": 0},
                           extra={"note": "x"})
    assert sorted(p.name for p in path.iterdir()) == ["model.safetensors", "optimizer.safetensors",
                                                      "state.json"]
    state = json.loads((path / "state.json").read_text())
    assert state["format_version"] == ck.FORMAT_VERSION and state["step"] == 2
    assert state["model_config"] == CFG.to_dict()
    m2, o2 = _fresh(seed=1)
    c = load_checkpoint(path, m2, o2)
    for k, v in m.state_dict().items():
        assert np.array_equal(v, m2.state_dict()[k])
    a, b = o.state_dict(), o2.state_dict()
    assert a["meta"] == b["meta"]
    assert all(np.array_equal(a["tensors"][k], b["tensors"][k]) for k in a["tensors"])
    assert c.data_position == {"epoch": 0} and c.extra == {"note": "x"}
    assert np.array_equal(c.rng().integers(0, 1 << 30, 8), rng.integers(0, 1 << 30, 8))
    # a run directory resolves through checkpoints/latest
    run = tmp_path / "run"
    save_checkpoint(run / "checkpoints", 7, m, o)
    assert load_checkpoint(run).step == 7


def test_latest_pointer_pruning_and_crash_safety(tmp_path, monkeypatch):
    m, o = _fresh()
    root = tmp_path / "ck"
    for s in (1, 2, 3):
        save_checkpoint(root, s, m, o, keep_last=2)
    assert [p.name for p in list_checkpoints(root)] == ["step_00000002", "step_00000003"]
    assert (root / "latest").read_text().strip() == "step_00000003"

    # a save that dies half-way (after the model file, during the optimizer file)
    import safetensors.numpy as stn

    real = stn.save_file
    calls = {"n": 0}

    def dying_save(tensors, filename, metadata=None):
        calls["n"] += 1
        if calls["n"] == 2:
            with open(filename, "wb") as f:
                f.write(b"\x00" * 10)  # half a file
            raise OSError("disk full (simulated)")
        return real(tensors, filename, metadata=metadata)

    monkeypatch.setattr(stn, "save_file", dying_save)
    with pytest.raises(OSError):
        save_checkpoint(root, 4, m, o)
    monkeypatch.setattr(stn, "save_file", real)
    assert (root / "latest").read_text().strip() == "step_00000003"
    assert not (root / "step_00000004").exists()
    assert load_checkpoint(root, *_fresh()).step == 3

    # a crash that left a temp directory behind: ignored by load, removed by the next save
    junk = root / ".tmp-step_00000005-1-deadbeef"
    junk.mkdir()
    (junk / "model.safetensors").write_bytes(b"partial")
    assert load_checkpoint(root).step == 3
    save_checkpoint(root, 5, m, o)
    assert not junk.exists() and load_checkpoint(root).step == 5


def test_clear_errors(tmp_path):
    m, o = _fresh()
    path = save_checkpoint(tmp_path / "ck", 3, m, o, tokenizer_hash="h1")

    with pytest.raises(CheckpointNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nope")
    with pytest.raises(CheckpointNotFoundError, match="no checkpoint under"):
        load_checkpoint(tmp_path)  # a directory with no checkpoint in it

    other = Model(CFG.replace(dim=16, head_dim=4), seed=0)
    with pytest.raises(CheckpointMismatchError, match="dim"):
        load_checkpoint(path, other)
    with pytest.raises(CheckpointMismatchError, match="tokenizer"):
        load_checkpoint(path, m, expected_tokenizer_hash="h2")

    state = json.loads((path / "state.json").read_text())
    (path / "state.json").write_text(json.dumps({**state, "format_version": 999}))
    with pytest.raises(CheckpointVersionError, match="999"):
        load_checkpoint(path, m)
    (path / "state.json").write_text("{ not json")
    with pytest.raises(CheckpointCorruptError, match="JSON"):
        load_checkpoint(path, m)
    (path / "state.json").write_text(json.dumps(state))

    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointCorruptError, match="truncated"):
        load_checkpoint(path, m)
    flipped = bytearray(data)
    flipped[-5] ^= 0xFF
    (path / "model.safetensors").write_bytes(bytes(flipped))
    with pytest.raises(CheckpointCorruptError, match="SHA-256"):
        load_checkpoint(path, m)
    # without the recorded size/hash, safetensors' own parser still catches truncation
    (path / "model.safetensors").write_bytes(data[: len(data) // 2])
    (path / "state.json").write_text(json.dumps({**state, "files": {}}))
    with pytest.raises(CheckpointCorruptError, match="safetensors"):
        load_checkpoint(path, m)
    (path / "model.safetensors").unlink()
    with pytest.raises(CheckpointNotFoundError, match="model.safetensors is missing"):
        load_checkpoint(path, m)


def test_no_pickle_in_checkpoint(tmp_path):
    m, o = _fresh()
    path = save_checkpoint(tmp_path, 1, m, o, rng=np.random.default_rng(0))
    for f in path.iterdir():
        head = f.read_bytes()[:2]
        assert head != b"\x80\x04" and head != b"\x80\x05"  # pickle protocol markers
