"""Prompt + response batches (T20): ragged pairs -> input ids, labels, and a response mask.

Fine-tuning and RL train on what the model *answers*, never on the prompt it was given. Each
pair becomes the token sequence s = prompt + response; the model reads s[:-1] and predicts
s[1:] (labels shifted by one, as in pretraining); the sequences of a batch are right-padded to
the longest. The response mask is 1 where the label is a response token: positions
len(prompt) - 1 ... len(prompt) + len(response) - 2. The prompt's own tokens and the padding
are 0, so no loss and no gradient ever comes from them.

    input_ids, labels, mask = prompt_response_batch(["2 + 2 ="], [" 4"], encode=tok_encode)

The prompt and the response are encoded separately and joined as ids (the boundary is exactly
where the data puts it, whatever merges a BPE would make across it).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.model.batching import pad_batch

__all__ = ["prompt_response_batch"]


def prompt_response_batch(prompts, responses, encode=None, pad_id: int = 0):
    """(input_ids (B, L-1) int64, labels (B, L-1) int64, response_mask (B, L-1) float32) of
    B pairs, L the longest prompt + response.

    `prompts` and `responses`: lists of strings encoded with `encode(text) -> list of ids`,
    or (without `encode`) lists of token-id lists. A prompt needs at least one token (the
    first response token is predicted from the prompt's last); a response may be empty.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"prompt_response_batch: {len(prompts)} prompts but {len(responses)} responses")
    if encode is not None:
        prompts = [encode(p) for p in prompts]
        responses = [encode(r) for r in responses]
    prompts = [[int(t) for t in p] for p in prompts]
    responses = [[int(t) for t in r] for r in responses]
    for i, p in enumerate(prompts):
        if not p:
            raise ValueError(f"prompt_response_batch: prompt {i} has no token")
    seqs = [p + r for p, r in zip(prompts, responses)]
    if max(len(s) for s in seqs) < 2:
        raise ValueError("prompt_response_batch: every sequence is one token long (nothing to predict)")
    input_ids, _ = pad_batch([s[:-1] for s in seqs], pad_id)
    labels, _ = pad_batch([s[1:] for s in seqs], pad_id, length=input_ids.shape[1])
    mask = np.zeros(input_ids.shape, dtype=np.float32)
    for b, (p, r) in enumerate(zip(prompts, responses)):
        mask[b, len(p) - 1:len(p) - 1 + len(r)] = 1.0
    return input_ids, labels, mask
