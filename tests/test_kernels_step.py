"""The GPU engine's training-step kernels (T07b: rmsnorm, swiglu, rope, softmax rows,
cross-entropy, residual add, embedding backward, gradient norm and clip, scaled AdamW) on the CPU
emulator against their float64 NumPy references, at awkward sizes, for every storage dtype the
launchers take; their launch discipline (no host synchronisation, the stated number of launches)
through the CPU stand-in for CuPy; the same checks on a GPU where there is one (marked `gpu`).
NVRTC compiles every template instantiation in test_nvrtc_compile.py.

Tolerances come from the storage format. A kernel computes in float32 and rounds once on
store, so against the float64 reference of the STORED inputs:
    |got - ref| <= u(dtype) * |ref| + (1 + u) * k * eps32 * scale  (+ half of fp16's subnormal spacing)
with u = half an ulp of the output format (0 for float32, 2^-8 bfloat16, 2^-11 float16),
eps32 = 2^-23 and `scale` the magnitude of the terms the float32 arithmetic combined (the row's
largest |value|, or |a| + |b| for a difference); k counts the float32 roundings, with a margin.
Exact checks where the semantics are exact: masked probabilities and ignored rows are 0, the
residual add and scale_rows are the correctly rounded results, a skipped AdamW step leaves
p, m, v bit for bit, rmsnorm's weight gradient has the same bits for any block size.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from xtrain_lessons import cupy_standin as fake_cupy
from xtrain_lessons.runtime import cuda as cuda_kernels
from xtrain_lessons.runtime import device
from xtrain_lessons.runtime.kernels import cross_entropy as ce
from xtrain_lessons.runtime.kernels import embedding, grad_norm, residual, rmsnorm, rope, softmax, swiglu
from xtrain_lessons.runtime.kernels.adamw import adamw_flat, adamw_flat_graphed, adamw_flat_scaled, \
    adamw_scaled_reference, adamw_step_scalars

F32, BF16, F16 = np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
DTYPES = [F32, BF16, F16]
EPS32 = 2.0 ** -23
HALF_ULP = {F32: 0.0, BF16: 2.0 ** -8, F16: 2.0 ** -11}
TINY = {F32: 0.0, BF16: 0.0, F16: 2.0 ** -25}  # half the spacing of fp16's subnormals
FLT_MIN = 2.0 ** -126  # a float32 intermediate below it is subnormal (a GPU's -ftz flushes it to 0)


def name(dt) -> str:
    return {F32: "f32", BF16: "bf16", F16: "f16"}[np.dtype(dt)]


def _gpu_ok() -> bool:
    return device.gpu_available()


@pytest.fixture(params=["cpu", pytest.param("gpu", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not _gpu_ok(), reason="needs CuPy and an NVIDIA GPU")])])
def dev(request):
    """Where the launchers run: "cpu" (NumPy arrays, the emulator) or "gpu" (CuPy arrays)."""
    return Backend(request.param)


class Backend:
    def __init__(self, kind):
        self.kind = kind
        self.xp = np if kind == "cpu" else device.import_cupy()

    def put(self, a):
        return a if self.kind == "cpu" else self.xp.asarray(a)

    def get(self, a):
        return a if self.kind == "cpu" else self.xp.asnumpy(a)

    def empty(self, shape, dtype, fill=np.nan):
        """An output array, filled with garbage (NaN) so that an unwritten element shows."""
        return self.put(np.full(shape, fill, dtype=np.float32).astype(dtype))


def assert_stored(got, ref, scale, k=8, what="", atol=0.0):
    """|got - ref| <= u(dtype)|ref| + (1 + u) k eps32 scale + tiny + atol (see the module doc)."""
    got = np.asarray(got)
    dt = got.dtype
    g64 = got.astype(np.float64)
    ref = np.broadcast_to(np.asarray(ref, np.float64), got.shape)
    scale = np.broadcast_to(np.asarray(scale, np.float64), got.shape)
    u = HALF_ULP[dt]
    bound = u * np.abs(ref) + (1 + u) * k * EPS32 * scale + TINY[dt] + atol
    err = np.abs(g64 - ref)
    bad = ~(err <= bound)  # NaN fails
    if bad.any():
        i = np.unravel_index(np.argmax(np.where(bad, err - bound, -np.inf)), got.shape)
        raise AssertionError(f"{what} ({dt}): {bad.sum()} of {got.size} outside the bound; at {i}: got "
                             f"{g64[i]!r}, ref {ref[i]!r}, |err| {err[i]:.3g} > bound {bound[i]:.3g}")


def row_max(a):
    """max |a| over the last axis, kept for broadcasting."""
    return np.abs(np.asarray(a, np.float64)).max(axis=-1, keepdims=True)


def randn(rng, shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32).astype(dtype)


# ------------------------------------------------------------------ rmsnorm
def _rms_inputs(rng, N, D, X):
    x = rng.standard_normal((N, D)) * np.exp(rng.uniform(-2, 2, (N, 1)))  # rows of very different sizes
    x[0] = 0.0          # r = 1 / sqrt(eps)
    x[1] *= 1e-3        # mean(x^2) ~ eps: the eps placement matters
    return x.astype(np.float32).astype(X)


@pytest.mark.parametrize("with_w", [True, False], ids=["w", "no_w"])
@pytest.mark.parametrize("N,D", [(37, 48), (5, 1100)])
@pytest.mark.parametrize("X,Y", rmsnorm.PAIRS, ids=lambda d: name(d))
def test_rmsnorm_fwd(dev, X, Y, N, D, with_w):
    rng = np.random.default_rng(N * D)
    x = _rms_inputs(rng, N, D, X)
    w = (1 + 0.5 * rng.standard_normal(D)).astype(np.float32) if with_w else None
    eps = 1e-5
    xhat, out, r = dev.empty((N, D), Y), dev.empty((N, D), Y), dev.empty((N,), F32)
    rmsnorm.rmsnorm_fwd(dev.put(x), None if w is None else dev.put(w), xhat, out if with_w else None, r, eps)
    xh_ref, out_ref, r_ref = rmsnorm.rmsnorm_fwd_reference(x, w, eps)
    assert_stored(dev.get(r), r_ref[:, 0], r_ref[:, 0], what="r")
    assert_stored(dev.get(xhat), xh_ref, row_max(xh_ref), what="xhat")
    if with_w:
        assert_stored(dev.get(out), out_ref, row_max(out_ref), what="out")
    else:
        assert np.isnan(dev.get(out).astype(np.float32)).all()  # not written


def _rms_bwd_inputs(rng, N, D, X, Y):
    x = _rms_inputs(rng, N, D, X)
    w = (1 + 0.5 * rng.standard_normal(D)).astype(np.float32)
    xhat, out, r = np.empty((N, D), Y), np.empty((N, D), Y), np.empty(N, np.float32)
    rmsnorm.rmsnorm_fwd(x, w, xhat, out, r, 1e-5)
    return xhat, w, r, randn(rng, (N, D), Y)


@pytest.mark.parametrize("with_w", [True, False], ids=["w", "no_w"])
@pytest.mark.parametrize("N,D", [(37, 48), (5, 1100)])
@pytest.mark.parametrize("X,Y", rmsnorm.PAIRS, ids=lambda d: name(d))
def test_rmsnorm_bwd(dev, X, Y, N, D, with_w):
    rng = np.random.default_rng(N + D)
    xhat, w, r, g = _rms_bwd_inputs(rng, N, D, X, Y)
    w = w if with_w else None
    gx, gw = dev.empty((N, D), X), dev.empty((D,), F32)
    rmsnorm.rmsnorm_bwd(dev.put(g), dev.put(xhat), None if w is None else dev.put(w), dev.put(r), gx, gw)
    gx_ref, gw_ref = rmsnorm.rmsnorm_bwd_reference(g, xhat, w, r)
    g64, h64 = g.astype(np.float64), xhat.astype(np.float64)
    gh = g64 * (w if w is not None else 1.0)
    d = (gh * h64).mean(axis=-1, keepdims=True)
    terms = r.astype(np.float64)[:, None] * (np.abs(gh) + np.abs(h64 * d))  # gx = r * (gh - xhat * d)
    assert_stored(dev.get(gx), gx_ref, row_max(terms), what="gx")
    assert_stored(dev.get(gw), gw_ref, np.abs(g64 * h64).sum(axis=0), what="gw")


def _gw_in_kernel_order(g, xhat):
    """The documented summation order in float32: column sums over blocks of GW_ROWS rows, row by
    row, then the partial sums in block order."""
    g32, h32 = g.astype(np.float32), xhat.astype(np.float32)
    total = np.zeros(g.shape[1], np.float32)
    for k in range(0, len(g), rmsnorm.GW_ROWS):
        acc = np.zeros(g.shape[1], np.float32)
        for row in range(k, min(len(g), k + rmsnorm.GW_ROWS)):
            acc = acc + g32[row] * h32[row]
        total = total + acc
    return total


@pytest.mark.parametrize("X,Y", [(F32, F32), (F32, BF16)], ids=lambda d: name(d))
def test_rmsnorm_gw_is_deterministic_for_any_block_size(dev, X, Y):
    N, D = 100, 300  # 4 blocks of rows, the last one partial
    xhat, w, r, g = _rms_bwd_inputs(np.random.default_rng(7), N, D, X, Y)
    results = []
    for threads in (32, 64, 256, 1024):
        gw = dev.empty((D,), F32)
        gx = dev.empty((N, D), X) if threads != 64 else None  # with and without gx
        rmsnorm.rmsnorm_bwd(dev.put(g), dev.put(xhat), dev.put(w), dev.put(r), gx, gw, threads=threads)
        results.append(dev.get(gw))
    for other in results[1:]:
        np.testing.assert_array_equal(other, results[0])
    # the kernel rounds each product and sum (__fmul_rn, __fadd_rn): no FMA, the same bits everywhere
    np.testing.assert_array_equal(results[0], _gw_in_kernel_order(g, xhat))


def test_rmsnorm_bwd_gw_only_and_gx_only(dev):
    N, D = 37, 48
    xhat, w, r, g = _rms_bwd_inputs(np.random.default_rng(3), N, D, F32, F32)
    gx_ref, gw_ref = rmsnorm.rmsnorm_bwd_reference(g, xhat, w, r)
    both_gx, both_gw = dev.empty((N, D), F32), dev.empty((D,), F32)
    rmsnorm.rmsnorm_bwd(dev.put(g), dev.put(xhat), dev.put(w), dev.put(r), both_gx, both_gw)
    gw = dev.empty((D,), F32)
    rmsnorm.rmsnorm_bwd(dev.put(g), dev.put(xhat), dev.put(w), dev.put(r), None, gw)
    np.testing.assert_array_equal(dev.get(gw), dev.get(both_gw))
    gx = dev.empty((N, D), F32)
    rmsnorm.rmsnorm_bwd(dev.put(g), dev.put(xhat), dev.put(w), dev.put(r), gx, None)
    np.testing.assert_array_equal(dev.get(gx), dev.get(both_gx))


# ------------------------------------------------------------------ swiglu
def _gate(rng, n, dt):
    a = rng.standard_normal(n) * 4
    a[:6] = [-1000.0, -100.0, -30.0, 30.0, 100.0, 1000.0]  # exp(-a) overflows a naive sigmoid
    return a.astype(np.float32).astype(dt)


@pytest.mark.parametrize("dt", DTYPES, ids=name)
def test_swiglu(dev, dt):
    rng = np.random.default_rng(5)
    shape = (37, 29)  # 1073 elements: a partial last block
    a = _gate(rng, 37 * 29, dt).reshape(shape)
    u, g = randn(rng, shape, dt), randn(rng, shape, dt)
    out = dev.empty(shape, dt)
    swiglu.swiglu_fwd(dev.put(a), dev.put(u), out)
    ref = swiglu.swiglu_fwd_reference(a, u)
    a64, u64, g64 = (v.astype(np.float64) for v in (a, u, g))
    # relative, but the sigmoid of a < -87 is subnormal in float32 (or flushed to 0 on a GPU)
    assert_stored(dev.get(out), ref, np.abs(ref), what="out", atol=FLT_MIN * np.abs(a64 * u64))
    da, du = dev.empty(shape, dt), dev.empty(shape, dt)
    swiglu.swiglu_bwd(dev.put(a), dev.put(u), dev.put(g), da, du)
    da_ref, du_ref = swiglu.swiglu_bwd_reference(a, u, g)
    with np.errstate(over="ignore"):
        s = 1 / (1 + np.exp(-a64))
    da_scale = np.abs(g64 * u64 * s) * (1 + np.abs(a64 * (1 - s)))
    assert_stored(dev.get(du), du_ref, np.abs(du_ref), what="du", atol=FLT_MIN * np.abs(g64 * a64))
    assert_stored(dev.get(da), da_ref, da_scale, k=16, what="da",  # 1 - s and 1 + a(1 - s) round too
                  atol=FLT_MIN * np.abs(g64 * u64) * (1 + np.abs(a64)))


# ------------------------------------------------------------------ rope
def _cos_sin(T, D):
    inv = 1.0 / (10000.0 ** (np.arange(0, D, 2) / D))
    ang = np.arange(T)[:, None] * inv[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


@pytest.mark.parametrize("dt", DTYPES, ids=name)
def test_rope(dev, dt):
    B, T, H, D = 2, 19, 4, 8
    rng = np.random.default_rng(11)
    x = randn(rng, (B, T, H, D), dt)
    cos, sin = _cos_sin(T, D)
    x64 = np.abs(x.astype(np.float64))
    scale = x64 * np.abs(cos)[:, None, :] + np.concatenate([x64[..., D // 2:], x64[..., :D // 2]], -1) \
        * np.abs(sin)[:, None, :]
    for sign in (-1.0, 1.0):
        out_of_place = dev.empty(x.shape, dt)
        rope.rope(dev.put(x), dev.put(cos), dev.put(sin), out_of_place, sign)
        assert_stored(dev.get(out_of_place), rope.rope_reference(x, cos, sin, sign), scale, k=4,
                      what=f"sign {sign}")
    # in place gives the out-of-place bits; the inverse rotation undoes the rotation (float32)
    y = dev.put(x.copy())
    rope.rope(y, dev.put(cos), dev.put(sin), y)
    np.testing.assert_array_equal(dev.get(y), dev.get(out_of_place))
    if dt == F32:
        rope.rope(y, dev.put(cos), dev.put(sin), y, -1.0)
        # two rotations, each mixing the pair: errors relative to the head's largest |x|
        assert_stored(dev.get(y), x.astype(np.float64), row_max(x), k=8, what="round trip")


# ------------------------------------------------------------------ softmax rows
CAUSAL_SHAPES = [((2, 3, 7, 11), 7), ((1, 2, 5, 1100), 5), ((4, 6, 6), 6)]  # (shape of s, Tq): Tq < Tk and =


def _mask(shape, Tq):
    Tk = shape[-1]
    q = np.arange(int(np.prod(shape[:-1]))) % Tq
    return (np.arange(Tk)[None, :] <= (Tk - Tq + q)[:, None]).reshape(shape)


@pytest.mark.parametrize("shape,Tq", CAUSAL_SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("dt", DTYPES, ids=name)
def test_causal_softmax(dev, dt, shape, Tq):
    rng = np.random.default_rng(sum(shape))
    scale = 1 / math.sqrt(8)
    s = randn(rng, shape, dt, scale=3.0)
    seen = _mask(shape, Tq)
    p = dev.put(s.copy())
    softmax.causal_softmax_fwd(p, Tq, scale)
    p_ref = softmax.causal_softmax_fwd_reference(s, Tq, scale)
    got = dev.get(p)
    assert (got[~seen] == 0).all() and not np.signbit(got[~seen].astype(np.float32)).any()  # exactly +0
    # exp of an argument with absolute error ~eps |s * scale - max|: k grows with that magnitude
    arg = np.abs(s.astype(np.float64) * scale).max() * 2
    assert_stored(got, p_ref, row_max(p_ref), k=8 + arg, what="p")

    dp = randn(rng, shape, dt)
    p_in = p_ref.astype(np.float32).astype(dt)
    ds = dev.put(dp.copy())
    softmax.causal_softmax_bwd(dev.put(p_in), ds, Tq, scale)
    ds_ref = softmax.causal_softmax_bwd_reference(p_in, dp, Tq, scale)
    got = dev.get(ds)
    assert (got[~seen] == 0).all()
    p64, d64 = p_in.astype(np.float64), dp.astype(np.float64)
    c = (np.where(seen, p64 * d64, 0)).sum(-1, keepdims=True)
    terms = p64 * (np.abs(d64) + np.abs(c)) * scale
    assert_stored(got, ds_ref, row_max(terms), what="dS")


@pytest.mark.parametrize("V", [300, 1100])
@pytest.mark.parametrize("dt", DTYPES, ids=name)
def test_softmax_exp_rows_and_scale_rows(dev, dt, V):
    N = 37
    rng = np.random.default_rng(V)
    x = randn(rng, (N, V), dt, scale=4.0)
    y, s, lse = dev.put(x.copy()), dev.empty((N,), F32), dev.empty((N, 1), F32)
    softmax.softmax_exp_rows(y, s, lse)
    e_ref, s_ref, lse_ref = softmax.softmax_exp_rows_reference(x)
    arg = 2 * np.abs(x.astype(np.float64)).max()  # |x - max| bounds exp's argument
    assert_stored(dev.get(y), e_ref, 1.0, k=8 + arg, what="e")
    assert_stored(dev.get(s), s_ref[:, 0], s_ref[:, 0], k=16 + arg, what="s")  # a sum of V exps
    assert_stored(dev.get(lse), lse_ref, np.abs(lse_ref) + np.abs(x.astype(np.float64)).max(-1, keepdims=True),
                  k=16 + arg, what="lse")

    f = rng.uniform(-2, 2, N).astype(np.float32)
    z = dev.put(x.copy())
    softmax.scale_rows(z, dev.put(f))
    exact = (x.astype(np.float32) * f[:, None]).astype(dt)  # one float32 product, one rounding
    np.testing.assert_array_equal(dev.get(z), exact)


# ------------------------------------------------------------------ cross-entropy
def _targets(rng, N, V):
    t = rng.integers(0, V, N).astype(np.int64)
    t[[2, 5, 11]] = ce.IGNORE_INDEX
    t[0], t[1] = 0, V - 1
    return t


@pytest.mark.parametrize("V", [300, 1100])
@pytest.mark.parametrize("dt", DTYPES, ids=name)
def test_cross_entropy(dev, dt, V):
    N = 37
    rng = np.random.default_rng(V + 1)
    logits = randn(rng, (N, V), dt, scale=4.0)
    t = _targets(rng, N, V)
    valid = t != ce.IGNORE_INDEX
    e, s, lse, losses = dev.put(logits.copy()), dev.empty((N,), F32), dev.empty((N,), F32), dev.empty((N,), F32)
    ce.cross_entropy_fwd(e, dev.put(t), s, lse, losses)
    e_ref, s_ref, lse_ref, loss_ref = ce.cross_entropy_fwd_reference(logits, t)
    arg = 2 * np.abs(logits.astype(np.float64)).max()
    assert_stored(dev.get(e), e_ref, 1.0, k=8 + arg, what="e")
    assert_stored(dev.get(s), s_ref, s_ref, k=16 + arg, what="s")
    x_t = np.abs(logits.astype(np.float64)[np.arange(N), np.where(valid, t, 0)])
    assert_stored(dev.get(lse), lse_ref, np.abs(lse_ref) + row_max(logits)[:, 0], k=16 + arg, what="lse")
    assert_stored(dev.get(losses), loss_ref, np.abs(lse_ref) + x_t + row_max(logits)[:, 0], k=16 + arg,
                  what="losses")
    assert (dev.get(losses)[~valid] == 0).all()

    e_stored, s_stored = dev.get(e).copy(), dev.get(s).copy()
    inv_count = 1.0 / valid.sum()
    for dloss in (np.array([0.7], np.float32), np.array(1.3, np.float32)):  # shape (1,) and ()
        d = dev.put(e_stored.copy())
        ce.cross_entropy_bwd(d, dev.put(s_stored), dev.put(t), dev.put(dloss), inv_count)
        d_ref = ce.cross_entropy_bwd_reference(e_stored, s_stored, t, dloss, inv_count)
        got = dev.get(d)
        assert (got[~valid] == 0).all()
        f = float(dloss.reshape(-1)[0]) * inv_count
        assert_stored(got, d_ref, (e_stored.astype(np.float64) / s_stored[:, None] + 1) * f, k=8, what="dlogits")

    mean = dev.empty((), F32)
    ce.mean_loss(losses, inv_count, mean)
    ref = ce.mean_loss_reference(dev.get(losses), inv_count)
    assert_stored(np.asarray(dev.get(mean)), ref, np.abs(dev.get(losses)).sum() * inv_count, k=16, what="mean")


def test_cross_entropy_gradient_is_softmax_minus_onehot(dev):
    """fwd then bwd against d/dlogits of the mean loss, computed from the logits in float64."""
    N, V = 37, 300
    rng = np.random.default_rng(0)
    logits = randn(rng, (N, V), F32, scale=3.0)
    t = _targets(rng, N, V)
    valid = t != ce.IGNORE_INDEX
    x = logits.astype(np.float64)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    p[np.arange(N)[valid], t[valid]] -= 1
    grad = np.where(valid[:, None], p / valid.sum(), 0.0)
    e, s = dev.put(logits.copy()), dev.empty((N,), F32)
    lse, losses = dev.empty((N,), F32), dev.empty((N,), F32)
    ce.cross_entropy_fwd(e, dev.put(t), s, lse, losses)
    ce.cross_entropy_bwd(e, s, dev.put(t), dev.put(np.ones(1, np.float32)), 1.0 / valid.sum())
    assert_stored(dev.get(e), grad, 1.0 / valid.sum(), k=8 + 2 * np.abs(x).max(), what="dlogits")


def test_cross_entropy_out_of_range_target_gives_nan(dev):
    N, V = 4, 50
    logits = randn(np.random.default_rng(1), (N, V), F32)
    t = np.array([3, V, -1, ce.IGNORE_INDEX], np.int64)
    e, s, lse, losses = dev.put(logits.copy()), dev.empty((N,), F32), dev.empty((N,), F32), dev.empty((N,), F32)
    ce.cross_entropy_fwd(e, dev.put(t), s, lse, losses)
    got = dev.get(losses)
    assert np.isfinite(got[0]) and np.isnan(got[1]) and np.isnan(got[2]) and got[3] == 0


# ------------------------------------------------------------------ residual add
@pytest.mark.parametrize("dt", DTYPES, ids=name)
def test_residual_add_is_correctly_rounded(dev, dt):
    rng = np.random.default_rng(2)
    a, b = randn(rng, (37, 29), dt), randn(rng, (37, 29), dt, scale=1e-2)
    exact = (a.astype(np.float32) + b.astype(np.float32)).astype(dt)  # float32 holds the 16-bit sums exactly
    out = dev.empty(a.shape, dt)
    residual.add(dev.put(a), dev.put(b), out)
    np.testing.assert_array_equal(dev.get(out), exact)
    assert_stored(dev.get(out), residual.add_reference(a, b), np.abs(residual.add_reference(a, b)), k=1, what="add")
    y = dev.put(a.copy())
    residual.add(y, dev.put(b), y)  # out = a, in place
    np.testing.assert_array_equal(dev.get(y), exact)


# ------------------------------------------------------------------ embedding backward
@pytest.mark.parametrize("dt", DTYPES, ids=name)
def test_embedding_bwd(dev, dt):
    N, D, V = 37, 48, 50
    rng = np.random.default_rng(4)
    ids = rng.integers(0, 12, N).astype(np.int64)  # many repeats
    ids[0] = V - 1
    g = randn(rng, (N, D), dt)
    gw = dev.empty((V, D), F32)  # NaN: the launcher zeroes it
    embedding.embedding_bwd(dev.put(ids), dev.put(g), gw)
    ref = embedding.embedding_bwd_reference(ids, g, V)
    scale = embedding.embedding_bwd_reference(ids, np.abs(g.astype(np.float64)), V)
    assert_stored(dev.get(gw), ref, scale, k=N, what="gw")  # up to N float32 additions in any order
    got = dev.get(gw)
    assert (got[np.setdiff1d(np.arange(V), ids)] == 0).all()


def test_embedding_backward_int32_kernels_unchanged():
    """T02's kernels still run as before beside the new template."""
    ids = np.array([[1, 2], [2, 0]])
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    np.testing.assert_array_equal(embedding.embedding_forward(ids, w), w[ids])
    dout = np.ones((2, 2, 4), np.float32)
    np.testing.assert_array_equal(embedding.embedding_backward(ids, dout, 3),
                                  embedding.embedding_backward_reference(ids, dout, 3))


