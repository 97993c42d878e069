"""Reading a model's answer, and whether it kept the format (T20, T21).

A task with a right answer needs a grader that reads the answer out of free text. The parser
tries, in order: the last `<answer>N</answer>` tag (the format the course's SFT data teaches,
as DeepSeek-R1-Zero's prompt asks), the last `\\boxed{N}` (the MATH convention), the last number
in the text. A format check says whether the completion ends with exactly one answer tag
(then nothing but the end-of-text token): what a format reward pays for. And the working: every
equation "x + y = z" (or "-", "*") written in the completion must hold — a reward that reads only
the tag lets RL write any working before it (T21 shows it).

    parse_answer("3 + 4 = 7. <answer>7</answer>")      # 7.0
    parse_answer("so \\boxed{12}")                     # 12.0
    parse_answer("I think 5, no, 6")                  # 6.0
    parse_answer("no idea")                           # None
    follows_format("3 + 4 = 7. <answer>7</answer>")   # True
    working_holds("3 + 4 = 8. <answer>7</answer>")    # False
"""

from __future__ import annotations

import math
import re

__all__ = ["EOT", "parse_answer", "follows_format", "is_correct", "working_holds"]

EOT = "<|endoftext|>"
_NUM = r"-?\d+(?:\.\d+)?"
_TAG = re.compile(rf"<answer>\s*({_NUM})\s*</answer>")
_BOXED = re.compile(rf"\\boxed\{{\s*({_NUM})\s*\}}")
_NUMBER = re.compile(_NUM)
_EQUATION = re.compile(rf"({_NUM})\s*([-+*])\s*({_NUM})\s*=\s*({_NUM})")
_FORMAT = re.compile(rf"(?s)(?:(?!<answer>).)*<answer>\s*{_NUM}\s*</answer>\s*")


def parse_answer(text: str) -> float | None:
    """The number the text answers: the last answer tag, else the last \\boxed{}, else the
    last number; None when there is none."""
    text = text.replace(EOT, " ")
    for pattern in (_TAG, _BOXED, _NUMBER):
        found = pattern.findall(text)
        if found:
            return float(found[-1])
    return None


def follows_format(text: str) -> bool:
    """True when `text` is free text, then one `<answer>N</answer>`, then at most white space
    and the end-of-text token."""
    if text.endswith(EOT):
        text = text[:-len(EOT)]
    return _FORMAT.fullmatch(text) is not None


def is_correct(text: str, answer: float) -> bool:
    """The parsed answer equals `answer` (to 1e-9)."""
    got = parse_answer(text)
    return got is not None and math.isclose(got, float(answer), rel_tol=0.0, abs_tol=1e-9)


def working_holds(text: str) -> bool:
    """Every "x op y = z" in `text` (op +, - or *) is true (to 1e-9); True when there is none."""
    for x, op, y, z in _EQUATION.findall(text.replace(EOT, " ")):
        x, y, z = float(x), float(y), float(z)
        value = x + y if op == "+" else x - y if op == "-" else x * y
        if not math.isclose(value, z, rel_tol=0.0, abs_tol=1e-9):
            return False
    return True
