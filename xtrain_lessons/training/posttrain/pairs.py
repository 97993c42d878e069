"""JSONL files of prompt / response pairs (`xtrain sft --data`, `xtrain grpo --prompts`).

One JSON object per line:

    {"prompt": "Mia has 7 cars and gets 5 more. How many cars does Mia have now?\\n",
     "response": "7 + 5 = 12. <answer>12</answer>", "answer": 12}

`response` is what supervised fine-tuning trains on; `answer` (a number, optional) is what a
grader compares with. Blank lines are skipped. A line that is not a JSON object with a string
`prompt` (and, where required, a string `response`) is a `PairsError` naming the file and the
line.
"""

from __future__ import annotations

import json
import math
import numbers
from pathlib import Path

from xtrain_lessons.training.tokenizer import atomic_write_bytes

__all__ = ["PairsError", "read_pairs", "write_pairs"]


class PairsError(ValueError):
    """A pairs file that is missing or holds a line that cannot be used."""


def _row(obj, where: str, need_response: bool) -> dict:
    if not isinstance(obj, dict):
        raise PairsError(f"{where}: expected a JSON object like {{\"prompt\": ..., \"response\": ...}}, "
                         f"got {type(obj).__name__}")
    if not isinstance(obj.get("prompt"), str) or not obj["prompt"]:
        raise PairsError(f"{where}: no \"prompt\" string")
    if need_response and not isinstance(obj.get("response"), str):
        raise PairsError(f"{where}: no \"response\" string")
    if "response" in obj and not isinstance(obj["response"], str):
        raise PairsError(f"{where}: \"response\" must be a string")
    ans = obj.get("answer")
    if ans is not None and (isinstance(ans, bool) or not isinstance(ans, numbers.Real) or not math.isfinite(ans)):
        raise PairsError(f"{where}: \"answer\" must be a finite number, got {ans!r}")
    return {k: obj[k] for k in ("prompt", "response", "answer") if obj.get(k) is not None}


def read_pairs(path, need_response: bool = True) -> list[dict]:
    """The rows of a JSONL pairs file: dicts with "prompt", "response" and maybe "answer"."""
    p = Path(path)
    if not p.is_file():
        raise PairsError(f"pairs file not found: {path}")
    rows = []
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as e:
        raise PairsError(f"{path} is not UTF-8 text ({e.reason} at byte {e.start})") from None
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}, line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise PairsError(f"{where}: not valid JSON ({e.msg} at column {e.colno})") from None
        rows.append(_row(obj, where, need_response))
    if not rows:
        raise PairsError(f"{path} holds no pair (one JSON object per line)")
    return rows


def write_pairs(path, rows) -> None:
    """Write rows (dicts) as JSONL, atomically."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    atomic_write_bytes(Path(path), text.encode("utf-8"))
