"""Caching allocator and memory accounting (T11)."""

import numpy as np
import pytest

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.runtime.allocator import CachingAllocator, size_class
from xtrain_lessons.measure.memory_report import memory_report
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.training.optim import SGD, AdamW
from xtrain_lessons.model.recompute import saved_bytes

MiB = 1 << 20


def test_size_class():
    assert size_class(1) == 512 and size_class(0) == 512 and size_class(512) == 512
    assert size_class(513) == 1024 and size_class(4096) == 4096 and size_class(4097) == 8192
    assert size_class(MiB) == MiB and size_class(MiB + 1) == MiB + MiB // 4
    assert size_class(5 * MiB) == 5 * MiB and size_class(5 * MiB + 1) == 6 * MiB
    for n in np.random.default_rng(0).integers(1, 1 << 30, 2000):
        c = size_class(int(n))
        assert c >= n and (c <= 2 * max(n, 512) if n <= MiB else c <= 1.25 * n + 1)
        assert size_class(c) == c  # a class is its own class


def test_alloc_free_reuse_and_stats():
    pool = CachingAllocator()
    a = pool.alloc((100, 3), np.float32)
    assert a.shape == (100, 3) and a.dtype == np.float32 and a.flags.c_contiguous
    a[...] = 1.0
    assert pool.stats.misses == 1 and pool.stats.hits == 0
    assert pool.stats.bytes_in_use == size_class(1200) == 2048
    b = pool.alloc(1000, np.uint8)  # 1000 bytes -> class 1024
    assert pool.stats.bytes_in_use == 2048 + 1024 and pool.stats.peak_bytes_in_use == 3072
    pool.free(a)
    assert pool.stats.bytes_in_use == 1024 and pool.stats.bytes_cached == 2048
    c = pool.alloc((256,), np.float64)  # 2048 bytes: the buffer of a comes back
    assert pool.stats.hits == 1 and pool.stats.misses == 2
    assert np.shares_memory(c, a)  # the same buffer (a was freed)
    pool.free(b); pool.free(c)
    s = pool.stats
    assert (s.allocations, s.frees, s.bytes_in_use, s.bytes_cached, s.peak_bytes_in_use) == (3, 3, 0, 3072, 3072)
    with pytest.raises(ValueError):
        pool.free(c)  # twice
    with pytest.raises(ValueError):
        pool.free(np.empty(4))  # not ours
    assert pool.empty_cache() == 3072 and pool.stats.bytes_reserved == 0


def test_buffers_do_not_overlap_while_live():
    pool = CachingAllocator()
    arrs = [pool.alloc((64,), np.float32) for _ in range(5)]
    for i, a in enumerate(arrs):
        a[...] = i
    assert all((a == i).all() for i, a in enumerate(arrs))
    for a in arrs:
        pool.free(a)
    again = [pool.alloc((64,), np.float32) for _ in range(5)]
    assert pool.stats.hits == 5
    for i, a in enumerate(again):
        for b in again[i + 1:]:
            assert not np.shares_memory(a, b)


def test_scope_frees_everything_inside():
    pool = CachingAllocator()
    keep = pool.alloc(10)
    for _ in range(3):  # a step-like pattern: same sizes every step
        with pool.scope():
            x = pool.alloc((128, 128))
            y = pool.alloc((128, 64))
            pool.free(y)  # freed early: not freed twice at the end
            pool.alloc((7,), np.int64)
        assert pool.live_arrays == 1
    s = pool.stats
    assert s.allocations == 1 + 9 and s.misses == 1 + 3 and s.hits == 6
    assert s.bytes_in_use == size_class(keep.nbytes)
    del x


def test_memory_report_toy_hand_computed():
    B, D = 6, 10

    class Toy:  # loss = sum(x * w): the graph keeps the product (B, D) and the scalar sum
        def __init__(self):
            self.w = Tensor(np.ones(D, np.float32), requires_grad=True)

        def named_parameters(self):
            return {"w": self.w}

        def loss(self, ids, targets):
            x = Tensor(np.asarray(ids, np.float32))
            return ops.sum(ops.mul(x, self.w))

    toy = Toy()
    ids = np.arange(B * D).reshape(B, D)
    r = memory_report(toy, AdamW(toy.named_parameters()), (ids, None))
    assert r == {"parameters": 4 * D, "gradients": 4 * D, "optimizer_state": 2 * 4 * D,
                 "activations": 4 * B * D + 4, "total": 4 * D * 4 + 4 * B * D + 4}
    assert toy.w.grad is None  # restored
    assert memory_report(toy, SGD(toy.named_parameters(), momentum=0.9), (ids, None))["optimizer_state"] == 4 * D
    assert memory_report(toy, SGD(toy.named_parameters()), (ids, None))["optimizer_state"] == 0


