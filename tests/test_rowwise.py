"""Row blocks on the CPU (xtrain_lessons.rowwise, T07): blocks, order, threads, errors, and the
ops built on them give the same bits with 1 thread, with 2, and without blocks."""

import threading

import numpy as np
import pytest

from xtrain_lessons import nn, ops, rowwise
from xtrain_lessons.autograd import Tensor
from xtrain_lessons.model import PRESETS, Model


@pytest.fixture
def threads():
    """Set rowwise threads for a test; restore afterwards."""
    before = rowwise.get_threads()
    yield rowwise.set_threads
    rowwise.set_threads(before)


def test_blocks_cover_rows_exactly_and_depend_only_on_sizes():
    spans = rowwise.blocks(1000, 1024, block_bytes=128 * 1024)
    assert spans[0] == (0, 128) and spans[-1] == (896, 1000)
    assert [lo for lo, _ in spans[1:]] == [hi for _, hi in spans[:-1]]  # contiguous, no gaps
    assert rowwise.blocks(0, 10) == []
    assert rowwise.blocks(5, 10 ** 9) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]  # >= 1 row each


@pytest.mark.parametrize("n", [1, 2, 3])
def test_map_rows_returns_results_in_row_order(threads, n):
    threads(n)
    seen = []
    lock = threading.Lock()

    def fn(lo, hi):
        with lock:
            seen.append(threading.get_ident())
        return (lo, hi)

    out = rowwise.map_rows(fn, 1000, 1024, block_bytes=8 * 1024)
    assert out == rowwise.blocks(1000, 1024, block_bytes=8 * 1024)
    if n > 1:
        assert len(set(seen)) > 1  # the blocks really ran on more than one thread


def test_sum_blocks_is_the_same_with_any_thread_count(threads):
    x = np.random.default_rng(0).standard_normal((3000, 17)).astype(np.float32)
    sums = []
    for n in (1, 2, 3):
        threads(n)
        sums.append(rowwise.sum_blocks(rowwise.map_rows(lambda lo, hi: x[lo:hi].sum(axis=0), len(x),
                                                        x[0].nbytes, block_bytes=4096)))
    assert all(np.array_equal(sums[0], s) for s in sums[1:])


def test_an_error_in_a_block_is_raised_after_the_other_threads_finish(threads):
    threads(2)
    done = []

    def fn(lo, hi):
        if lo == 0:
            raise ValueError("block 0 failed")
        done.append(lo)

    with pytest.raises(ValueError, match="block 0 failed"):
        rowwise.map_rows(fn, 64, 1024, block_bytes=4096)
    # the caller's group (blocks 0-7) stops at its error; the worker's group (8-15) finished
    # before the raise, so no thread is still writing when the caller sees the exception
    assert sorted(done) == list(range(32, 64, 4))


def test_nested_map_rows_runs_inline_in_workers(threads):
    threads(2)

    def outer(lo, hi):
        return sum(rowwise.map_rows(lambda a, b: b - a, hi - lo, 1024, block_bytes=1024))

    assert sum(rowwise.map_rows(outer, 100, 1024, block_bytes=10 * 1024)) == 100


def test_blas_is_single_threaded_inside_and_restored(threads):
    if rowwise.blas_threads() is None:
        pytest.skip("OpenBLAS thread count not reachable here")
    before = rowwise.blas_threads()
    try:
        rowwise.set_blas_threads(2)
        assert rowwise.get_threads() == 2  # set_blas_threads sets the pool too
        inside = rowwise.map_rows(lambda lo, hi: rowwise.blas_threads(), 64, 1024, blas=True,
                                  block_bytes=4096)
        assert set(inside) == {1} and rowwise.blas_threads() == 2
    finally:
        rowwise.set_blas_threads(before)


def test_set_threads_rejects_zero():
    with pytest.raises(ValueError, match="at least 1"):
        rowwise.set_threads(0)


def _step_grads(cfg):
    m = Model(cfg, seed=3)
    ids = np.random.default_rng(1).integers(0, cfg.vocab_size, (4, 33))
    loss = m.loss(ids[:, :-1], ids[:, 1:])
    loss.backward()
    return float(loss.data), {k: p.grad.copy() for k, p in m.params.items()}


@pytest.mark.parametrize("n_kv_heads", [4, 2])
def test_model_step_bit_identical_for_1_and_2_threads(threads, n_kv_heads):
    """rmsnorm, swiglu and attention run on row blocks over the thread pool: the loss and
    every gradient are the same bits whatever the thread count."""
    cfg = PRESETS["tiny"].replace(vocab_size=512, n_layers=2, n_kv_heads=n_kv_heads)
    threads(1)
    l1, g1 = _step_grads(cfg)
    threads(2)
    l2, g2 = _step_grads(cfg)
    assert l1 == l2
    for k in g1:
        assert np.array_equal(g1[k], g2[k]), k


def test_blocked_ops_equal_unblocked_rows(threads):
    """One block per row against one block for everything: row-local arithmetic is unchanged
    (outputs bit-identical); the weight gradient, a sum over rows, agrees to rounding."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((6, 50, 24)).astype(np.float32)
    w = rng.standard_normal(24).astype(np.float32)
    g = rng.standard_normal((6, 50, 24)).astype(np.float32)
    results = []
    for block_bytes in (1, 1 << 30):  # one row per block / a single block
        orig = rowwise.map_rows.__kwdefaults__["block_bytes"]
        rowwise.map_rows.__kwdefaults__["block_bytes"] = block_bytes
        try:
            xt, wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
            y = ops.rmsnorm(xt, wt)
            y.backward(g)
            a, b = Tensor(x, requires_grad=True), Tensor(g, requires_grad=True)
            s = nn.swiglu(a, b)
            s.backward(x)
            results.append((y.data, xt.grad, wt.grad, s.data, a.grad, b.grad))
        finally:
            rowwise.map_rows.__kwdefaults__["block_bytes"] = orig
    (y1, gx1, gw1, s1, ga1, gb1), (y2, gx2, gw2, s2, ga2, gb2) = results
    for u, v in ((y1, y2), (gx1, gx2), (s1, s2), (ga1, ga2), (gb1, gb2)):
        assert np.array_equal(u, v)
    np.testing.assert_allclose(gw1, gw2, rtol=1e-5, atol=1e-5)
