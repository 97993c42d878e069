"""Row blocks on the CPU (xtrain_lessons.runtime.cpu_threads, T07): blocks, order, threads, errors, and the
ops built on them give the same bits with 1 thread, with 2, and without blocks."""

import contextlib
import threading
import time

import numpy as np
import pytest

from xtrain_lessons.model import layers
from xtrain_lessons.autograd import ops
from xtrain_lessons.runtime import cpu_threads
from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.model.qwen3 import PRESETS, Model


@pytest.fixture
def threads():
    """Set rowwise threads for a test; restore afterwards."""
    before = cpu_threads.get_threads()
    yield cpu_threads.set_threads
    cpu_threads.set_threads(before)


def test_blocks_cover_rows_exactly_and_depend_only_on_sizes():
    spans = cpu_threads.blocks(1000, 1024, block_bytes=128 * 1024)
    assert spans[0] == (0, 128) and spans[-1] == (896, 1000)
    assert [lo for lo, _ in spans[1:]] == [hi for _, hi in spans[:-1]]  # contiguous, no gaps
    assert cpu_threads.blocks(0, 10) == []
    assert cpu_threads.blocks(5, 10 ** 9) == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]  # >= 1 row each


def test_runs_are_the_grid_with_one_thread_and_one_run_of_grid_blocks_per_thread():
    grid = cpu_threads.blocks(1000, 1024, block_bytes=8 * 1024)  # 125 blocks of 8 rows
    assert cpu_threads.runs(1000, 1024, 8 * 1024, threads=1) == grid
    two = cpu_threads.runs(1000, 1024, 8 * 1024, threads=2)
    assert two == [(0, 496), (496, 1000)]  # cut on the grid: 62 and 63 blocks
    assert all(lo % 8 == 0 for lo, _ in cpu_threads.runs(1000, 1024, 8 * 1024, threads=3))
    assert cpu_threads.runs(3, 1024, 8 * 1024, threads=4) == [(0, 3)]  # never more runs than blocks
    assert cpu_threads.grid(496, 1000, 1024, 8 * 1024) == grid[62:]  # a run's own grid blocks


@pytest.mark.parametrize("n", [1, 2, 3])
def test_map_rows_returns_results_in_row_order(threads, n):
    threads(n)
    seen = []
    lock = threading.Lock()

    def fn(lo, hi):
        with lock:
            seen.append(threading.get_ident())
        return (lo, hi)

    out = cpu_threads.map_rows(fn, 1000, 1024, block_bytes=8 * 1024)
    assert out == cpu_threads.runs(1000, 1024, 8 * 1024, threads=n)
    if n > 1:
        assert len(out) == n and len(set(seen)) > 1  # one run per thread, on the pool too


def test_sum_blocks_is_the_same_with_any_thread_count(threads):
    """Partial sums on the fixed grid (cpu_threads.grid), added in row order: the same bits
    with 1, 2 or 3 threads, though the runs differ."""
    x = np.random.default_rng(0).standard_normal((3000, 17)).astype(np.float32)

    def partials(lo, hi):
        return [x[a:b].sum(axis=0) for a, b in cpu_threads.grid(lo, hi, x[0].nbytes, 4096)]

    sums = []
    for n in (1, 2, 3):
        threads(n)
        sums.append(cpu_threads.sum_blocks(cpu_threads.map_rows(partials, len(x), x[0].nbytes, block_bytes=4096)))
    assert all(np.array_equal(sums[0], s) for s in sums[1:])


def _matmul_bound(a, b):
    """Rounding bound of a float32 product: K * eps * (|a| @ |b|) (Higham), elementwise."""
    a64, b64 = np.abs(a.astype(np.float64)), np.abs(b.astype(np.float64))
    return a.shape[1] * np.finfo(np.float32).eps * (a64 @ b64)


def test_matmul_chunks_depend_on_the_shape_only():
    chunks = cpu_threads.matmul_chunks(3000, 400, 700)
    assert chunks[0] == (0, cpu_threads.MATMUL_ROWS) and chunks[-1][1] == 3000 and len(chunks) > 2
    assert [lo for lo, _ in chunks[1:]] == [hi for _, hi in chunks[:-1]]  # contiguous, no gaps
    assert cpu_threads.matmul_chunks(3, 64, 64) == [(0, 3)]  # too small to split: one call
    assert cpu_threads.matmul_chunks(0, 64, 64) == []
    # a short product is cut in halves, so that two threads share it (8 x 128 tokens: 2 x 512)
    assert cpu_threads.matmul_chunks(1024, 192, 192) == [(0, 512), (512, 1024)]
    assert cpu_threads.matmul_chunks(2048, 192, 192) == [(0, 1024), (1024, 2048)]
    assert len(cpu_threads.matmul_chunks(300, 192, 192)) == 3  # 128-row pieces at the least


