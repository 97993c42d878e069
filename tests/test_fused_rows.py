"""runtime/host's fused C++ row kernels against their NumPy references, the engine with them
against its NumPy path, and causal attention by blocks of queries (phase T07)."""

import contextlib

import numpy as np
import pytest

from xtrain_lessons.autograd.gradcheck import gradcheck
from xtrain_lessons.autograd.tensor import Tensor, make_node
from xtrain_lessons.model import layers
from xtrain_lessons.runtime.opset import attention
from xtrain_lessons.model.qwen3 import Model, PRESETS
from xtrain_lessons.runtime import cpu_threads
from xtrain_lessons.runtime.host import fused_rows as fr

pytestmark = pytest.mark.skipif(not fr.available(), reason="no C++ compiler: the fused kernels cannot be built")

F32_TOL = dict(rtol=3e-6, atol=3e-7)  # a few float32 roundings away from the float64 reference


def _rng(seed=0):
    return np.random.default_rng(seed)


def _randn(*shape, seed=0, scale=1.0):
    return (_rng(seed).standard_normal(shape) * scale).astype(np.float32)


def test_exp_within_two_ulp_and_its_special_values():
    x = np.concatenate([np.linspace(-87.3, 88.7, 400_001), [0.0, -1e-30, 1e-30]]).astype(np.float32)
    y, ref = fr.exp(x).astype(np.float64), np.exp(x.astype(np.float64))
    ulp = np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(y - ref) / ulp) <= 2.0
    special = np.array([-np.inf, np.inf, np.nan, 89.0, -88.0, -1000.0, 1000.0], np.float32)
    out = fr.exp(special)
    assert out[0] == 0.0 and out[1] == np.inf and np.isnan(out[2]) and out[3] == np.inf
    assert out[4] == 0.0 and out[5] == 0.0 and out[6] == np.inf  # below 2^-126: flushed to 0


