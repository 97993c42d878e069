"""Decoding: turn next-token logits into text, one token at a time (phase T06).

    generate(model, prompt_ids, max_new_tokens=100, temperature=1.0, top_k=None,
             top_p=None, eos_id=None, seed=0, use_cache=True) -> list[int]

One step: logits of the last position -> `sample_next` (greedy argmax when temperature is
0, else softmax(logits / temperature) restricted by top-k and/or top-p, sampled with a
seeded NumPy generator) -> append -> repeat.

KV cache (use_cache=True): the prompt is run once ("prefill") and every later step runs
only the new token, reading the keys and values of the earlier positions from a `KVCache`
(`Model.forward_cached`). Same logits as recomputing the whole prefix, far less work.

Context longer than max_seq_len: the model only ever sees the LAST max_seq_len tokens
(the prompt is cropped from the left). RoPE positions are absolute, so a sliding window
cannot reuse cached keys: once the context is full, each step re-runs the cropped window
(with or without the cache the result is the same).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.autograd.tensor import no_grad
from xtrain_lessons.runtime.device import to_host

__all__ = ["generate", "sample_next", "softmax", "top_k_filter", "top_p_filter"]


def softmax(logits):
    """Probabilities from a 1-D logits row (float64, max subtracted; -inf -> 0)."""
    z = np.asarray(logits, dtype=np.float64)
    z = np.exp(z - z.max())
    return z / z.sum()


def top_k_filter(logits, k: int):
    """Keep the k largest logits, set the rest to -inf (ties with the k-th value are kept)."""
    logits = np.asarray(logits, dtype=np.float64)
    if k is None or k >= logits.size:
        return logits.copy()
    if k < 1:
        raise ValueError(f"top_k must be >= 1, got {k}")
    kth = np.partition(logits, -k)[-k]
    return np.where(logits >= kth, logits, -np.inf)


def top_p_filter(logits, p: float):
    """Nucleus filter: keep the most probable tokens whose total probability first reaches
    p (at least one token); the rest -> -inf."""
    logits = np.asarray(logits, dtype=np.float64)
    if p is None or p >= 1.0:
        return logits.copy()
    if not 0.0 < p:
        raise ValueError(f"top_p must be in (0, 1], got {p}")
    order = np.argsort(-logits, kind="stable")  # most probable first
    probs = softmax(logits)[order]
    before = np.cumsum(probs) - probs  # probability mass strictly before each token
    drop = order[before >= p]  # the set already reached p without them
    out = logits.copy()
    out[drop] = -np.inf
    return out


def sample_next(logits_row, temperature: float = 1.0, top_k: int | None = None,
                top_p: float | None = None, rng: np.random.Generator | None = None) -> int:
    """Choose the next token id from one row of logits (V,).

    temperature == 0: argmax (greedy; top_k/top_p irrelevant). Otherwise the logits are
    divided by temperature, filtered by top_k then top_p, and one token is drawn from the
    softmax with `rng` (one uniform number per call, so a seed fixes the whole sequence).
    """
    logits = np.asarray(logits_row, dtype=np.float64).reshape(-1)
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if temperature == 0:
        return int(np.argmax(logits))
    if rng is None:
        rng = np.random.default_rng()
    z = top_p_filter(top_k_filter(logits / temperature, top_k), top_p)
    cdf = np.cumsum(softmax(z))
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), z.size - 1))


def generate(model, prompt_ids, max_new_tokens: int = 100, temperature: float = 1.0,
             top_k: int | None = None, top_p: float | None = None, eos_id: int | None = None,
             seed: int = 0, use_cache: bool = True) -> list[int]:
    """Continue `prompt_ids` (a non-empty list of ints) by up to `max_new_tokens` tokens.

    Returns only the new tokens. Stops early after producing `eos_id` (which is NOT
    included in the result). The model sees at most the last `max_seq_len` tokens.
    """
    tokens = [int(t) for t in prompt_ids]
    if not tokens:
        raise ValueError("generate: the prompt must hold at least one token (e.g. a BOS id)")
    L = model.config.max_seq_len
    rng = np.random.default_rng(seed)
    new: list[int] = []
    cache = None

    def window_logits():  # the last row of a forward over the cropped context
        nonlocal cache
        window = np.asarray([tokens[-L:]], dtype=np.int64)  # (1, T)
        if use_cache:
            cache = model.new_cache(batch=1)
            return to_host(model.forward_cached(window, cache, 0)[0, -1])
        with no_grad():
            return model(window).numpy()[0, -1]

    if max_new_tokens <= 0:
        return new
    logits = window_logits()
    while True:
        tok = sample_next(logits, temperature, top_k, top_p, rng)
        if eos_id is not None and tok == eos_id:
            break
        tokens.append(tok)
        new.append(tok)
        if len(new) >= max_new_tokens:
            break
        if use_cache and cache.pos < L:  # one new position: only the new token is run
            step = np.asarray([[tok]], dtype=np.int64)  # (1, 1)
            logits = to_host(model.forward_cached(step, cache, cache.pos)[0, -1])
        else:  # no cache, or the window is full and slides: recompute it
            logits = window_logits()
    return new
