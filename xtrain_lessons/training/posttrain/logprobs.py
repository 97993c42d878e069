"""Per-token log-probabilities and entropy of a batch (T20, T21).

    logp = token_logprobs(logits, labels)            # Tensor (B, T): log softmax(logits)[label]
    H = token_entropy(logits)                        # array (B, T): entropy of each next-token
                                                     #   distribution, in nats
    logp, H = response_logprobs(model, input_ids, labels, with_entropy=True)   # one forward

The log-probabilities carry the graph (every loss of post-training is built from them); the
entropy is a measurement (how sure the policy is at each position: it falls as SFT and RL
sharpen the model, and a collapse to 0 means nothing is explored any more), so it is an array.
Both are computed from logits shifted by their row maximum: no overflow at any scale.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.autograd.tensor import Tensor, make_node
from xtrain_lessons.runtime.device import array_module, to_host

__all__ = ["token_logprobs", "token_entropy", "response_logprobs", "sequence_logprobs", "host"]


def host(a) -> np.ndarray:
    """A NumPy array of `a` (a CuPy array is copied to the host)."""
    return to_host(a)


def _float(x):
    """bf16 / fp16 logits widened to float32: log-probabilities are taken in float32 at least."""
    return x if x.dtype in (np.float32, np.float64) else x.astype(np.float32)


def token_logprobs(logits, targets) -> Tensor:
    """log softmax(logits)[target] at every position, one node: (B, T, V), (B, T) -> (B, T).

    Backward: d logp / d logits = onehot(target) - softmax(logits)."""
    logits = logits if isinstance(logits, Tensor) else Tensor(logits)
    xp = array_module(logits.data)
    x = _float(logits.data)
    t = xp.asarray(targets)
    m = x.max(axis=-1, keepdims=True)
    e = xp.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    picked = xp.take_along_axis(x, t[..., None], axis=-1)
    lp = (picked - m - xp.log(s))[..., 0]

    def backward(g):
        gx = -(e / s) * g[..., None]
        idx = t[..., None]
        xp.put_along_axis(gx, idx, xp.take_along_axis(gx, idx, axis=-1) + g[..., None], axis=-1)
        return (gx.astype(logits.dtype, copy=False),)

    return make_node(lp, (logits,), backward, "token_logprobs")


def token_entropy(logits):
    """H = -sum_v p_v log p_v of softmax(logits) over the last axis: (..., V) -> (...).

    With z = x - max(x): log p = z - log sum e^z, so H = log sum e^z - sum_v p_v z_v (no
    log of a probability that underflowed to 0)."""
    x = logits.data if isinstance(logits, Tensor) else logits
    xp = array_module(x)
    z = _float(xp.asarray(x))
    z = z - z.max(axis=-1, keepdims=True)
    e = xp.exp(z)
    s = e.sum(axis=-1, keepdims=True)
    return (xp.log(s) - (e * z).sum(axis=-1, keepdims=True) / s)[..., 0]


def response_logprobs(model, input_ids, labels, with_entropy: bool = False):
    """(log-probabilities Tensor (B, T), entropy array (B, T) or None) of `labels` under
    `model`, from one forward (with a graph unless called under no_grad)."""
    logits = model(input_ids)
    return token_logprobs(logits, labels), (token_entropy(logits.data) if with_entropy else None)


def sequence_logprobs(model, ids, targets) -> Tensor:
    """Token log-probs (B, T) of `targets` under `model`, one batched forward."""
    return token_logprobs(model(ids), targets)
