"""The run directory a post-training command writes (`xtrain sft`, `xtrain grpo`).

It has the layout of `xtrain train`'s (training/rundir.py), so `xtrain sample`, `xtrain export`,
`xtrain grpo` and `xtrain sft` accept it:

    OUT/config.json      {"model", "tokenizer_hash", "n_params", "<kind>": settings, "base_run", ...}
        tokenizer.json   the base run's tokenizer
        data/            the base run's prepared data (its validation split), when it has one
        checkpoints/     the post-trained weights (model only)
        metrics.jsonl    one JSON object per step
        samples.txt      completions before and after
        summary.json     the numbers before and after
Every file is written atomically (a reader sees the old file or the new one).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from xtrain_lessons.training.checkpoint import save_checkpoint
from xtrain_lessons.training.rundir import RunDirError, write_json_atomic
from xtrain_lessons.training.tokenizer import atomic_write_bytes, tokenizer_hash

__all__ = ["check_out", "write_run_files", "save_weights", "write_samples", "append_metrics", "decoder"]


def check_out(out: Path) -> None:
    """RunDirError when OUT already holds checkpoints (a run is never overwritten)."""
    if (Path(out) / "checkpoints").exists():
        raise RunDirError(f"{out} already holds checkpoints: choose another --out")


def write_run_files(out: Path, model, tok, base_run, kind: str, settings: dict, **extra) -> None:
    """config.json, tokenizer.json and (a copy of) the base run's data/."""
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(out / "tokenizer.json", tok.to_str(pretty=True).encode("utf-8"))
    conf = {"model": model.config.to_dict(), "tokenizer_hash": tokenizer_hash(tok),
            "n_params": model.n_params(), kind: settings, "base_run": str(base_run), **extra}
    write_json_atomic(out / "config.json", conf)
    src = Path(base_run) / "data"
    if src.is_dir() and not (out / "data").exists():  # the validation split, for evaluating
        tmp = out / ".data.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp)
        tmp.rename(out / "data")


def save_weights(out: Path, model, tok, step: int, extra: dict) -> Path:
    """The post-trained weights as checkpoints/step_<step>/ (model only)."""
    return save_checkpoint(out / "checkpoints", step, model, tokenizer_hash=tokenizer_hash(tok), extra=extra)


def write_samples(path: Path, sections) -> None:
    """sections: [(title, [(prefix, text), ...]), ...] -> one file, atomically."""
    lines = []
    for title, rows in sections:
        lines.append(f"===== {title}")
        lines += [f"[{prefix}] {text}" for prefix, text in rows]
    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))


def append_metrics(path: Path, row: dict) -> None:
    """One JSON line (a line is written whole: a reader never sees half of one)."""
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def decoder(tok, eos: int, eot: str = "<|endoftext|>"):
    """decode(ids) -> text with the end-of-text token written out when the ids end with it."""
    def decode(ids) -> str:
        ended = bool(ids) and ids[-1] == eos
        return tok.decode([i for i in ids if i != eos]) + (eot if ended else "")
    return decode