@pytest.mark.parametrize("D,with_w", [(192, True), (48, True), (37, False), (5, True)])
def test_rmsnorm_forward_and_backward_match_float64(D, with_w):
    N = 70
    x, g = _randn(N, D, seed=1, scale=3.0), _randn(N, D, seed=2)
    w = _randn(D, seed=3) if with_w else None
    xhat, out, r = np.empty_like(x), np.empty_like(x), np.empty(N, np.float32)
    fr.rmsnorm_fwd(x, w, xhat, out, r, 1e-6)
    rx, ro, rr = fr.ref_rmsnorm_fwd(x, w, 1e-6)
    np.testing.assert_allclose(xhat, rx, **F32_TOL)
    np.testing.assert_allclose(r, rr[:, 0], rtol=3e-6)
    if with_w:
        np.testing.assert_allclose(out, ro, **F32_TOL)
    block = 16
    parts = np.zeros((-(-N // block), D), np.float32)
    gx = np.empty_like(x)
    fr.rmsnorm_bwd(g, xhat, w, r, gx, parts, block)
    rgx, rgw = fr.ref_rmsnorm_bwd(g, xhat, w, r[:, None].astype(np.float64))
    np.testing.assert_allclose(gx, rgx, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(parts.sum(axis=0), rgw, rtol=1e-5, atol=1e-5)
    for k in range(len(parts)):  # each block's partial holds its own rows only
        rows = slice(k * block, (k + 1) * block)
        np.testing.assert_allclose(parts[k], (g[rows].astype(np.float64) * xhat[rows]).sum(0), rtol=1e-5, atol=1e-5)


def test_swiglu_matches_float64_and_saturates():
    a = np.concatenate([_randn(5000, seed=4, scale=4.0), [-200.0, 200.0, 0.0]]).astype(np.float32)
    u, g = _randn(a.size, seed=5), _randn(a.size, seed=6)
    out, da, du = np.empty_like(a), np.empty_like(a), np.empty_like(a)
    fr.swiglu_fwd(a, u, out)
    fr.swiglu_bwd(a, u, g, da, du)
    np.testing.assert_allclose(out, fr.ref_swiglu_fwd(a, u), rtol=1e-5, atol=1e-6)
    rda, rdu = fr.ref_swiglu_bwd(a, u, g)
    np.testing.assert_allclose(da, rda, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(du, rdu, rtol=1e-5, atol=1e-6)
    assert np.isfinite(out).all() and np.isfinite(da).all()


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_rope_matches_float64_and_inverts(sign):
    B, T, H, D = 3, 11, 4, 16
    x = _randn(B, T, H, D, seed=7)
    cos, sin = layers.rope_tables(T, D, 10000.0)
    out = np.empty_like(x)
    fr.rope(x, cos, sin, out, sign)
    np.testing.assert_allclose(out, fr.ref_rope(x, cos, sin, sign), **F32_TOL)
    back = np.empty_like(x)
    fr.rope(out, cos, sin, back, -sign)
    np.testing.assert_allclose(back, x, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("Tq,Tk", [(16, 16), (5, 12), (1, 7), (33, 33)])
def test_causal_softmax_matches_float64(Tq, Tk):
    s = _randn(3, Tq, Tk, seed=8, scale=3.0)
    p = s.copy()
    fr.causal_softmax_fwd(p, Tq, 0.25)
    ref = fr.ref_causal_softmax_fwd(s, Tq, 0.25)
    np.testing.assert_allclose(p, ref, rtol=1e-5, atol=1e-7)
    assert (p[np.broadcast_to(ref == 0, p.shape)] == 0).all()  # masked keys are exactly 0
    dp = _randn(*s.shape, seed=9)
    ds = dp.copy()
    fr.causal_softmax_bwd(p, ds, Tq, 0.25)
    np.testing.assert_allclose(ds, fr.ref_causal_softmax_bwd(p, dp, Tq, 0.25), rtol=1e-5, atol=1e-7)


def test_softmax_rows_match_float64_and_keep_nan():
    x = _randn(9, 300, seed=10, scale=5.0)
    x[4, 7] = np.nan
    e, s, lse = x.copy(), np.empty(9, np.float32), np.empty(9, np.float32)
    fr.softmax_exp_rows(e, s, lse)
    ok = np.arange(9) != 4
    re, rs, rl = fr.ref_softmax_exp_rows(x[ok])
    np.testing.assert_allclose(e[ok], re, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(s[ok], rs[:, 0], rtol=1e-5)
    np.testing.assert_allclose(lse[ok], rl[:, 0], rtol=1e-6, atol=1e-6)
    assert np.isnan(lse[4])  # a NaN logit makes a NaN loss, as on the NumPy path


def test_usable_only_for_float32_numpy_arrays_and_disabled():
    x = np.zeros((4, 4), np.float32)
    assert fr.usable(x, None)
    assert not fr.usable(x.astype(np.float64)) and not fr.usable(x.T) and not fr.usable(x[:, :2])
    with fr.disabled():
        assert not fr.usable(x)
    assert fr.usable(x)


def test_without_a_compiler_the_engine_takes_the_numpy_path(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("XTRAIN_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    monkeypatch.setattr(fr, "_lib", None)
    assert not fr.usable(np.zeros(3, np.float32)) and not fr.available()
    assert "fused CPU kernels unavailable" in capsys.readouterr().err
    m = Model(PRESETS["test"], seed=0)
    ids = _rng(11).integers(0, 64, size=(2, 9))
    assert np.isfinite(m.loss(ids[:, :-1], ids[:, 1:]).item())


def _step_grads(model, ids):
    loss = model.loss(ids[:, :-1], ids[:, 1:])
    model.zero_grad()
    loss.backward()
    return float(loss.item()), {k: p.grad.copy() for k, p in model.named_parameters().items()}


def test_the_model_with_fused_kernels_agrees_with_its_numpy_path():
    cfg = PRESETS["test"].replace(vocab_size=300, max_seq_len=80)
    model = Model(cfg, seed=0)
    ids = _rng(12).integers(0, 300, size=(3, 71))
    loss_f, grads_f = _step_grads(model, ids)
    with fr.disabled():
        loss_n, grads_n = _step_grads(model, ids)
    assert abs(loss_f - loss_n) <= 1e-6 * abs(loss_n)
    for k in grads_n:
        np.testing.assert_allclose(grads_f[k], grads_n[k], rtol=2e-4, atol=2e-6, err_msg=k)


def test_the_fused_step_gives_the_same_bits_with_any_thread_count():
    cfg = PRESETS["test"].replace(vocab_size=300, dim=64, n_heads=4, n_kv_heads=2, head_dim=16, ffn_dim=128,
                                  max_seq_len=140)
    ids = _rng(13).integers(0, 300, size=(5, 131))
    before = cpu_threads.get_threads()
    runs = []
    try:
        for n in (1, 2, 3):
            cpu_threads.set_threads(n)
            runs.append(_step_grads(Model(cfg, seed=0), ids))
    finally:
        cpu_threads.set_threads(before)
    for loss, grads in runs[1:]:
        assert loss == runs[0][0]
        for k in grads:
            assert np.array_equal(grads[k], runs[0][1][k]), k


# ---- causal attention by blocks of queries ------------------------------------------------

def test_query_blocks_cover_the_queries_and_see_the_causal_keys():
    assert attention.query_blocks(10, 10, 4) == [(0, 4, 4), (4, 8, 8), (8, 10, 10)]
    assert attention.query_blocks(3, 8, 2) == [(0, 2, 7), (2, 3, 8)]  # queries are the last 3 positions
    assert attention.query_blocks(128, 128) == [(0, 64, 64), (64, 128, 128)]
    assert len(attention.query_blocks(512, 512)) == 4


@pytest.mark.parametrize("B,Tq,Tk,H,Hkv,D,block", [(2, 13, 13, 4, 2, 8, 4), (1, 9, 14, 3, 1, 6, 2),
                                                    (3, 7, 7, 2, 2, 4, 7), (2, 130, 130, 2, 1, 8, None)])
@pytest.mark.parametrize("fused", [True, False])
def test_blocks_give_the_full_attention(B, Tq, Tk, H, Hkv, D, block, fused):
    q, g = _randn(B, Tq, H, D, seed=14), _randn(B, Tq, H, D, seed=15)
    k, v = _randn(B, Tk, Hkv, D, seed=16), _randn(B, Tk, Hkv, D, seed=17)
    with fr.disabled() if not fused else contextlib.nullcontext():
        out, saved = attention.causal_attention_fwd(q, k, v, block)
        dq, dk, dv = attention.causal_attention_bwd(q, k, v, g, saved)
    q64, k64, v64, g64 = (a.astype(np.float64) for a in (q, k, v, g))
    ref, _ = layers.attention_fwd(q64, k64, v64)  # every score, the upper half masked
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)
    _, one_block = attention.causal_attention_fwd(q64, k64, v64, Tq)  # float64, one block = the full matrix
    rdq, rdk, rdv = attention.causal_attention_bwd(q64, k64, v64, g64, one_block)
    for got, want in ((dq, rdq), (dk, rdk), (dv, rdv)):
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_blocks_gradcheck():
    def blocked(q, k, v):
        out, saved = attention.causal_attention_fwd(q.data, k.data, v.data, 3)
        return make_node(out, (q, k, v), lambda g: attention.causal_attention_bwd(q.data, k.data, v.data, g, saved),
                         "attn")
    q = Tensor(_randn(2, 8, 4, 4, seed=18).astype(np.float64), requires_grad=True)
    k, v = (Tensor(_randn(2, 8, 2, 4, seed=s).astype(np.float64), requires_grad=True) for s in (19, 20))
    assert gradcheck(blocked, [q, k, v])


@pytest.mark.parametrize("wd", [0.1, 0.0])
def test_adamw_gives_the_bits_of_the_numpy_update(wd):
    from xtrain_lessons.runtime.opset.optim import _adamw_update  # noqa: PLC0415

    rng = _rng(21)
    arrays = [rng.standard_normal(10_007).astype(np.float32) for _ in range(3)]
    arrays.append(np.abs(rng.standard_normal(10_007)).astype(np.float32))  # v >= 0
    mine = [a.copy() for a in arrays]
    hyper = (3e-3, 0.9, 0.95, 1e-8, wd, 1 - 0.9 ** 7, (1 - 0.95 ** 7) ** 0.5)
    _adamw_update(*arrays, *hyper)
    assert fr.adamw_arrays([(tuple(mine), hyper + (None,))]) == []
    for want, got in zip(arrays, mine):
        assert np.array_equal(want, got)


def _with_threads(n, fn):
    before = cpu_threads.get_threads()
    cpu_threads.set_threads(n)
    try:
        return fn()
    finally:
        cpu_threads.set_threads(before)


def test_the_pool_gives_the_bits_of_one_thread():
    N, D = 1000, 40
    x, g = _randn(N, D, seed=22), _randn(N, D, seed=23)
    w = _randn(D, seed=24)

    def run():
        xhat, out, r = np.empty_like(x), np.empty_like(x), np.empty(N, np.float32)
        fr.rmsnorm_fwd(x, w, xhat, out, r, 1e-6)
        parts, gx = np.zeros((-(-N // 64), D), np.float32), np.empty_like(x)
        fr.rmsnorm_bwd(g, xhat, w, r, gx, parts, 64)
        a = x.reshape(-1)
        y = np.empty_like(a)
        fr.swiglu_fwd(a, g.reshape(-1), y)
        return out, gx, parts, y

    one = _with_threads(1, run)
    for n in (2, 3, 5):
        for want, got in zip(one, _with_threads(n, run)):
            assert np.array_equal(want, got)
    cuts, parts = _with_threads(3, lambda: fr._cuts(N, D * 4, 64))
    assert parts == 3 and cuts[0] == 0 and cuts[-1] == N and all(c % 64 == 0 for c in cuts[:-1])


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork")
def test_a_forked_child_starts_its_own_workers():
    import os  # noqa: PLC0415

    x = _randn(4096, 64, seed=25)
    xhat, out, r = np.empty_like(x), np.empty_like(x), np.empty(4096, np.float32)
    _with_threads(2, lambda: fr.rmsnorm_fwd(x, None, xhat, out, r, 1e-6))  # the parent's workers exist
    pid = os.fork()
    if pid == 0:  # the child: its pool must not wait for the parent's threads
        try:
            mine = np.empty_like(x)
            _with_threads(2, lambda: fr.rmsnorm_fwd(x, None, mine, out, np.empty_like(r), 1e-6))
            os._exit(0 if np.array_equal(mine, xhat) else 1)
        finally:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_square_attention_is_causal_attention_over_the_whole_square():
    q, k, v = (Tensor(_randn(2, 70, 4, 8, seed=s), requires_grad=True) for s in (26, 27, 28))
    g = _randn(2, 70, 4, 8, seed=29)
    outs = []
    for attn in (layers.causal_attention, layers.square_attention):
        for t in (q, k, v):
            t.grad = None
        y = attn(q, k, v)
        y.backward(g)
        outs.append([y.data, q.grad, k.grad, v.grad])
    for a, b in zip(*outs):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


def test_matmul_chunks_on_the_cpp_pool_are_the_python_pools_calls():
    a, g = _randn(2048, 192, seed=30), _randn(2048, 512, seed=31)
    w = _randn(512, 192, seed=32)
    pairs = ((a, w.T.copy()), (g, w), (g.T, a))  # a linear layer's forward, dx and dW
    runs = {}
    for runner in (fr.gemm_tasks, None):
        cpu_threads.set_gemm_runner(runner)
        try:
            runs[runner] = _with_threads(2, lambda: cpu_threads.matmuls(*pairs))
        finally:
            cpu_threads.set_gemm_runner(fr.gemm_tasks)
    for mine, theirs, (x, y) in zip(runs[fr.gemm_tasks], runs[None], pairs):
        assert np.array_equal(mine, theirs)
        np.testing.assert_allclose(mine, x.astype(np.float64) @ y.astype(np.float64), rtol=1e-4, atol=1e-3)
    assert not fr.gemm_tasks([(a.astype(np.float64), w.T.astype(np.float64), np.empty((2048, 512)))])
    # a transposed view goes to C++ as it is (a linear's dW), cut into the same row chunks: one
    # call for the whole product would be another BLAS kernel's sum on some CPUs (an AMD EPYC's
    # OpenBLAS differs in the last bits between M = 512 and two calls of M = 256)
    dw = np.empty((512, 192), np.float32)
    chunks = [(g.T[lo:hi], a, dw[lo:hi]) for lo, hi in cpu_threads.matmul_chunks(512, 2048, 192)]
    assert fr.gemm_tasks(chunks) and np.array_equal(dw, runs[None][2])


@pytest.mark.parametrize("n", [1 << 16, (1 << 18) + 3])
def test_add_on_the_pool_gives_numpys_bits_in_place_too(n):
    a, b = _randn(n, seed=40, scale=1e3), _randn(n, seed=41)
    want = a + b
    got = _with_threads(2, lambda: fr.add(a, b))
    assert np.array_equal(got, want)
    _with_threads(2, lambda: fr.add(a, b, out=a))  # the backward's `prev += g`
    assert np.array_equal(a, want)
    assert fr.add(a[:100], b[:100]) is None  # small: NumPy's own loop
    assert fr.add(a.astype(np.float64), b.astype(np.float64)) is None
    assert fr.add(a[: n // 2], b[: n // 2 + 1]) is None  # shapes differ: NumPy says why


def test_a_training_step_leaves_no_reference_cycles():
    """Arrays in a cycle wait for the garbage collector: memory held longer, and peaks that move
    from run to run (T13's tracemalloc table). A ctypes array type made per call did that."""
    import gc  # noqa: PLC0415

    model = Model(PRESETS["test"], seed=0)
    ids = _rng(33).integers(0, 64, size=(2, 17))
    was_enabled = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        for _ in range(2):  # the first step may build caches once
            loss = model.loss(ids[:, :-1], ids[:, 1:])
            loss.backward()
            del loss
            found = gc.collect()
        assert found == 0
    finally:
        if was_enabled:
            gc.enable()


def _param_like_arrays(seed):
    shapes = [(300, 64), (64,), (128, 64), (5,), (64, 300), (1,)]
    return [_randn(*s, seed=seed + i) for i, s in enumerate(shapes)]


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_sum_squares_is_float64_close_and_the_same_bits_for_any_thread_count(threads):
    arrays = _param_like_arrays(50)
    got = _with_threads(threads, lambda: fr.sum_squares(arrays))
    want = [np.sum(np.square(a.astype(np.float64))) for a in arrays]
    np.testing.assert_allclose(got, want, rtol=1e-14)
    assert np.array_equal(got, _with_threads(1, lambda: fr.sum_squares(arrays)))
    assert fr.sum_squares([a.astype(np.float64) for a in arrays]) is None


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_scale_arrays_gives_numpys_float32_product(threads):
    arrays = _param_like_arrays(60)
    want = [a * np.float32(0.3) for a in arrays]
    assert _with_threads(threads, lambda: fr.scale_arrays(arrays, 0.3))
    assert all(np.array_equal(a, w) for a, w in zip(arrays, want))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_adamw_arrays_gives_the_bits_of_numpys_update(threads):
    from xtrain_lessons.runtime.opset.optim import _adamw_update

    def state(seed):
        thetas = _param_like_arrays(seed)
        return [(t, _randn(*t.shape, seed=seed + 10 + i), _randn(*t.shape, seed=seed + 20 + i),
                 np.abs(_randn(*t.shape, seed=seed + 30 + i))) for i, t in enumerate(thetas)]

    mine, numpy_ = state(70), state(70)
    hypers = [(1e-3, 0.9, 0.95, 1e-8, 0.1 if a[0].ndim == 2 else 0.0, 1 - 0.9 ** 3, (1 - 0.95 ** 3) ** 0.5, None)
              for a in mine]
    assert _with_threads(threads, lambda: fr.adamw_arrays(list(zip(mine, hypers)))) == []
    for arrays, hyper in zip(numpy_, hypers):
        _adamw_update(*arrays, *hyper)
    for a, b in zip(mine, numpy_):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    where = [(mine[0], hypers[0][:-1] + (np.array(True),))]  # `where`: NumPy's path
    assert fr.adamw_arrays(where) == where


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_scale_rows_and_embedding_backward_give_numpys_bits(threads):
    x, f = _randn(300, 2048, seed=80), _randn(300, 1, seed=81)
    want = x * f
    _with_threads(threads, lambda: fr.scale_rows(x, f))
    assert np.array_equal(x, want)
    V, D = 1000, 48
    ids = _rng(82).integers(0, V, 5000)
    ids[:50] = 7  # one token many times: summed in token order, as np.add.at does
    g = _randn(5000, D, seed=83)
    gw = np.full((V, D), np.nan, np.float32)  # every row written, the unused ones zeroed
    _with_threads(threads, lambda: fr.embedding_bwd(ids.astype(np.int64), g, gw))
    want = np.zeros((V, D), np.float32)
    np.add.at(want, ids, g)
    assert np.array_equal(gw, want)
