"""Held-out accuracy (T20, T21): the model's answers to questions it never trained on.

    acc, texts = heldout_accuracy(model, encode, decode, [(prompt, answer), ...], eos_id)
    p = reference_probability(model, [(prompt ids, response ids), ...])

`heldout_accuracy` grades the greedy completions with the answer parser. `reference_probability`
is the mean probability that a completion sampled at temperature 1 is exactly the reference
response — pi(response | prompt), the product of its tokens' probabilities, from one batched
forward (teacher forcing). For a task whose only right completion is the reference it is the
expected accuracy of a sample (a lower bound when other completions would also be graded right),
measured without sampling noise: what GRPO's expected reward moves, seen step by step.

Greedy decoding (temperature 0) makes the measurement deterministic; the prompts are decoded
in batches of equal token length (`rollouts.sample_batch`), so a few hundred questions take a
few batched decodes, not a few hundred.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from xtrain_lessons.autograd.tensor import no_grad
from xtrain_lessons.training.posttrain.answers import is_correct
from xtrain_lessons.training.posttrain.batch import prompt_response_batch
from xtrain_lessons.training.posttrain.logprobs import sequence_logprobs
from xtrain_lessons.training.posttrain.rollouts import sample_batch

__all__ = ["greedy_completions", "heldout_accuracy", "reference_probability"]


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


def reference_probability(model, pairs, batch: int = 256) -> float:
    """Mean over `pairs` (prompt ids, response ids) of pi(response | prompt) under `model`
    (temperature 1, no graph)."""
    if not pairs:
        raise ValueError("reference_probability: no pairs")
    was_training = model.training
    model.eval()
    probs = []
    try:
        with no_grad():
            for i in range(0, len(pairs), batch):
                chunk = pairs[i:i + batch]
                ids, labels, mask = prompt_response_batch([p for p, _ in chunk], [r for _, r in chunk])
                lp = np.asarray(sequence_logprobs(model, ids, labels).numpy(), dtype=np.float64)
                probs.append(np.exp((lp * mask).sum(axis=1)))
    finally:
        model.train(was_training)
    return float(np.concatenate(probs).mean())
