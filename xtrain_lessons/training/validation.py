"""Validation loss and text samples during a run.

    from xtrain_lessons.training.validation import evaluate, sample_text
    val = evaluate(model, val_dataset, batch_size=16, seq_len=128, n_batches=8)
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.autograd.tensor import no_grad
from xtrain_lessons.model.generate import generate
from xtrain_lessons.training.tokenizer import eot_id

__all__ = ["evaluate", "sample_text"]


def evaluate(model, dataset, batch_size: int, seq_len: int, n_batches: int, seed: int = 0) -> float:
    """Mean loss over the first ``n_batches`` batches of non-overlapping windows of ``dataset``
    (the same tokens every time, so successive evaluations are comparable). Datasets without
    ``iter_batches`` are sampled with a fresh ``Generator(seed)`` instead."""
    if hasattr(dataset, "iter_batches"):
        batches = dataset.iter_batches(batch_size, seq_len, max_batches=n_batches)
    else:
        rng = np.random.default_rng(seed)
        batches = (dataset.get_batch(batch_size, seq_len, rng) for _ in range(n_batches))
    total, count = 0.0, 0
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()  # dropout (T18) is the identity while evaluating
    try:
        with no_grad():
            for x, y in batches:
                n = x.shape[0] * x.shape[1]
                total += float(model.loss(x, y).item()) * n
                count += n
    finally:
        if hasattr(model, "train"):
            model.train(was_training)
    if count == 0:
        raise ValueError("evaluate: the validation split is empty")
    return total / count


def sample_text(model, tok, prompt: str, n_tokens: int, temperature: float, top_k, seed: int) -> str:
    """`prompt` and its continuation by `model` (stops at end-of-text)."""
    ids = tok.encode(prompt).ids
    if not ids:
        ids = [eot_id(tok)]
    new = generate(model, ids, max_new_tokens=n_tokens, temperature=temperature, top_k=top_k,
                   eos_id=eot_id(tok), seed=seed)
    return prompt + tok.decode(new)
