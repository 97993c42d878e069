"""A generated arithmetic task with a right answer (T20, T21): word problems, a train and a
held-out split, and a pretraining text.

Every problem is one of two templates, with a name, a kind of thing and two small numbers:

    Mia has 4 cars and gets 5 more. How many cars does Mia have now?      (4 + 5 = 9)
    Tom has 5 balls and gives 3 away. How many balls does Tom have left?  (5 - 3 = 2)

a and b in 1..5 (b <= a when subtracting): 40 sums, 8 names x 8 things, 2,560 questions.
`make_task` shuffles them with a seed and sets `n_heldout` aside: no held-out question is ever
trained on (the sums themselves recur: the task tests reading a new sentence, not new
arithmetic). The supervised response works the sum out, then answers in the tag the grader
reads (answers.py) — written out, the sum is far easier for a small model than the answer alone:

    prompt   "Mia has 4 cars and gets 5 more. How many cars does Mia have now?\\n"
    response "4 + 5 = 9. <answer>9</answer>"

`pretraining_text` tells the train split's problems as plain sentences, with the result in
words and no tag: what a base model may have read before anyone fine-tuned it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Problem", "all_problems", "make_task", "pretraining_text", "answer_table"]

MAX = 5  # the largest operand: small, so that a small model learns the task in seconds
NAMES = ["Tom", "Lily", "Sam", "Mia", "Ben", "Sue", "Max", "Ann"]
THINGS = ["apple", "cookie", "ball", "car", "star", "book", "cat", "hat"]


def _count(n: int, thing: str) -> str:
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


@dataclass(frozen=True)
class Problem:
    """One word problem: `name` has `a` `thing`s and gets (op "+") or gives away (op "-") `b`."""
    name: str
    thing: str
    a: int
    op: str
    b: int

    @property
    def answer(self) -> int:
        return self.a + self.b if self.op == "+" else self.a - self.b

    @property
    def question(self) -> str:
        if self.op == "+":
            return (f"{self.name} has {_count(self.a, self.thing)} and gets {self.b} more. "
                    f"How many {self.thing}s does {self.name} have now?")
        return (f"{self.name} has {_count(self.a, self.thing)} and gives {self.b} away. "
                f"How many {self.thing}s does {self.name} have left?")

    @property
    def prompt(self) -> str:
        return self.question + "\n"

    @property
    def response(self) -> str:
        return f"{self.a} {self.op} {self.b} = {self.answer}. <answer>{self.answer}</answer>"

    @property
    def sentence(self) -> str:
        """The problem told as plain text, result included (the pretraining form)."""
        return f"{self.question} {self.name} has {_count(self.answer, self.thing)}."


def all_problems() -> list[Problem]:
    """Every problem of the two templates, in a fixed order."""
    out = []
    for name in NAMES:
        for thing in THINGS:
            for a in range(1, MAX + 1):
                for b in range(1, MAX + 1):
                    out.append(Problem(name, thing, a, "+", b))
                    if b <= a:
                        out.append(Problem(name, thing, a, "-", b))
    return out


def make_task(seed: int = 0, n_heldout: int = 200) -> tuple[list[Problem], list[Problem]]:
    """(train, heldout): all problems shuffled by `seed`, the first `n_heldout` held out."""
    problems = all_problems()
    if not 0 < n_heldout < len(problems):
        raise ValueError(f"make_task: n_heldout must be in 1..{len(problems) - 1}, got {n_heldout}")
    order = np.random.default_rng(seed).permutation(len(problems))
    shuffled = [problems[i] for i in order]
    return shuffled[n_heldout:], shuffled[:n_heldout]


def pretraining_text(problems: list[Problem], n_docs: int, seed: int = 0) -> str:
    """`n_docs` documents of three problems told as sentences (drawn with replacement from
    `problems`), separated by end-of-text lines: a corpus for `xtrain train`."""
    rng = np.random.default_rng(seed)
    docs = [" ".join(problems[i].sentence for i in rng.integers(0, len(problems), 3)) for _ in range(n_docs)]
    return "\n<|endoftext|>\n".join(docs) + "\n"


def answer_table(seed: int = 0, n_heldout: int = 200) -> dict[str, int]:
    """{prompt: answer} of every problem of the task (both splits): the arith reward's key."""
    train, heldout = make_task(seed, n_heldout)
    return {p.prompt: p.answer for p in train + heldout}
