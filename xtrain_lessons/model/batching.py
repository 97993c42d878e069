"""Batched forward over ragged sequences (phase T10).

A model call on a (B, T) batch does the work of B per-sequence calls in one pass: every op
runs once on B times more rows, so the per-op cost (Python, kernel launches, BLAS set-up) is
paid once instead of B times. Sequences of different lengths are RIGHT-padded to the longest
one. Under a causal mask, position t attends only to positions <= t, so the real positions of
a right-padded row never see a pad: their logits equal those of the sequence run alone (to
float rounding: the BLAS calls have other shapes). The pads' own outputs are garbage and are
masked out of the loss with `ignore_index` targets.

    from xtrain_lessons.model.batching import pad_batch, ragged_batch, forward_ragged, loss_ragged
    ids, lengths = pad_batch([[5, 6, 7], [8]], pad_id=0)    # [[5, 6, 7], [8, 0, 0]], [3, 1]
    ids, targets, lengths = ragged_batch(seqs)              # inputs s[:-1], targets s[1:], padded
    logits = forward_ragged(model, [s[:-1] for s in seqs])  # list of (L_i, V) arrays

Public API
----------
pad_batch(seqs, pad_id=0, length=None) -> (ids (B, T) int64, lengths (B,) int64)
mask_targets(targets, lengths, ignore_index=-100) -> targets with positions >= length ignored
ragged_batch(seqs, pad_id=0, ignore_index=-100) -> (ids, targets, lengths): each sequence of
    L+1 tokens gives L inputs s[:-1] and L targets s[1:]; pads get `ignore_index` targets.
forward_ragged(model, seqs, pad_id=0) -> list of (L_i, V) logits, one padded batch forward
forward_loop(model, seqs) -> the same, one forward per sequence (the reference)
loss_ragged(model, seqs, pad_id=0, ignore_index=-100) -> scalar Tensor: the mean loss over
    all real target tokens = the token-weighted mean of the per-sequence losses.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.autograd.tensor import no_grad

__all__ = ["pad_batch", "mask_targets", "ragged_batch", "forward_ragged", "forward_loop",
           "loss_ragged"]


def pad_batch(seqs, pad_id: int = 0, length: int | None = None):
    """Right-pad 1-D integer sequences to one (B, T) array (T = the longest, or `length`)."""
    seqs = [np.asarray(s, dtype=np.int64).reshape(-1) for s in seqs]
    if not seqs:
        raise ValueError("pad_batch: no sequences")
    lengths = np.array([len(s) for s in seqs], dtype=np.int64)
    T = int(lengths.max()) if length is None else int(length)
    if lengths.max() > T:
        raise ValueError(f"pad_batch: a sequence of length {int(lengths.max())} is longer than {T}")
    ids = np.full((len(seqs), T), pad_id, dtype=np.int64)
    for b, s in enumerate(seqs):
        ids[b, :len(s)] = s
    return ids, lengths


def mask_targets(targets, lengths, ignore_index: int = -100):
    """A copy of `targets` (B, T) with every position t >= lengths[b] set to ignore_index."""
    targets = np.array(targets, dtype=np.int64, copy=True)
    pad = np.arange(targets.shape[1])[None, :] >= np.asarray(lengths)[:, None]
    targets[pad] = ignore_index
    return targets


def ragged_batch(seqs, pad_id: int = 0, ignore_index: int = -100):
    """(ids, targets, lengths) for next-token training on sequences of different lengths."""
    seqs = [np.asarray(s, dtype=np.int64).reshape(-1) for s in seqs]
    if any(len(s) < 2 for s in seqs):
        raise ValueError("ragged_batch: every sequence needs at least 2 tokens")
    ids, lengths = pad_batch([s[:-1] for s in seqs], pad_id)
    targets, _ = pad_batch([s[1:] for s in seqs], pad_id)
    return ids, mask_targets(targets, lengths, ignore_index), lengths


def forward_ragged(model, seqs, pad_id: int = 0) -> list:
    """Logits of each sequence, from ONE forward of the right-padded batch (no graph)."""
    ids, lengths = pad_batch(seqs, pad_id)
    with no_grad():
        logits = model(ids).numpy()
    return [logits[b, :n] for b, n in enumerate(lengths)]


def forward_loop(model, seqs) -> list:
    """Logits of each sequence, one forward per sequence (no graph): the reference."""
    out = []
    with no_grad():
        for s in seqs:
            out.append(model(np.asarray(s, dtype=np.int64)[None, :]).numpy()[0])
    return out


def loss_ragged(model, seqs, pad_id: int = 0, ignore_index: int = -100):
    """Mean next-token loss over the real tokens of all sequences, one batched forward."""
    ids, targets, _ = ragged_batch(seqs, pad_id, ignore_index)
    return model.loss(ids, targets, ignore_index=ignore_index)