# ------------------------------------------------------------------ gradient norm and clip
NORM_CASES = {  # name: (values, max_norm, inv_scale)
    "clip": (lambda g: g, 1.0, 1.0),
    "no_clip_needed": (lambda g: g, 1e6, 1.0),
    "max_norm_none": (lambda g: g, None, 1.0),
    "max_norm_zero": (lambda g: g, 0.0, 1.0),
    "fp16_scaled": (lambda g: g * 1024, 1.0, 1.0 / 1024),
    "inf": (lambda g: np.where(np.arange(g.size) == 77777, np.inf, g).astype(np.float32), 1.0, 1.0 / 1024),
    "nan": (lambda g: np.where(np.arange(g.size) == 5, np.nan, g).astype(np.float32), 1.0, 1.0),
}


def test_grad_norm_partials_match_their_reference(dev):
    """The stand-in's end-to-end runs use this reference for the first launch (every block's sum)."""
    n = 300_001
    g = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    partials = dev.empty((grad_norm.NORM_GRID,), np.float64)
    first = grad_norm.kernel(grad_norm._FILE, "grad_norm_partials", grad_norm._NAMES, dev.xp)
    first((grad_norm.NORM_GRID,), (grad_norm.NORM_BLOCK,), (dev.put(g), np.int64(n), partials))
    ref = grad_norm.grad_norm_partials_reference(g)
    np.testing.assert_allclose(dev.get(partials), ref, rtol=1e-13, atol=0)  # double sums in two orders
    assert np.sum(ref) == pytest.approx(float(np.sum(np.float64(g) ** 2)), rel=1e-13)


