"""Loss, perplexity and bits per byte of a trained run on a held-out text file (T19).

    from xtrain_lessons.measure.evaluate import evaluate_run
    r = evaluate_run("runs/mine", "study/eval.txt")   # {"loss", "ppl", "bits_per_byte", ...}

What is scored, exactly:

* The file is read as documents, the way training data is (``data.read_documents``: split at
  ``<|endoftext|>``, each stripped, empty ones dropped).
* The token stream is ``EOT, doc_1, EOT, doc_2, EOT, ..., doc_n, EOT``: each document is
  followed by EOT as in ``data.prepare``, and one EOT in front gives the first document the
  context every document has in training. Every token after that first EOT is predicted
  exactly once, the EOTs included (predicting where a story ends is part of the task).
* The stream is cut into non-overlapping windows of ``seq_len`` predictions: window k feeds
  tokens ``[k*T, k*T + T)`` and scores the next token at each position. The last window is
  shorter when the predictions do not divide evenly, so the whole file is scored. Windows
  ignore document boundaries (a window may hold the end of one story and the start of the
  next, as in training) and carry no context from the window before.
* Bytes: the UTF-8 bytes of the documents plus one byte per document for its end (the
  separator the EOT prediction stands for). The count depends on the file only, never on the
  tokenizer, so bits per byte = total loss in nats / ln 2 / bytes compares runs with
  different tokenizers on the same bytes. Loss and perplexity are per token.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from xtrain_lessons.autograd.tensor import no_grad
from xtrain_lessons.runtime.device import to_host
from xtrain_lessons.training.checkpoint import CheckpointError
from xtrain_lessons.training.data import read_documents
from xtrain_lessons.training.rundir import load_run
from xtrain_lessons.training.tokenizer import eot_id

__all__ = ["EvalError", "eval_tokens", "count_bytes", "evaluate_model", "evaluate_run"]


class EvalError(ValueError):
    """Bad input for an evaluation (missing run, empty file, file shorter than a window)."""


def _documents(path: Path) -> list[str]:

    if not path.is_file():
        raise EvalError(f"evaluation text not found: {path}")
    if path.stat().st_size == 0:
        raise EvalError(f"{path} is empty: give a held-out text file with at least one document")
    try:
        docs, _ = read_documents(path)
    except ValueError as e:  # only EOT lines and whitespace, or not UTF-8
        raise EvalError(str(e)) from None
    return docs


def count_bytes(docs: list[str]) -> int:
    """The bytes bits/byte divides by: the documents' UTF-8 bytes + 1 per document end."""
    return sum(len(d.encode("utf-8")) for d in docs) + len(docs)


def eval_tokens(tok, docs: list[str]) -> np.ndarray:
    """The scored stream: EOT, then every document followed by EOT (int64)."""
    eot = eot_id(tok)
    parts = [np.array([eot], dtype=np.int64)]
    for enc in tok.encode_batch(docs, add_special_tokens=False):
        parts += [np.asarray(enc.ids, dtype=np.int64), np.array([eot], dtype=np.int64)]
    return np.concatenate(parts)


def _windows(n_tokens: int, seq_len: int) -> list[tuple[int, int]]:
    """(start, length) of the non-overlapping windows covering predictions 1..n_tokens-1."""
    n_pred = n_tokens - 1
    return [(s, min(seq_len, n_pred - s)) for s in range(0, n_pred, seq_len)]


def _nll_sum(model, x: np.ndarray, y: np.ndarray) -> float:
    """Sum over the batch of -log p(y | x), from the logits in float64."""
    with no_grad():
        logits = np.asarray(to_host(model(x).data), dtype=np.float64)  # (B, T, V)
    m = logits.max(axis=-1, keepdims=True)
    logz = m[..., 0] + np.log(np.exp(logits - m).sum(axis=-1))
    picked = np.take_along_axis(logits, y[..., None], axis=-1)[..., 0]
    return float((logz - picked).sum())


def evaluate_model(model, tok, text_path: str | os.PathLike, seq_len: int,
                   batch_size: int = 16, progress: bool = False) -> dict:
    """Score `model` on the whole file (see the module docstring). Returns a dict of numbers."""
    path = Path(text_path)
    docs = _documents(path)
    ids = eval_tokens(tok, docs)
    if seq_len < 1 or seq_len > model.config.max_seq_len:
        raise EvalError(f"seq_len must be in [1, {model.config.max_seq_len}] for this model, got {seq_len}")
    if len(ids) < seq_len + 1:
        raise EvalError(f"{path} gives {len(ids)} tokens (with the leading EOT), fewer than one "
                        f"window of seq_len + 1 = {seq_len + 1}: use a longer file or a shorter --seq-len")
    wins = _windows(len(ids), seq_len)
    full = [s for s, n in wins if n == seq_len]
    total = 0.0
    was_training = model.training
    model.eval()
    try:

        for i in tqdm(range(0, len(full), batch_size), disable=not progress, desc="eval", leave=False):
            idx = np.asarray(full[i:i + batch_size])[:, None] + np.arange(seq_len + 1)
            win = ids[idx]
            total += _nll_sum(model, win[:, :-1], win[:, 1:])
        for s, n in wins[len(full):]:  # the one short window at the end, if any
            win = ids[s:s + n + 1][None]
            total += _nll_sum(model, win[:, :-1], win[:, 1:])
    finally:
        model.train(was_training)
    n_pred, n_bytes = len(ids) - 1, count_bytes(docs)
    loss = total / n_pred
    return {"data": str(path), "seq_len": seq_len, "n_windows": len(wins), "n_documents": len(docs),
            "n_tokens": n_pred, "n_bytes": n_bytes, "loss": loss, "ppl": math.exp(min(loss, 700.0)),
            "bits_per_byte": total / math.log(2) / n_bytes, "bytes_per_token": n_bytes / n_pred}


def evaluate_run(run_dir: str | os.PathLike, text_path: str | os.PathLike, seq_len: int | None = None,
                 batch_size: int = 16, progress: bool = False) -> dict:
    """Score the latest checkpoint of a run directory; seq_len defaults to the run's own."""
    run_dir = Path(run_dir)
    if not (run_dir / "config.json").is_file():
        raise EvalError(f"{run_dir} is not a run directory (no config.json): give a directory "
                        f"written by `xtrain train`")
    try:
        model, tok, ck = load_run(run_dir)
    except (FileNotFoundError, CheckpointError) as e:
        raise EvalError(f"{run_dir}: {e}") from None
    if seq_len is None:
        seq_len = int(json.loads((run_dir / "config.json").read_text(encoding="utf-8"))["train"]["seq_len"])
    out = evaluate_model(model, tok, text_path, seq_len, batch_size, progress)
    return {"run": str(run_dir), "step": ck.step, **out}
