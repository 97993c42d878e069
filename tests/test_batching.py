"""Batched forward over ragged sequences (T10): padding, masked loss, parity with a loop."""

import numpy as np
import pytest

from xtrain_lessons.model.batching import (
    forward_loop,
    forward_ragged,
    loss_ragged,
    mask_targets,
    pad_batch,
    ragged_batch,
)
from xtrain_lessons.model.qwen3 import PRESETS, Model

CFG = PRESETS["test"]


def ragged(lengths, seed=0, vocab=CFG.vocab_size):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, n) for n in lengths]


def test_pad_batch_right_pads():
    ids, lengths = pad_batch([[5, 6, 7], [8], [9, 10]], pad_id=0)
    assert ids.dtype == np.int64 and ids.tolist() == [[5, 6, 7], [8, 0, 0], [9, 10, 0]]
    assert lengths.tolist() == [3, 1, 2]
    ids, _ = pad_batch([[1, 2]], pad_id=3, length=4)
    assert ids.tolist() == [[1, 2, 3, 3]]
    with pytest.raises(ValueError):
        pad_batch([[1, 2, 3]], length=2)


def test_mask_and_ragged_batch():
    t = mask_targets(np.arange(8).reshape(2, 4), [4, 1], ignore_index=-100)
    assert t.tolist() == [[0, 1, 2, 3], [4, -100, -100, -100]]
    ids, targets, lengths = ragged_batch([[1, 2, 3, 4], [5, 6]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [5, 0, 0]]
    assert targets.tolist() == [[2, 3, 4], [6, -100, -100]]
    assert lengths.tolist() == [3, 1]


@pytest.mark.parametrize("dtype,tol", [(np.float32, 1e-6), (np.float64, 1e-12)])
def test_ragged_rows_equal_per_sequence(dtype, tol):
    model = Model(CFG, seed=0, dtype=dtype)
    seqs = ragged([1, 7, 16, 3, 11], seed=1)
    batched, looped = forward_ragged(model, seqs), forward_loop(model, seqs)
    for s, a, b in zip(seqs, batched, looped):
        assert a.shape == b.shape == (len(s), CFG.vocab_size)
        assert np.abs(a - b).max() <= tol


def test_padding_is_masked_from_the_loss():
    model = Model(CFG, seed=0)
    seqs = ragged([2, 9, 17, 5], seed=2)
    loss = float(loss_ragged(model, seqs).item())
    per_seq = [float(model.loss(s[None, :-1], s[None, 1:]).item()) for s in seqs]
    n = [len(s) - 1 for s in seqs]
    expected = float(np.dot(per_seq, n) / np.sum(n))
    assert abs(loss - expected) <= 1e-5 * abs(expected)
    # another pad id changes nothing
    loss7 = float(loss_ragged(model, seqs, pad_id=7).item())
    assert abs(loss7 - loss) <= 1e-6 * abs(loss)


def test_padded_gradient_equals_token_weighted_sum():
    seqs = ragged([3, 10, 6], seed=3)
    n = np.array([len(s) - 1 for s in seqs], dtype=np.float64)
    m1 = Model(CFG, seed=0, dtype=np.float64)
    loss_ragged(m1, seqs).backward()
    m2 = Model(CFG, seed=0, dtype=np.float64)
    for s, w in zip(seqs, n / n.sum()):
        (m2.loss(s[None, :-1], s[None, 1:]) * float(w)).backward()
    for (name, p1), p2 in zip(m1.named_parameters().items(), m2.parameters()):
        np.testing.assert_allclose(p1.grad, p2.grad, rtol=1e-9, atol=1e-12, err_msg=name)