@pytest.mark.parametrize("shape", [(300, 40, 70), (2048, 192, 512), (1, 64, 64), (601, 128, 96), (2500, 128, 300)])
def test_matmul_gives_the_same_bits_for_any_thread_count(threads, shape):
    """cpu_threads.matmul: the same bits with 1, 2 and 3 threads, also for a transposed view on
    the left (`g.T @ x`) and whatever OpenBLAS's own thread setting was; equal to a @ b within
    float32 rounding. (Not always bit-equal to one a @ b call: measured on an AVX-512 CPU,
    OpenBLAS sums the rows of a 1024-row product in another order than the same rows of a
    2048-row one.)"""
    M, K, N = shape
    rng = np.random.default_rng(0)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    g = rng.standard_normal((K, M)).astype(np.float32)
    results = []
    before = cpu_threads.blas_threads()
    try:
        for n in (1, 2, 3):
            cpu_threads.set_blas_threads(n)
            results.append((cpu_threads.matmul(a, b), cpu_threads.matmul(g.T, b)))
        cpu_threads.set_threads(2)
        if before:
            cpu_threads._set_blas_only(1)  # BLAS's own setting does not matter either
        results.append((cpu_threads.matmul(a, b), cpu_threads.matmul(g.T, b)))
    finally:
        if before:
            cpu_threads._set_blas_only(before)
    for r in results[1:]:
        assert np.array_equal(r[0], results[0][0]) and np.array_equal(r[1], results[0][1])
    assert np.all(np.abs(results[0][0] - a @ b) <= _matmul_bound(a, b))
    assert np.all(np.abs(results[0][1] - g.T @ b) <= _matmul_bound(g.T, b))
    out = np.empty((M, N), dtype=np.float32)
    assert cpu_threads.matmul(a, b, out=out) is out and np.array_equal(out, results[0][0])


def test_an_error_in_a_block_is_raised_after_the_other_threads_finish(threads):
    threads(2)
    done = []

    def fn(lo, hi):
        if lo == 0:
            raise ValueError("run 0 failed")
        time.sleep(0.05)  # the worker is still busy when the caller's run fails
        done.append((lo, hi))

    with pytest.raises(ValueError, match="run 0 failed"):
        cpu_threads.map_rows(fn, 64, 1024, block_bytes=4096)
    # the caller's run (rows 0-31) failed; the worker's run (32-63) finished before the
    # raise, so no thread is still writing when the caller sees the exception
    assert done == [(32, 64)]


def test_nested_map_rows_runs_inline_in_workers(threads):
    threads(2)

    def outer(lo, hi):
        return sum(cpu_threads.map_rows(lambda a, b: b - a, hi - lo, 1024, block_bytes=1024))

    assert sum(cpu_threads.map_rows(outer, 100, 1024, block_bytes=10 * 1024)) == 100


def test_blas_is_single_threaded_inside_and_restored(threads):
    if cpu_threads.blas_threads() is None:
        pytest.skip("OpenBLAS thread count not reachable here")
    before = cpu_threads.blas_threads()
    try:
        cpu_threads.set_blas_threads(2)
        assert cpu_threads.get_threads() == 2  # set_blas_threads sets the pool too
        inside = cpu_threads.map_rows(lambda lo, hi: cpu_threads.blas_threads(), 64, 1024, blas=True,
                                  block_bytes=4096)
        assert set(inside) == {1} and cpu_threads.blas_threads() == 2
    finally:
        cpu_threads.set_blas_threads(before)


def test_set_threads_rejects_zero():
    with pytest.raises(ValueError, match="at least 1"):
        cpu_threads.set_threads(0)


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
        orig = cpu_threads.map_rows.__kwdefaults__["block_bytes"]
        cpu_threads.map_rows.__kwdefaults__["block_bytes"] = block_bytes
        try:
            xt, wt = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
            y = ops.rmsnorm(xt, wt)
            y.backward(g)
            a, b = Tensor(x, requires_grad=True), Tensor(g, requires_grad=True)
            s = layers.swiglu(a, b)
            s.backward(x)
            results.append((y.data, xt.grad, wt.grad, s.data, a.grad, b.grad))
        finally:
            cpu_threads.map_rows.__kwdefaults__["block_bytes"] = orig
    (y1, gx1, gw1, s1, ga1, gb1), (y2, gx2, gw2, s2, ga2, gb2) = results
    for u, v in ((y1, y2), (gx1, gx2), (s1, s2), (ga1, ga2), (gb1, gb2)):
        assert np.array_equal(u, v)
    np.testing.assert_allclose(gw1, gw2, rtol=1e-5, atol=1e-5)


