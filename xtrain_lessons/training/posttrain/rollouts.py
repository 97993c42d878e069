"""Rollouts (T21): completions sampled from the policy, and the batch that scores them.

    sample_batch(model, prompts, max_new_tokens, temperature, ...)   prompts of one length,
        decoded together with a (B, T) KV cache (temperature 0: greedy)
    sample_group(model, prompt, G, ...)                              G completions of one prompt
    rollout_batch(rollouts)                                          the right-padded batch of
        prompt + completion with its completion mask (batch.prompt_response_batch)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xtrain_lessons.model.generate import sample_next
from xtrain_lessons.training.posttrain.batch import prompt_response_batch
from xtrain_lessons.training.posttrain.logprobs import host

__all__ = ["Rollout", "sample_rows", "sample_batch", "sample_group", "rollout_batch"]


@dataclass
class Rollout:
    """One sampled completion: `ids` (ending with eos_id when `ended`), its prompt's index."""
    prompt_index: int
    prompt_ids: list
    ids: list
    ended: bool


def sample_rows(logits, temperature: float = 1.0, top_p: float | None = None,
                rng: np.random.Generator | None = None) -> np.ndarray:
    """One token id per row of `logits` (B, V): argmax at temperature 0, else a draw from
    softmax(logits / temperature) with one uniform number per row (the rows at once; top-p
    filters row by row with `sample_next`)."""
    if temperature == 0:
        return np.asarray(logits).argmax(axis=-1).astype(np.int64)
    rng = np.random.default_rng() if rng is None else rng
    if top_p is not None and top_p < 1:
        return np.array([sample_next(row, temperature, None, top_p, rng) for row in logits], dtype=np.int64)
    z = np.asarray(logits, dtype=np.float64) / temperature
    cdf = np.cumsum(np.exp(z - z.max(axis=-1, keepdims=True)), axis=-1)
    u = rng.random(cdf.shape[0])[:, None] * cdf[:, -1:]
    return np.minimum((cdf <= u).sum(axis=-1), cdf.shape[1] - 1).astype(np.int64)


def sample_batch(model, prompts, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float | None = None, eos_id: int | None = None,
                 rng: np.random.Generator | None = None) -> list:
    """Completions of prompts of ONE length, decoded together: the prompts are prefilled once
    into a (B, T) KV cache and each step runs the rows' next tokens as one (B, 1) batch.
    temperature 0 is greedy.

    Returns a list of (ids, ended): ids includes eos_id when the completion stopped there.
    The prompts are cropped from the left so that prompt + completion fit max_seq_len.
    """
    rng = np.random.default_rng() if rng is None else rng
    L = model.config.max_seq_len
    if max_new_tokens >= L:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in "
                         f"max_seq_len={L}")
    rows = [[int(t) for t in p][-(L - max_new_tokens):] for p in prompts]
    if not rows or len({len(r) for r in rows}) != 1 or not rows[0]:
        raise ValueError("sample_batch: the prompts must be non-empty and of one length")
    x = np.asarray(rows, dtype=np.int64)
    n = x.shape[0]
    cache = model.new_cache(batch=n)
    logits = host(model.forward_cached(x, cache, 0)[:, -1])  # (B, V)
    out = [[] for _ in range(n)]
    done = np.zeros(n, dtype=bool)
    for step in range(max_new_tokens):
        nxt = sample_rows(logits, temperature, top_p, rng)
        for g in np.flatnonzero(~done):
            out[g].append(int(nxt[g]))
        done |= (nxt == eos_id) if eos_id is not None else False
        if done.all() or step == max_new_tokens - 1:
            break
        # finished rows keep running (their tokens are ignored): one batch shape throughout
        logits = host(model.forward_cached(nxt[:, None], cache, cache.pos)[:, -1])
    return [(ids, eos_id is not None and bool(ids) and ids[-1] == eos_id) for ids in out]


def sample_group(model, prompt_ids, group: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float | None = None, eos_id: int | None = None,
                 rng: np.random.Generator | None = None) -> list:
    """`group` completions of one prompt, decoded together (`sample_batch`)."""
    if not len(prompt_ids):
        raise ValueError("sample_group: the prompt must hold at least one token")
    return sample_batch(model, [list(prompt_ids)] * group, max_new_tokens, temperature, top_p, eos_id, rng)


def rollout_batch(rollouts, pad_id: int = 0):
    """(ids (B, T), targets (B, T), mask (B, T) float32) of prompt + completion sequences
    (`batch.prompt_response_batch`): mask is 1 where the target is a completion token."""
    return prompt_response_batch([r.prompt_ids for r in rollouts], [r.ids for r in rollouts],
                                 pad_id=pad_id)
