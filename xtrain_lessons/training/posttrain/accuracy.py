"""Held-out accuracy (T20, T21): the model's greedy answers to questions it never trained on,
graded by the answer parser.

    acc, texts = heldout_accuracy(model, encode, decode, [(prompt, answer), ...], eos_id)

Greedy decoding (temperature 0) makes the measurement deterministic; the prompts are decoded
in batches of equal token length (`rollouts.sample_batch`), so a few hundred questions take a
few batched decodes, not a few hundred.
"""

from __future__ import annotations

from collections import defaultdict

from xtrain_lessons.training.posttrain.answers import is_correct
from xtrain_lessons.training.posttrain.rollouts import sample_batch

__all__ = ["greedy_completions", "heldout_accuracy"]


def greedy_completions(model, prompts_ids: list, max_new_tokens: int, eos_id: int | None) -> list:
    """The greedy completion (ids, eos included) of each prompt, in the given order."""
    by_length = defaultdict(list)
    for i, p in enumerate(prompts_ids):
        by_length[len(p)].append(i)
    out = [None] * len(prompts_ids)
    was_training = model.training
    model.eval()
    try:
        for idx in by_length.values():
            done = sample_batch(model, [prompts_ids[i] for i in idx], max_new_tokens, 0.0, None, eos_id)
            for i, (ids, _) in zip(idx, done):
                out[i] = ids
    finally:
        model.train(was_training)
    return out


def heldout_accuracy(model, encode, decode, problems, eos_id: int | None,
                     max_new_tokens: int = 24) -> tuple[float, list[str]]:
    """(fraction answered right, the completions' texts) of `problems`, a list of
    (prompt text, answer). `encode(text) -> ids`, `decode(ids) -> text`."""
    if not problems:
        raise ValueError("heldout_accuracy: no problems")
    completions = greedy_completions(model, [encode(p) for p, _ in problems], max_new_tokens, eos_id)
    texts = [decode(ids) for ids in completions]
    right = sum(is_correct(t, a) for t, (_, a) in zip(texts, problems))
    return right / len(problems), texts
