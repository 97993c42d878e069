"""T16: gradient accumulation — N micro-steps of loss/N equal one N-times batch; with data
parallelism the gradients are all-reduced only at the accumulation boundary."""

import numpy as np
import pytest

from xtrain_lessons.parallel.ddp import DDP, accumulate_gradients, micro_batches, shard
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.model.recompute import saved_bytes

CFG = PRESETS["test"]


def batch(n, T=16, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, CFG.vocab_size, (n, T)), rng.integers(0, CFG.vocab_size, (n, T))


def grads(model):
    return {k: p.grad.copy() for k, p in model.named_parameters().items()}


@pytest.mark.parametrize("N", [1, 2, 4, 3])
def test_accumulation_equals_big_batch(N):
    x, y = batch(12)
    big = Model(CFG, seed=0)
    big.loss(x, y).backward()
    acc = Model(CFG, seed=0)
    loss = accumulate_gradients(acc, micro_batches(x, y, N))
    g_big, g_acc = grads(big), grads(acc)
    err = max(float(np.abs(g_big[k] - g_acc[k]).max()) for k in g_big)
    assert err <= 1e-6, err
    assert abs(loss - float(big.loss(x, y).item())) <= 1e-6


def test_micro_batch_layout():
    x = np.arange(12)[:, None]
    # 2 micro-steps x 3 ranks x 2 rows: micro-step k, rank r -> rows (k*3 + r)*2 ...
    parts = micro_batches(x, x, 2, rank=1, world_size=3)
    assert [p[0][:, 0].tolist() for p in parts] == [[2, 3], [8, 9]]
    assert shard(x, 1, 2)[:, 0].tolist() == [6, 7, 8, 9, 10, 11]
    with pytest.raises(ValueError):
        micro_batches(x, x, 5)


class CountingGroup:
    """A stand-in process group of 2 ranks whose peer holds the same values (sum = 2x)."""

    def __init__(self):
        self.calls = []

    def world_size(self):
        return 2

    def rank(self):
        return 0

    def all_reduce(self, arr, op="sum"):
        self.calls.append(("all_reduce", arr.size))
        arr *= 2
        return arr

    def broadcast(self, arr, src=0):
        self.calls.append(("broadcast", arr.size))
        return arr


@pytest.mark.parametrize("N", [1, 4])
def test_all_reduce_only_at_the_boundary(N):
    x, y = batch(8)
    model = Model(CFG, seed=0)
    group = CountingGroup()
    ddp = DDP(model, dist=group, bucket_bytes=20_000)
    assert [c for c, _ in group.calls] == ["broadcast"] * len(ddp.buckets)
    assert len(ddp.buckets) > 1  # several buckets at this size
    group.calls.clear()
    accumulate_gradients(model, micro_batches(x, y, N), ddp)
    # one all-reduce per bucket for the whole accumulation, whatever N
    assert group.calls == [("all_reduce", f.size) for f in ddp._flat]
    ref = Model(CFG, seed=0)
    ref.loss(x, y).backward()
    err = max(float(np.abs(ref.params[k].grad - p.grad).max()) for k, p in model.params.items())
    assert err <= 1e-6  # averaged over 2 identical ranks: unchanged


def test_train_accum_steps_equals_big_batch(tmp_path):
    from xtrain_lessons.training.config import TrainConfig
    from xtrain_lessons.training.loop import train

    text = tmp_path / "t.txt"
    text.write_text(("Once upon a time there was a cat. It liked milk.\n<|endoftext|>\n"
                     "The dog ran to the park and played.\n<|endoftext|>\n") * 60, encoding="utf-8")
    base = dict(data=str(text), preset="test", vocab_size=300, steps=3, seq_len=16, warmup=1,
                eval_every=0, sample_every=0, sample_tokens=0, checkpoint_every=0)
    a = train(TrainConfig(**base, batch_size=4, out=str(tmp_path / "a")), progress=False, log=lambda m: None)
    b = train(TrainConfig(**base, batch_size=2, accum_steps=2, out=str(tmp_path / "b")), progress=False,
              log=lambda m: None)
    assert a.summary["tokens_seen"] == b.summary["tokens_seen"] == 3 * 4 * 16
    assert max(abs(u - v) for u, v in zip(a.losses, b.losses)) <= 1e-6
    pa, pb = a.model.state_dict(), b.model.state_dict()
    assert max(float(np.abs(pa[k] - pb[k]).max()) for k in pa) <= 1e-6
    with pytest.raises(ValueError, match="accum_steps"):
        TrainConfig(accum_steps=0).validate()


def test_micro_batch_keeps_less_activation_memory():
    x, y = batch(8, T=32)
    model = Model(CFG, seed=0)
    full = saved_bytes(model.loss(x, y))
    micro = saved_bytes(model.loss(x[:2], y[:2]))
    # activations scale with the rows in flight: 4 micro-batches of 2 keep about 1/4
    assert 0.2 < micro / full < 0.3
