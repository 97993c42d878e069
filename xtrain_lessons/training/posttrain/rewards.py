"""Reward functions for GRPO (T21), chosen by a SPEC string.

    word:dog            1 if the completion mentions the word (case-insensitive, whole word)
    eos:40              1 if the completion ended with end-of-text within 40 tokens
    length:20-40        1 if the completion is 20 to 40 tokens long (end-of-text included)
    arith               1 if the completion's answer (answers.parse_answer) is the prompt's
                        right answer (from the task's table, arith.answer_table, or the
                        "answer" fields of a prompts file) AND every equation it writes holds
                        (answers.working_holds): a right answer after false working earns 0
    format              1 if the completion ends with one <answer>N</answer> (answers.py)
    arith+format        the sum of several rewards
    path/to/file.py:fn  your own function fn(prompt: str, completion: str) -> float

Every reward is called as reward(prompt, completion, n_tokens) -> float, where `completion`
is the decoded text of the new tokens (ending with "<|endoftext|>" when the model stopped
there) and n_tokens their number. A user function gets (prompt, completion) only. A reward
that raises, or returns something that is not a finite number, stops the run with a
`RewardError` naming it.
"""

from __future__ import annotations

import importlib.util
import math
import numbers
import re
from pathlib import Path

from xtrain_lessons.training.posttrain.answers import EOT, follows_format, is_correct, working_holds
from xtrain_lessons.training.posttrain.arith import answer_table

__all__ = ["RewardError", "Reward", "load_reward", "EOT"]


class RewardError(ValueError):
    """A reward SPEC that cannot be loaded, or a reward function that misbehaved."""


class Reward:
    """A named reward: `reward(prompt, completion, n_tokens)` returns a checked float."""

    def __init__(self, name: str, fn, takes_n_tokens: bool):
        self.name, self.fn, self.takes_n_tokens = name, fn, takes_n_tokens

    def __call__(self, prompt: str, completion: str, n_tokens: int) -> float:
        try:
            value = self.fn(prompt, completion, n_tokens) if self.takes_n_tokens else self.fn(prompt, completion)
        except RewardError:  # a part of a sum: it names itself
            raise
        except Exception as e:  # noqa: BLE001 - the user's code: report it, with its name
            raise RewardError(f"reward {self.name} raised {type(e).__name__}: {e} "
                              f"(on the completion {completion[:60]!r})") from e
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise RewardError(f"reward {self.name} returned {value!r} ({type(value).__name__}), "
                              f"not a finite number (on the completion {completion[:60]!r})")
        return float(value)

    def __repr__(self):
        return f"Reward({self.name})"


def _word(arg: str, answers=None):
    if not arg or not re.fullmatch(r"[\w' -]+", arg):
        raise RewardError(f"reward word:{arg}: give a word, e.g. word:dog")
    pattern = re.compile(rf"\b{re.escape(arg)}\b", re.IGNORECASE)
    return lambda prompt, completion, n: 1.0 if pattern.search(completion.replace(EOT, " ")) else 0.0


def _eos(arg: str, answers=None):
    limit = _int(arg, "eos", "eos:40")
    return lambda prompt, completion, n: 1.0 if completion.endswith(EOT) and n <= limit else 0.0


def _length(arg: str, answers=None):
    m = re.fullmatch(r"(\d+)-(\d+)", arg)
    if not m or int(m.group(1)) > int(m.group(2)):
        raise RewardError(f"reward length:{arg}: give a token range LO-HI, e.g. length:20-40")
    lo, hi = int(m.group(1)), int(m.group(2))
    return lambda prompt, completion, n: 1.0 if lo <= n <= hi else 0.0


def _int(arg: str, kind: str, example: str) -> int:
    if not arg.isdigit() or int(arg) < 1:
        raise RewardError(f"reward {kind}:{arg}: give a positive number of tokens, e.g. {example}")
    return int(arg)


def _arith(arg: str, answers=None):
    if arg:
        raise RewardError(f"reward arith:{arg}: arith takes no argument (write arith)")
    table = answer_table() if answers is None else answers

    def reward(prompt, completion, n):
        if prompt not in table:
            raise RewardError(f"reward arith: no answer known for the prompt {prompt[:60]!r}: use the "
                              f"task's prompts, or a prompts file (.jsonl) with an \"answer\" for each")
        return 1.0 if is_correct(completion, table[prompt]) and working_holds(completion) else 0.0
    return reward


def _format(arg: str, answers=None):
    if arg:
        raise RewardError(f"reward format:{arg}: format takes no argument (write format)")
    return lambda prompt, completion, n: 1.0 if follows_format(completion) else 0.0


BUILTINS = {"word": _word, "eos": _eos, "length": _length, "arith": _arith, "format": _format}


def _user_function(spec: str) -> Reward:
    path, _, name = spec.rpartition(":")
    file = Path(path)
    if not file.is_file():
        raise RewardError(f"reward {spec}: no such file {path}")
    module_spec = importlib.util.spec_from_file_location(f"xtrain_reward_{file.stem}", file)
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001
        raise RewardError(f"reward {spec}: importing {path} failed: {type(e).__name__}: {e}") from e
    fn = getattr(module, name, None)
    if not callable(fn):
        found = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise RewardError(f"reward {spec}: {path} has no function {name!r} (functions there: {found})")
    return Reward(spec, fn, takes_n_tokens=False)


def _one(spec: str, answers) -> Reward:
    if ".py:" in spec:
        return _user_function(spec)
    kind, _, arg = spec.partition(":")
    if kind not in BUILTINS:
        raise RewardError(f"unknown reward {spec!r}: use word:WORD, eos:N, length:LO-HI, arith, "
                          f"format or path/to/file.py:function")
    return Reward(spec, BUILTINS[kind](arg, answers), takes_n_tokens=True)


def load_reward(spec: str, answers: dict | None = None) -> Reward:
    """The Reward a SPEC names (module docstring); several joined by '+' are summed.
    `answers` ({prompt: number}) is what `arith` grades against (default: the task's table)."""
    parts = [p.strip() for p in str(spec).split("+")]
    if not all(parts):
        raise RewardError(f"reward {spec!r}: empty part (write e.g. word:dog+eos:40)")
    rewards = [_one(p, answers) for p in parts]
    if len(rewards) == 1:
        return rewards[0]
    return Reward(spec, lambda prompt, completion, n: sum(r(prompt, completion, n) for r in rewards),
                  takes_n_tokens=True)