def test_memory_report_model():
    cfg = PRESETS["test"]
    model = Model(cfg, seed=0)
    opt = AdamW(model.named_parameters(), weight_decay=0.1)
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, cfg.vocab_size, (2, 8)), rng.integers(0, cfg.vocab_size, (2, 8))
    r = memory_report(model, opt, (ids, targets))
    n = cfg.n_params()
    assert r["parameters"] == 4 * n and r["gradients"] == 4 * n and r["optimizer_state"] == 8 * n
    assert r["activations"] == saved_bytes(model.loss(ids, targets)) > 0
    assert r["total"] == 16 * n + r["activations"]
    # after a real step the optimizer's own state arrays are counted: same numbers
    model.loss(ids, targets).backward()
    opt.step()
    assert memory_report(model, opt, (ids, targets))["optimizer_state"] == 8 * n


# ----- leases and the engine allocator (T11: the engine's large buffers on the cache) -----

def test_a_lease_returns_its_buffer_when_the_last_view_is_gone():
    import ml_dtypes

    pool = CachingAllocator()
    a = pool.lease((100, 300), np.float32)
    assert a.shape == (100, 300) and a.dtype == np.float32 and a.flags.c_contiguous
    view = a[10:20].T  # a view keeps the buffer
    del a
    assert pool.stats.bytes_in_use > 0 and pool.stats.frees == 0
    del view
    assert pool.stats.bytes_in_use == 0 and pool.stats.frees == 1 and pool.stats.bytes_cached > 0
    b = pool.lease((300, 100), ml_dtypes.bfloat16)  # any dtype (ml_dtypes bf16 too)
    assert b.dtype == ml_dtypes.bfloat16 and pool.stats.misses == 2  # 60 KB: another size class
    c = pool.lease((100, 300), np.float32)
    assert pool.stats.hits == 1  # the first buffer, given back, is handed out again
    c[...] = 1.0
    assert float(c.sum()) == 30000.0


def test_engine_allocator_is_off_by_default_and_bit_identical_when_on():
    from xtrain_lessons.runtime import allocator, cpu_threads

    assert allocator.empty((256, 256)).flags.owndata  # off: plain np.empty
    cfg = PRESETS["tiny"].replace(vocab_size=512, n_layers=2)
    ids = np.random.default_rng(1).integers(0, 512, (4, 65))

    def step():
        m = Model(cfg, seed=3)
        loss = m.loss(ids[:, :-1], ids[:, 1:])
        loss.backward()
        return float(loss.data), {k: p.grad.copy() for k, p in m.params.items()}

    plain_loss, plain_grads = step()
    before = cpu_threads.get_threads()
    cpu_threads.set_threads(2)  # leases also die on the pool's threads
    try:
        with allocator.engine_allocator() as pool:
            first = step()
            misses, allocations = pool.stats.misses, pool.stats.allocations
            second = step()
            assert pool.stats.misses == misses  # the second step reuses every buffer
            assert pool.stats.allocations == 2 * allocations > 0
            assert pool.stats.bytes_in_use == 0  # all given back after the step
            assert not allocator.empty((256, 256)).flags.owndata  # on: a lease
    finally:
        cpu_threads.set_threads(before)
    assert allocator.empty((256, 256)).flags.owndata  # off again after the block
    for loss, grads in (first, second):
        assert loss == plain_loss
        assert all(np.array_equal(grads[k], plain_grads[k]) for k in grads)


def test_keep_freed_memory_reuses_large_buffers_without_page_faults():
    import resource  # noqa: PLC0415

    from xtrain_lessons.runtime.allocator import keep_freed_memory  # noqa: PLC0415

    if not keep_freed_memory():
        pytest.skip("no glibc mallopt here")

    def faults_of_a_second_buffer():
        a = np.empty(48 << 18, np.float32)  # 48 MiB: above glibc's largest default mmap threshold
        a[:] = 1
        del a
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        b = np.empty(48 << 18, np.float32)
        b[:] = 1
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    assert faults_of_a_second_buffer() < 64  # 12288 pages of 4 KiB if it came back from the kernel