@pytest.mark.parametrize("case", list(NORM_CASES))
def test_global_norm_and_clip(dev, case):
    make, max_norm, inv_scale = NORM_CASES[case]
    n = 300_001  # > 256 * 256: every thread strides, the last block partial
    g = make(np.random.default_rng(9).standard_normal(n).astype(np.float32) * 0.01)
    out = dev.empty((3,), F32)
    grad_norm.global_norm_and_clip(dev.put(g), None, out, max_norm, 1e-6, inv_scale)
    got, ref = dev.get(out), grad_norm.global_norm_and_clip_reference(g, max_norm, 1e-6, inv_scale)
    assert got[2] == ref[2]
    if ref[2]:
        assert not np.isfinite(got[0]) and got[1] == np.float32(inv_scale)  # coef 1: nothing clipped
        assert (np.isnan(got[0]) == np.isnan(ref[0]))
    else:
        np.testing.assert_allclose(got[:2], ref[:2], rtol=2 * EPS32, atol=0)  # double sums, one float32 rounding
    if case in ("no_clip_needed", "max_norm_none", "max_norm_zero"):
        assert got[1] == np.float32(inv_scale)
    if case == "clip":
        assert got[1] < 1


def test_global_norm_matches_optim_clip_grad_norm():
    """The same norm and coefficient as training/optim.py's clip_grad_norm (the host rule)."""
    from xtrain_lessons.training.optim import clip_grad_norm

    class P:
        def __init__(self, g):
            self.grad = g

    rng = np.random.default_rng(0)
    grads = [rng.standard_normal(n).astype(np.float32) for n in (1000, 37, 4096)]
    flat = np.concatenate(grads)
    out = np.empty(3, np.float32)
    grad_norm.global_norm_and_clip(flat, np.empty(grad_norm.NORM_GRID), out, 2.0)
    params = [P(g.copy()) for g in grads]
    norm = clip_grad_norm(params, 2.0)
    np.testing.assert_allclose(out[0], norm, rtol=2 * EPS32)
    np.testing.assert_allclose(np.concatenate([p.grad for p in params]), flat * out[1], rtol=2 * EPS32, atol=0)