def test_adamw_over_the_threads_is_bit_identical_to_whole_array_updates(threads):
    """AdamW lays every parameter end to end and updates spans of them on the threads: the
    same bits as one whole-array update per parameter, with 1, 2 or 3 threads."""
    from xtrain_lessons.runtime.opset.optim import _adamw_update
    from xtrain_lessons.training.optim import AdamW

    cfg = PRESETS["tiny"].replace(vocab_size=512, n_layers=1)
    results = []
    for n in (1, 2, 3):
        threads(n)
        m = Model(cfg, seed=3)
        rng = np.random.default_rng(5)
        for p in m.params.values():
            p.grad = rng.standard_normal(p.data.shape).astype(np.float32)
        opt = AdamW(m.named_parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
        opt.step()
        opt.step()
        results.append({k: p.data.copy() for k, p in m.params.items()})
    for r in results[1:]:
        assert all(np.array_equal(results[0][k], r[k]) for k in r)
    # the reference: each parameter updated as one whole array (same hyperparameters)
    m = Model(cfg, seed=3)
    opt = AdamW(m.named_parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    rng = np.random.default_rng(5)
    grads = {k: rng.standard_normal(p.data.shape).astype(np.float32) for k, p in m.params.items()}
    for t in (1, 2):
        for g in opt.groups:
            b1, b2 = g["betas"]
            for name, p in g["params"]:
                st = opt.state.setdefault(name, {"exp_avg": np.zeros_like(p.data),
                                                 "exp_avg_sq": np.zeros_like(p.data)})
                _adamw_update(p.data, grads[name], st["exp_avg"], st["exp_avg_sq"], g["lr"], b1, b2,
                              g["eps"], g["weight_decay"], 1.0 - b1 ** t, (1.0 - b2 ** t) ** 0.5)
    assert all(np.array_equal(results[0][k], p.data) for k, p in m.params.items())


def test_split_items_keeps_items_whole_in_order_and_balances_sizes():
    assert cpu_threads.split_items([10, 10, 10, 10], 2) == [(0, 2), (2, 4)]
    assert cpu_threads.split_items([100, 1, 1, 1], 2) == [(0, 1), (1, 4)]
    assert cpu_threads.split_items([1] * 10, 3) == [(0, 3), (3, 7), (7, 10)]
    assert cpu_threads.split_items([5], 3) == [(0, 1)]  # never an empty group
    assert cpu_threads.split_items([], 2) == []
    sizes = list(np.random.default_rng(1).integers(1, 1000, 40))
    groups = cpu_threads.split_items(sizes, 3)
    assert groups[0][0] == 0 and groups[-1][1] == 40
    assert all(j == i2 for (_, j), (i2, _) in zip(groups, groups[1:]))  # contiguous
    totals = [sum(sizes[i:j]) for i, j in groups]
    assert max(totals) - min(totals) <= 2 * max(sizes)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_map_items_returns_groups_in_order(threads, n):
    threads(n)
    sizes = [3, 1, 4, 1, 5, 9, 2, 6]
    out = cpu_threads.map_items(lambda i, j: list(range(i, j)), sizes)
    assert [k for group in out for k in group] == list(range(len(sizes)))
    assert len(out) == min(n, len(sizes))


def test_embedding_backward_split_by_token_range_equals_one_scatter_add(threads):
    """The embedding gradient is built by vocabulary ranges, one per thread, each adding its
    tokens' rows in their order: the same bits as one np.add.at, with repeated ids."""
    rng = np.random.default_rng(0)
    V, D = 50, 16
    w = rng.standard_normal((V, D)).astype(np.float32)
    ids = rng.integers(0, V, (8, 40))  # 320 ids over 50 rows: every row repeats
    g = rng.standard_normal((8, 40, D)).astype(np.float32)
    want = np.zeros((V, D), np.float32)
    np.add.at(want, ids.reshape(-1), g.reshape(-1, D))
    for n in (1, 2, 3):
        threads(n)
        wt = Tensor(w, requires_grad=True)
        ops.embedding(wt, ids).backward(g)
        assert np.array_equal(wt.grad, want), n


def test_grad_norm_and_clipping_same_bits_for_any_thread_count(threads):
    """The global norm sums each gradient whole (one reduction each, on some thread) and adds
    them in parameter order; clipping scales them on the threads: same bits as one thread;
    NumPy's path gives the sequential formula's bits, the C++ one (16 lanes per gradient)
    the formula's value to within a few float64 roundings."""
    from xtrain_lessons.runtime.host import fused_rows
    from xtrain_lessons.training.optim import clip_grad_norm, global_grad_norm

    for numpy_path in (True, False):
        with fused_rows.disabled() if numpy_path else contextlib.nullcontext():
            _check_grad_norm_and_clipping(threads, global_grad_norm, clip_grad_norm, exact=numpy_path)


def _check_grad_norm_and_clipping(threads, global_grad_norm, clip_grad_norm, exact):

    rng = np.random.default_rng(2)
    shapes = [(300, 64), (64,), (128, 64), (5,), (64, 300)]
    grads = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    want = 0.0
    for gr in grads:
        want = want + np.sum(np.square(gr.astype(np.float64)))
    want = float(np.sqrt(want))
    results = []
    for n in (1, 2, 3):
        threads(n)
        params = [Tensor(np.zeros(s, np.float32), requires_grad=True) for s in shapes]
        for p, gr in zip(params, grads):
            p.grad = gr.copy()
        norm = global_grad_norm(params)
        assert norm == want if exact else abs(norm - want) <= 1e-14 * want
        assert float(global_grad_norm(params, sync=False)) == norm
        clip_grad_norm(params, 1.0)
        results.append([p.grad for p in params] + [norm])
    for r in results[1:]:
        assert all(np.array_equal(a, b) for a, b in zip(results[0], r))
    coef = np.float32(1.0 / (results[0][-1] + 1e-6))
    assert all(np.array_equal(a, gr * coef) for a, gr in zip(results[0][:-1], grads))


@pytest.mark.parametrize("n", [1, 2, 3])
def test_matmuls_in_one_hand_over_equal_separate_products(threads, n):
    """A linear layer's dx and dW in one region: the same bits as two cpu_threads.matmul calls,
    whatever the thread count (the chunks of both products are shared out dynamically)."""
    rng = np.random.default_rng(4)
    g = rng.standard_normal((601, 128)).astype(np.float32)  # 2 x 601 x 128 x 96 FLOPs: split
    w = rng.standard_normal((128, 96)).astype(np.float32)
    x = rng.standard_normal((601, 96)).astype(np.float32)
    assert 2 * 601 * 128 * 96 >= cpu_threads.MATMUL_SPLIT_FLOPS
    threads(1)
    # the engine against itself (the same BLAS, the same call shapes): `g[:3] @ w` would be NumPy's
    # OpenBLAS, whose bits differ from MKL's
    want_gx, want_gw, want_small = cpu_threads.matmul(g, w), cpu_threads.matmul(g.T, x), cpu_threads.matmul(g[:3], w)
    threads(n)
    gx, gw = cpu_threads.matmuls((g, w), (g.T, x))
    small = cpu_threads.matmuls((g[:3], w))[0]  # too small to split: a plain call
    assert np.array_equal(gx, want_gx) and np.array_equal(gw, want_gw)
    assert np.array_equal(small, want_small)


@pytest.mark.parametrize("N", [40, 2100])  # one matmul chunk / MATMUL_ROWS-row chunks (N x 64 x 700)
def test_linear_cross_entropy_same_bits_as_linear_then_cross_entropy(threads, N):
    """The fused lm_head + loss (row chunks, one buffer reused in place) gives the loss and
    both gradients bit for bit as linear then cross_entropy, for 1, 2 and 3 threads;
    ignored targets count as in cross_entropy; the backward refuses to run twice."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((N // 4, 4, 64)).astype(np.float32)
    w = (0.3 * rng.standard_normal((700, 64))).astype(np.float32)
    t = rng.integers(0, 700, (N // 4, 4))
    t[0, :2] = -100
    threads(1)
    xa, wa = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    ref = ops.cross_entropy(layers.linear(xa, wa), t)
    ref.backward()
    for n in (1, 2, 3):
        threads(n)
        xb, wb = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
        got = layers.linear_cross_entropy(xb, wb, t)
        got.backward()
        assert got.data == ref.data and got.data.dtype == ref.data.dtype
        assert np.array_equal(xb.grad, xa.grad) and np.array_equal(wb.grad, wa.grad)
    with pytest.raises(RuntimeError, match="twice"):
        got.backward()


def test_cache_bytes_is_a_size_or_none():
    from xtrain_lessons.runtime.cpu_threads import cache_bytes
    for level in (1, 2, 3):
        size = cache_bytes(level)
        assert size is None or (isinstance(size, int) and size >= 1024), (level, size)
    assert cache_bytes(9) is None