def test_global_norm_is_deterministic():
    g = np.random.default_rng(1).standard_normal(100_003).astype(np.float32)
    outs = []
    for _ in range(3):
        out = np.empty(3, np.float32)
        grad_norm.global_norm_and_clip(g, None, out, 1.0)
        outs.append(out)
    for o in outs[1:]:
        np.testing.assert_array_equal(o, outs[0])


# ------------------------------------------------------------------ scaled AdamW
def _adam_state(n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32),
            (rng.standard_normal(n) * 0.1).astype(np.float32), rng.uniform(0, 0.1, n).astype(np.float32))


HYPER = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


@pytest.mark.parametrize("n,n_decay", [(1, 1), (1000, 777), (4099, 4099)])
def test_adamw_scaled_equals_reference(dev, n, n_decay):
    p, g, m, v = _adam_state(n)
    factors = np.array([3.0, 0.37, 0.0], np.float32)
    q, m2, v2 = p.copy(), m.copy(), v.copy()
    P, M, Vv = dev.put(p.copy()), dev.put(m.copy()), dev.put(v.copy())
    for step in (1, 2, 3):
        adamw_flat_scaled(P, dev.put(g), M, Vv, dev.put(factors), step, n_decay=n_decay, **HYPER)
        adamw_scaled_reference(q, g, m2, v2, factors, step, n_decay=n_decay, **HYPER)
    # float32 to rounding (a GPU may fuse multiply-adds), as tests/test_kernels_adamw.py
    np.testing.assert_allclose(dev.get(P), q, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(dev.get(M), m2, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(dev.get(Vv), v2, rtol=2e-6, atol=1e-9)


def test_adamw_scaled_with_factor_one_is_adamw_step_bit_for_bit():
    p, g, m, v = _adam_state(1000, seed=1)
    a = [x.copy() for x in (p, m, v)]
    adamw_flat(a[0], g, a[1], a[2], 2, n_decay=500, **HYPER)
    b = [x.copy() for x in (p, m, v)]
    adamw_flat_scaled(b[0], g, b[1], b[2], np.array([5.0, 1.0, 0.0], np.float32), 2, n_decay=500, **HYPER)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_adamw_graphed_is_adamw_scaled_bit_for_bit(dev):
    """The step's scalars read from device memory (what a CUDA graph replays) give the same bits
    as passed by value, step after step, with a schedule's changing lr."""
    p, g, m, v = _adam_state(4099, seed=4)
    factors = dev.put(np.array([3.0, 0.37, 0.0], np.float32))
    a = [dev.put(x.copy()) for x in (p, m, v)]
    b = [dev.put(x.copy()) for x in (p, m, v)]
    hyper = dict(HYPER)
    for step, lr in ((1, 1e-2), (2, 7e-3), (3, 3e-3)):
        hyper["lr"] = lr
        adamw_flat_scaled(a[0], dev.put(g), a[1], a[2], factors, step, n_decay=3000, **hyper)
        scalars = dev.put(adamw_step_scalars(step, lr, hyper["betas"], hyper["weight_decay"]))
        adamw_flat_graphed(b[0], dev.put(g), b[1], b[2], factors, scalars, hyper["betas"], hyper["eps"], 3000)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(dev.get(x).view(np.uint32), dev.get(y).view(np.uint32))


def test_adamw_scaled_skips_the_step_on_found_inf(dev):
    p, g, m, v = _adam_state(1000, seed=2)
    g[3] = np.inf
    P, M, Vv = dev.put(p.copy()), dev.put(m.copy()), dev.put(v.copy())
    out = dev.empty((3,), F32)
    grad_norm.global_norm_and_clip(dev.put(g), None, out, 1.0, inv_scale=1 / 65536)
    adamw_flat_scaled(P, dev.put(g), M, Vv, out, 5, **HYPER)
    for before, after in ((p, P), (m, M), (v, Vv)):
        np.testing.assert_array_equal(dev.get(after).view(np.uint32), before.view(np.uint32))


def test_norm_clip_and_scaled_adamw_end_to_end(dev):
    """grad_norm's out feeds adamw_flat_scaled: the same as clipping on the host, then AdamW."""
    p, g, m, v = _adam_state(5000, seed=3)
    g *= 256  # fp16-style loss scale 256, clipped to max_norm 1
    out = dev.empty((3,), F32)
    P, M, Vv = dev.put(p.copy()), dev.put(m.copy()), dev.put(v.copy())
    grad_norm.global_norm_and_clip(dev.put(g), None, out, 1.0, inv_scale=1 / 256)
    adamw_flat_scaled(P, dev.put(g), M, Vv, out, 1, **HYPER)
    ref = grad_norm.global_norm_and_clip_reference(g, 1.0, 1e-6, 1 / 256)
    q, m2, v2 = p.copy(), m.copy(), v.copy()
    adamw_scaled_reference(q, g, m2, v2, ref, 1, **HYPER)
    np.testing.assert_allclose(dev.get(P), q, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(g.astype(np.float64) * dev.get(out)[1]), 1.0, rtol=1e-5)


# ------------------------------------------------------------------ argument checks
def _f32(*shape):
    return np.zeros(shape, np.float32)


BAD_CALLS = {  # id: (call, exception, the argument the message must name)
    "rmsnorm_fwd x dtype": (lambda: rmsnorm.rmsnorm_fwd(np.zeros((4, 8)), None, _f32(4, 8), None, _f32(4), 1e-6),
                            TypeError, "x"),
    "rmsnorm_fwd w shape": (lambda: rmsnorm.rmsnorm_fwd(_f32(4, 8), _f32(7), _f32(4, 8), _f32(4, 8), _f32(4), 1e-6),
                            ValueError, "w"),
    "rmsnorm_fwd r shape": (lambda: rmsnorm.rmsnorm_fwd(_f32(4, 8), None, _f32(4, 8), None, _f32(5), 1e-6),
                            ValueError, "r"),
    "rmsnorm_fwd out is xhat": (lambda: (lambda xh: rmsnorm.rmsnorm_fwd(_f32(4, 8), _f32(8), xh, xh, _f32(4), 1e-6))(
        _f32(4, 8)), ValueError, "out"),
    "rmsnorm_fwd pair": (lambda: rmsnorm.rmsnorm_fwd(_f32(4, 8).astype(F16), None, _f32(4, 8).astype(BF16), None,
                                                     _f32(4), 1e-6), TypeError, "xhat"),
    "rmsnorm_bwd gw dtype": (lambda: rmsnorm.rmsnorm_bwd(_f32(4, 8), _f32(4, 8), None, _f32(4), None,
                                                         np.zeros(8, np.float16)), TypeError, "gw"),
    "rmsnorm_bwd xhat shape": (lambda: rmsnorm.rmsnorm_bwd(_f32(4, 8), _f32(4, 9), None, _f32(4), _f32(4, 8), None),
                               ValueError, "xhat"),
    "swiglu_fwd u dtype": (lambda: swiglu.swiglu_fwd(_f32(10), _f32(10).astype(F16), _f32(10)), TypeError, "u"),
    "swiglu_bwd du shape": (lambda: swiglu.swiglu_bwd(_f32(10), _f32(10), _f32(10), _f32(10), _f32(11)),
                            ValueError, "du"),
    "swiglu_fwd a float64": (lambda: swiglu.swiglu_fwd(np.zeros(10), np.zeros(10), np.zeros(10)), TypeError, "a"),
    "rope cos dtype": (lambda: rope.rope(_f32(1, 3, 2, 4), np.zeros((3, 4)), _f32(3, 4), _f32(1, 3, 2, 4)),
                       TypeError, "cos"),
    "rope sin shape": (lambda: rope.rope(_f32(1, 3, 2, 4), _f32(3, 4), _f32(2, 4), _f32(1, 3, 2, 4)),
                       ValueError, "sin"),
    "rope odd D": (lambda: rope.rope(_f32(1, 3, 2, 5), _f32(3, 5), _f32(3, 5), _f32(1, 3, 2, 5)), ValueError, "x"),
    "causal_softmax_fwd s dtype": (lambda: softmax.causal_softmax_fwd(np.zeros((2, 4)), 2, 1.0), TypeError, "s"),
    "causal_softmax_fwd Tq": (lambda: softmax.causal_softmax_fwd(_f32(2, 4), 5, 1.0), ValueError, "Tq"),
    "causal_softmax_bwd dp dtype": (lambda: softmax.causal_softmax_bwd(_f32(2, 4), _f32(2, 4).astype(BF16), 2, 1.0),
                                    TypeError, "dp"),
    "softmax_exp_rows lse shape": (lambda: softmax.softmax_exp_rows(_f32(3, 5), _f32(3), _f32(4)), ValueError, "lse"),
    "softmax_exp_rows s dtype": (lambda: softmax.softmax_exp_rows(_f32(3, 5), _f32(3).astype(F16), _f32(3)),
                                 TypeError, "s"),
    "scale_rows f shape": (lambda: softmax.scale_rows(_f32(3, 5), _f32(5)), ValueError, "f"),
    "cross_entropy_fwd targets dtype": (lambda: ce.cross_entropy_fwd(_f32(3, 5), np.zeros(3, np.int32), _f32(3),
                                                                     _f32(3), _f32(3)), TypeError, "targets"),
    "cross_entropy_fwd losses shape": (lambda: ce.cross_entropy_fwd(_f32(3, 5), np.zeros(3, np.int64), _f32(3),
                                                                    _f32(3), _f32(4)), ValueError, "losses"),
    "cross_entropy_bwd dloss shape": (lambda: ce.cross_entropy_bwd(_f32(3, 5), _f32(3), np.zeros(3, np.int64),
                                                                   _f32(2), 1.0), ValueError, "dloss"),
    "cross_entropy_bwd dloss dtype": (lambda: ce.cross_entropy_bwd(_f32(3, 5), _f32(3), np.zeros(3, np.int64),
                                                                   np.ones(1), 1.0), TypeError, "dloss"),
    "mean_loss out shape": (lambda: ce.mean_loss(_f32(3), 1.0, _f32(2)), ValueError, "out"),
    "add b dtype": (lambda: residual.add(_f32(4), _f32(4).astype(BF16), _f32(4)), TypeError, "b"),
    "add out shape": (lambda: residual.add(_f32(4), _f32(4), _f32(5)), ValueError, "out"),
    "embedding_bwd ids dtype": (lambda: embedding.embedding_bwd(np.zeros(3, np.int32), _f32(3, 4), _f32(5, 4)),
                                TypeError, "ids"),
    "embedding_bwd gw shape": (lambda: embedding.embedding_bwd(np.zeros(3, np.int64), _f32(3, 4), _f32(5, 3)),
                               ValueError, "gw"),
    "global_norm partials dtype": (lambda: grad_norm.global_norm_and_clip(_f32(10), _f32(256), _f32(3), 1.0),
                                   TypeError, "partials"),
    "global_norm out shape": (lambda: grad_norm.global_norm_and_clip(_f32(10), None, _f32(2), 1.0),
                              ValueError, "out"),
    "adamw_flat_scaled factors shape": (lambda: adamw_flat_scaled(_f32(4), _f32(4), _f32(4), _f32(4), _f32(2), 1,
                                                                  1e-3), ValueError, "factors"),
    "adamw_flat_graphed step_scalars shape": (lambda: adamw_flat_graphed(_f32(4), _f32(4), _f32(4), _f32(4), _f32(3),
                                                                          _f32(2)), ValueError, "step_scalars"),
    "adamw_flat_scaled v dtype": (lambda: adamw_flat_scaled(_f32(4), _f32(4), _f32(4), np.zeros(4), _f32(3), 1, 1e-3),
                                  TypeError, "v"),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_arguments_are_named(case):
    call, exc, arg = BAD_CALLS[case]
    with pytest.raises(exc, match=rf"\b{arg}\b"):
        call()


def test_non_contiguous_is_refused():
    x = _f32(8, 8)[:, ::2]
    with pytest.raises(ValueError, match=r"\bx\b.*C-contiguous"):
        rmsnorm.rmsnorm_fwd(x, None, _f32(8, 4), None, _f32(8), 1e-6)


# ------------------------------------------------------------------ launch discipline (the CuPy stand-in)
@pytest.fixture
def fake_gpu(monkeypatch):
    """`import cupy` gives the stand-in (cupy_standin) (the launchers take their GPU path on the emulator)."""
    before = fake_cupy.install()
    monkeypatch.setattr(device, "_gpu_ok", None)
    try:
        yield fake_cupy
    finally:
        device._gpu_ok = None
        for key in [k for k in cuda_kernels._loaded if k[2] == "gpu"]:
            del cuda_kernels._loaded[key]
        fake_cupy.uninstall(before)


def _step_calls(xp, put):
    """(name, call, kernel launches it must make) for every launcher, float32 arrays of `put`."""
    rng = np.random.default_rng(0)
    N, D, V = 37, 48, 300
    def zeros(*shape, dtype=np.float32):
        return put(np.zeros(shape, dtype))

    x, g = put(randn(rng, (N, D), F32)), put(randn(rng, (N, D), F32))
    w, r = put(np.ones(D, np.float32)), zeros(N)
    xhat, out, gx, gw = zeros(N, D), zeros(N, D), zeros(N, D), zeros(D)
    logits, t = put(randn(rng, (N, V), F32)), put(_targets(rng, N, V))
    s, lse, losses = zeros(N), zeros(N), zeros(N)
    dloss, mean = put(np.array(0.5, np.float32)), zeros(1)
    flat = put(randn(rng, (5000,), F32))
    p_, m_, v_ = put(randn(rng, (5000,), F32)), zeros(5000), zeros(5000)
    factors, emb = zeros(3), zeros(50, D)
    ids = put(rng.integers(0, 50, N).astype(np.int64))
    q = put(randn(rng, (2, 5, 3, 8), F32))
    cos, sin = (put(a) for a in _cos_sin(5, 8))
    return [
        ("rmsnorm_fwd", lambda: rmsnorm.rmsnorm_fwd(x, w, xhat, out, r, 1e-6), 1),
        ("rmsnorm_bwd", lambda: rmsnorm.rmsnorm_bwd(g, xhat, w, r, gx, gw), 2),
        ("rmsnorm_bwd gx only", lambda: rmsnorm.rmsnorm_bwd(g, xhat, w, r, gx, None), 1),
        ("swiglu_fwd", lambda: swiglu.swiglu_fwd(x, g, out), 1),
        ("swiglu_bwd", lambda: swiglu.swiglu_bwd(x, g, xhat, gx, out), 1),
        ("rope", lambda: rope.rope(q, cos, sin, q, -1.0), 1),
        ("causal_softmax_fwd", lambda: softmax.causal_softmax_fwd(xhat, 37, 0.5), 1),
        ("causal_softmax_bwd", lambda: softmax.causal_softmax_bwd(xhat, gx, 37, 0.5), 1),
        ("softmax_exp_rows", lambda: softmax.softmax_exp_rows(x, s, lse), 1),
        ("scale_rows", lambda: softmax.scale_rows(x, s), 1),
        ("cross_entropy_fwd", lambda: ce.cross_entropy_fwd(logits, t, s, lse, losses), 1),
        ("cross_entropy_bwd", lambda: ce.cross_entropy_bwd(logits, s, t, dloss, 1 / 34), 1),
        ("mean_loss", lambda: ce.mean_loss(losses, 1 / 34, mean), 1),
        ("add", lambda: residual.add(x, g, x), 1),
        ("embedding_bwd", lambda: embedding.embedding_bwd(ids, g, emb), 1),  # + the memset (fill)
        ("global_norm_and_clip", lambda: grad_norm.global_norm_and_clip(flat, None, factors, 1.0), 2),
        ("adamw_flat_scaled", lambda: adamw_flat_scaled(p_, flat, m_, v_, factors, 1, 1e-3), 1),
    ]


def test_launchers_never_synchronise_and_launch_as_stated(fake_gpu):
    """On CuPy arrays every launcher only queues kernels: no device value is read on the host
    (the stand-in counts .get(), float(), int(), ...), and it makes the stated launches."""
    calls = _step_calls(fake_gpu, fake_gpu.asarray)
    for label, call, launches in calls:
        with fake_gpu.counting() as c:
            call()
        assert c["host_syncs"] == 0, f"{label} synchronised with the host"
        assert c["kernel_launches"] == launches, f"{label}: {c['kernel_launches']} launches, expected {launches}"


def test_launchers_on_the_stand_in_match_numpy(fake_gpu):
    """The GPU path (the stand-in runs the same kernels) gives the NumPy path's bits."""
    gpu_arrays, cpu_arrays = {}, {}

    def keep(store, put):
        def f(a):
            d = put(a)
            store[len(store)] = d
            return d
        return f

    gpu_calls = _step_calls(fake_gpu, keep(gpu_arrays, fake_gpu.asarray))
    cpu_calls = _step_calls(np, keep(cpu_arrays, lambda a: np.array(a, copy=True)))
    for (label, gcall, _), (_, ccall, _) in zip(gpu_calls, cpu_calls):
        gcall()
        ccall()
    for k, a in cpu_arrays.items():
        np.testing.assert_array_equal(fake_gpu.asnumpy(gpu_arrays[k]), a, err_msg=f"array {k}")


# ------------------------------------------------------------------ grad_scaler.cu
@pytest.mark.parametrize("found", [0.0, 1.0])
@pytest.mark.parametrize("state,interval,dynamic", [([65536.0, 1999.0, 0.0], 2000, True), ([65536.0, 5.0, 3.0], 2000, True),
                                                   ([3.0e38, 1.0, 0.0], 2, True), ([8.0, 1.0, 2.0], 2, False)])
def test_update_scale_is_gradscalers_rule(found, state, interval, dynamic):
    """The loss scale's update on the device equals training/optim/grad_scaler.py's rule bit for bit:
    back off on an inf, grow after `interval` clean steps unless the grown scale is not finite,
    count the skips; a fixed scale only counts."""
    from xtrain_lessons.runtime.kernels.grad_scaler import update_scale, update_scale_reference  # noqa: PLC0415
    from xtrain_lessons.training.optim.grad_scaler import GradScaler  # noqa: PLC0415

    s = np.array(state, np.float32)
    want = update_scale_reference(s, bool(found), 2.0, 0.5, interval, dynamic)
    update_scale(s, np.array([1.0, 1.0, found], np.float32), 2.0, 0.5, interval, dynamic)
    assert np.array_equal(s, want)
    host = GradScaler(init_scale=state[0], growth_interval=interval, dynamic=dynamic)
    host._growth_tracker, host.skipped_steps, host.found_inf = int(state[1]), int(state[2]), bool(found)
    with np.errstate(over="ignore"):
        host.update()
    assert [host.get_scale(), host._growth_tracker, host.skipped_steps] == s.tolist()


def test_grad_norm_reads_the_loss_scale_on_the_device():
    """grad_norm_finish_scaled: the same out as passing inv_scale = float32(1 / scale) from the host."""
    from xtrain_lessons.runtime.kernels.grad_norm import global_norm_and_clip  # noqa: PLC0415

    g = np.random.default_rng(3).standard_normal(5000).astype(np.float32) * np.float32(4096)
    host, dev = np.empty(3, np.float32), np.empty(3, np.float32)
    global_norm_and_clip(g, None, host, 1.0, inv_scale=float(np.float32(1.0 / np.float64(4096.0))))
    global_norm_and_clip(g, None, dev, 1.0, scale_state=np.array([4096.0, 0.0, 0.0], np.float32))
    assert np.array_equal(host, dev) and host[2] == 0.0


def test_embedding_bwd_is_deterministic_in_token_order():
    """No atomics: a token's rows are added in position order, so the result is the CPU's C++
    (np.add.at's order) bit for bit, however often a token repeats and however the blocks run."""
    from xtrain_lessons.runtime.host import fused_rows  # noqa: PLC0415
    from xtrain_lessons.runtime.kernels.embedding import embedding_bwd  # noqa: PLC0415

    rng = np.random.default_rng(7)
    ids = rng.integers(0, 37, 301).astype(np.int64)  # ~8 repeats per token, some tokens absent
    g = rng.standard_normal((301, 48)).astype(np.float32)
    gw = np.full((40, 48), np.nan, np.float32)
    embedding_bwd(ids, g, gw)
    want = np.zeros((40, 48), np.float32)
    np.add.at(want, ids, g)
    assert np.array_equal(gw, want)
    if fused_rows.available():
        cpu = np.empty_like(want)
        fused_rows.embedding_bwd(ids, g, cpu)
        assert np.array_equal(gw, cpu)
