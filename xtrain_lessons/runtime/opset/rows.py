"""The row kernels of a training step: RMSNorm, SwiGLU, RoPE, the residual add, the softmax rows
of a cross-entropy and their scaling (phase T07).

    rmsnorm_fwd(x, w, xhat, out, r, eps)       x (N, D) -> xhat = x / rms(x), out = xhat * w, r = 1 / rms
    rmsnorm_bwd(g, xhat, w, r, gx, want_gw)    gx (N, D) written (or None); returns dw (D,) or None
    swiglu_fwd(a, u, out)  swiglu_bwd(a, u, g, da, du)       out = silu(a) * u and its gradients
    rope(x, cos, sin, sign=1.0) -> out         x (B, T, H, D) rotated; sign -1: the inverse rotation
    add(a, b, out=None) -> a + b               a residual add, or a gradient summed into another
    softmax_rows(x, e, s, lse)                 e = exp(x - rowmax) (e may be x), s = rowsum(e), lse
    scale_rows(x, f, out=None)                 out[r, :] = x[r, :] * f[r] (in place without out)

A GPU runs each as one launch of its CUDA kernel (runtime/kernels/<family>.cu); the CPU as C++ over
the rows on the engine's worker pool (runtime/host/fused_rows.cpp); anything else (float64, no C++
compiler, XTRAIN_FUSED=0) takes the NumPy reference below, on cache-sized blocks of rows spread
over the engine's threads (cpu_threads.map_rows): the same arithmetic per row, so the same bits
for any thread count; a sum over rows (dw) adds fixed blocks' partial sums in row order. bf16 /
fp16 storage on the CPU: float32 arithmetic on the values, each result rounded once (opset/lowp.py).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime import cpu_threads
from xtrain_lessons.runtime.allocator import empty
from xtrain_lessons.runtime.cpu_threads import grid, map_rows, sum_blocks
from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.runtime.host import fused_rows
from xtrain_lessons.runtime.kernels import residual as _residual
from xtrain_lessons.runtime.kernels import rmsnorm as _rmsnorm
from xtrain_lessons.runtime.kernels import rope as _rope
from xtrain_lessons.runtime.kernels import softmax as _softmax
from xtrain_lessons.runtime.kernels import swiglu as _swiglu
from xtrain_lessons.runtime.opset import dispatch, lowp
from xtrain_lessons.runtime.opset.casts import is_low
from xtrain_lessons.runtime.opset.table import op

__all__ = ["rmsnorm_fwd", "rmsnorm_bwd", "swiglu_fwd", "swiglu_bwd", "rope", "add", "softmax_rows", "scale_rows"]


# ----- RMSNorm
@op("rows", cpu="host/fused_rows.cpp: rmsnorm_fwd", gpu="kernels/rmsnorm.cu: rmsnorm_fwd",
    reference="opset/rows.py: _rmsnorm_fwd_rows", test="test_fused_rows.py, test_kernels_step.py")
def rmsnorm_fwd(x, w, xhat, out, r, eps) -> None:
    """x (N, D) -> xhat = x / rms(x), out = xhat * w (w None: out is xhat, not written again), r (N, 1)
    = 1 / rms. xhat and out may be bf16/fp16 storage on a GPU (float32 statistics inside)."""
    if dispatch.gpu(x, w, xhat):
        _rmsnorm.rmsnorm_fwd(x, w, xhat, out, r, eps)
    elif dispatch.host(x, w, xhat):
        fused_rows.rmsnorm_fwd(x, w, xhat, out, r, eps)
    elif is_low(x) or is_low(xhat):
        lowp.rmsnorm_fwd(x, w, xhat, out, r, eps)
    else:
        _rmsnorm_fwd_rows(x, w, xhat, out, r, eps)


def _rmsnorm_fwd_rows(x, w, xhat, out, r, eps) -> None:
    xp, dt = array_module(x), x.dtype.type
    N, D = x.shape
    inv_d, eps_ = dt(1.0 / D), dt(eps)

    def rows(lo, hi):  # one cache-sized block of rows
        xb = x[lo:hi]
        ms = xp.einsum("ij,ij->i", xb, xb)  # sum of squares, no (rows, D) temporary
        ms *= inv_d
        ms += eps_
        rb = r[lo:hi]
        xp.divide(dt(1.0), xp.sqrt(ms, out=ms)[:, None], out=rb)
        xp.multiply(xb, rb, out=xhat[lo:hi])
        if w is not None:
            xp.multiply(xhat[lo:hi], w, out=out[lo:hi])

    map_rows(rows, N, D * x.itemsize, like=x)


@op("rows", cpu="host/fused_rows.cpp: rmsnorm_bwd", gpu="kernels/rmsnorm.cu: rmsnorm_bwd",
    reference="opset/rows.py: _rmsnorm_bwd_rows", test="test_fused_rows.py, test_kernels_step.py")
def rmsnorm_bwd(g, xhat, w, r, gx, want_gw: bool):
    """Writes gx (N, D) = r * (g*w - xhat * mean(g*w * xhat)) (gx None: not wanted); returns dw (D,)
    = the sum over rows of g * xhat (float32 from a kernel), or None. The sum adds fixed blocks of
    rows in a fixed order: the same bits for any thread count."""
    xp = array_module(xhat)
    N, D = xhat.shape
    if dispatch.gpu(g, xhat, w, gx):
        gw = xp.empty(D, dtype=np.float32) if want_gw else None
        _rmsnorm.rmsnorm_bwd(g, xhat, w, r, gx, gw)
        return gw
    if dispatch.host(g, xhat, w, gx):
        gw = xp.empty(D, dtype=np.float32) if want_gw else None
        block_rows = len(range(*cpu_threads.grid(0, N, D * xhat.itemsize)[0]))
        parts = np.zeros((-(-N // block_rows), D), np.float32) if want_gw else None
        fused_rows.rmsnorm_bwd(g, xhat, w, r, gx, parts, block_rows)
        if want_gw:
            gw[...] = sum_blocks(list(parts))
        return gw
    if is_low(xhat):
        return lowp.rmsnorm_bwd(g, xhat, w, r, gx, want_gw)
    return _rmsnorm_bwd_rows(g, xhat, w, r, gx, want_gw)


def _rmsnorm_bwd_rows(g, xhat, w, r, gx, want_gw):
    xp = array_module(xhat)
    N, D = xhat.shape
    inv_d = xhat.dtype.type(1.0 / D)

    def rows(lo, hi):
        gb, xh = g[lo:hi], xhat[lo:hi]
        # dw's partial sums on the fixed grid (cpu_threads.grid): the same bits for any threads
        gw_part = [xp.einsum("ij,ij->j", g[a:b], xhat[a:b]) for a, b in grid(lo, hi, D * xhat.itemsize)] \
            if want_gw else None
        if gx is not None:
            gh = gb * w if w is not None else gb
            dot = xp.einsum("ij,ij->i", gh, xh)  # (rows,)
            dot *= inv_d
            gxb = gx[lo:hi]
            xp.multiply(xh, dot[:, None], out=gxb)
            xp.subtract(gh, gxb, out=gxb)
            gxb *= r[lo:hi]
        return gw_part

    partials = map_rows(rows, N, D * xhat.itemsize, like=xhat)
    return sum_blocks(partials) if want_gw else None


# ----- SwiGLU
def _sigmoid(x):
    xp = array_module(x)
    half = x.dtype.type(0.5)
    s = xp.tanh(x * half)  # 0.5 * (tanh(x/2) + 1): no overflow for large |x|
    s += x.dtype.type(1.0)
    s *= half
    return s


@op("rows", cpu="host/fused_rows.cpp: swiglu_fwd", gpu="kernels/swiglu.cu: swiglu_fwd",
    reference="opset/rows.py: _swiglu_fwd_rows", test="test_fused_rows.py, test_kernels_step.py")
def swiglu_fwd(a, u, out) -> None:
    """out = silu(a) * u = a * sigmoid(a) * u, for (N, F) arrays."""
    if dispatch.gpu(a, u, out):
        _swiglu.swiglu_fwd(a, u, out)
    elif dispatch.host(a, u, out):
        fused_rows.swiglu_fwd(a, u, out)
    elif is_low(out):
        lowp.swiglu_fwd(a, u, out)
    else:
        _swiglu_fwd_rows(a, u, out)


def _swiglu_fwd_rows(a2, u2, out) -> None:
    xp = array_module(a2)

    def rows(lo, hi):
        a = a2[lo:hi]
        silu = _sigmoid(a)
        silu *= a
        xp.multiply(silu, u2[lo:hi], out=out[lo:hi])

    map_rows(rows, a2.shape[0], a2.shape[-1] * out.itemsize, like=out)


@op("rows", cpu="host/fused_rows.cpp: swiglu_bwd", gpu="kernels/swiglu.cu: swiglu_bwd",
    reference="opset/rows.py: _swiglu_bwd_rows", test="test_fused_rows.py, test_kernels_step.py")
def swiglu_bwd(a, u, g, da, du) -> None:
    """da = g * u * sig * (1 + a * (1 - sig)), du = g * silu(a), sigmoid recomputed from a."""
    if dispatch.gpu(a, u, g, da, du):
        _swiglu.swiglu_bwd(a, u, g, da, du)
    elif dispatch.host(a, u, g, da, du):
        fused_rows.swiglu_bwd(a, u, g, da, du)
    elif is_low(da):
        lowp.swiglu_bwd(a, u, g, da, du)
    else:
        _swiglu_bwd_rows(a, u, g, da, du)


def _swiglu_bwd_rows(a2, u2, g2, dgate, dup) -> None:
    xp = array_module(a2)

    def rows(lo, hi):
        a, gb = a2[lo:hi], g2[lo:hi]
        sig = _sigmoid(a)
        one = sig.dtype.type(1.0)
        dub = dup[lo:hi]
        xp.multiply(a, sig, out=dub)  # silu
        dub *= gb
        d = dgate[lo:hi]
        xp.subtract(one, sig, out=d)
        d *= a
        d += one
        d *= sig
        d *= u2[lo:hi]
        d *= gb

    map_rows(rows, a2.shape[0], a2.shape[-1] * dup.itemsize, like=dup)


# ----- RoPE
@op("rows", cpu="host/fused_rows.cpp: rope", gpu="kernels/rope.cu: rope", reference="opset/rows.py: _rope_rows",
    test="test_fused_rows.py, test_kernels_step.py")
def rope(x, cos, sin, sign: float = 1.0):
    """x (B, T, H, D) rotated: x * cos + rotate_half(x) * sin * sign, tables (T, D); a new array."""
    if dispatch.gpu(x, cos, sin):
        kernel = _rope.rope
    elif dispatch.host(x, cos, sin):
        kernel = fused_rows.rope
    elif is_low(x):
        return lowp.rope(x, cos, sin, sign, _rope_rows)
    else:
        return _rope_rows(x, cos, sin, sign)
    out = empty(x.shape, x.dtype, x)
    kernel(x, cos, sin, out, sign)
    return out


def _rope_rows(x, cos, sin, sign):
    """x * cos + swap_halves(x) * sin * sign over whole contiguous (T, H*D) rows, the tables as one
    row per position repeated for every head, sin as [-s, s] per head. Slicing the halves instead
    (x[..., :D/2]) makes NumPy loop over D/2 = 24 numbers at a time, about 3x slower."""
    xp = array_module(x)
    B, T, H, D = x.shape
    h = D // 2
    cos_t = xp.tile(cos, (1, H))
    sin_t = xp.tile(xp.concatenate([-sin[:, :h], sin[:, h:]], axis=1), (1, H)) * sign
    x3 = x.reshape(B, T, H * D)
    out = empty(x3.shape, xp.result_type(x, cos_t), x)

    def rows(lo, hi):  # sequences lo..hi-1
        n = hi - lo
        swapped = xp.ascontiguousarray(x[lo:hi].reshape(n, T, H, 2, h)[..., ::-1, :]).reshape(n, T, H * D)
        swapped *= sin_t
        o = out[lo:hi]
        xp.multiply(x3[lo:hi], cos_t, out=o)
        o += swapped

    map_rows(rows, B, T * H * D * out.itemsize, like=x)
    return out.reshape(B, T, H, D)


# ----- the residual add
@op("rows", cpu="host/fused_rows.cpp: add", gpu="kernels/residual.cu: add", reference="a + b",
    test="test_fused_rows.py, test_kernels_step.py")
def add(a, b, out=None):
    """a + b (NumPy's broadcasting); `out` may be a or b. Same-shaped arrays: one GPU launch, or on
    the CPU the pool's threads when large enough to pay for the hand-over (the same bits as NumPy)."""
    if dispatch.gpu(a, b, out):
        if a.shape == b.shape and a.dtype == b.dtype and (out is None or out.dtype == a.dtype):
            out = array_module(a).empty_like(a) if out is None else out
            _residual.add(a, b, out)
            return out
    else:
        total = fused_rows.add(a, b, out)  # None when the pool would not pay (small, not float32, ...)
        if total is not None:
            return total
    if out is None:
        return a + b
    if out is a:
        a += b
        return a
    return array_module(out).add(a, b, out=out)


# ----- the softmax rows of a cross-entropy
@op("rows", cpu="host/fused_rows.cpp: softmax_exp_rows", gpu="kernels/softmax.cu: softmax_exp_rows",
    reference="opset/rows.py: _softmax_block", test="test_fused_rows.py, test_kernels_step.py")
def softmax_rows(x, e, s, lse) -> None:
    """x (N, V) -> e = exp(x - rowmax) (e may be x itself: in place), s (N, 1) its row sums, lse (N, 1)
    the log-sum-exp."""
    if dispatch.gpu(x, e, s, lse):
        kernel = _softmax.softmax_exp_rows
    elif dispatch.host(x, e, s, lse):
        kernel = fused_rows.softmax_exp_rows
    else:
        map_rows(lambda lo, hi: _softmax_block(x[lo:hi], e[lo:hi], s[lo:hi], lse[lo:hi]), x.shape[0],
                 x.shape[1] * x.itemsize, like=x)
        return
    if e is not x:
        e[...] = x
    kernel(e, s, lse)


def _softmax_block(xb, eb, sb, lseb) -> None:
    xp = array_module(xb)
    m = xb.max(axis=1, keepdims=True)  # (rows, 1), not differentiated
    xp.subtract(xb, m, out=eb)
    xp.exp(eb, out=eb)
    eb.sum(axis=1, keepdims=True, out=sb)
    xp.log(sb, out=lseb)
    lseb += m


@op("rows", cpu="host/fused_rows.cpp: scale_rows", gpu="kernels/softmax.cu: scale_rows",
    reference="opset/rows.py: scale_rows", test="test_fused_rows.py, test_kernels_step.py")
def scale_rows(x, f, out=None) -> None:
    """out[r, :] = x[r, :] * f[r] for x (N, V), f (N, 1); in place when out is None (the kernels work
    in place only)."""
    if out is None and dispatch.gpu(x, f):
        _softmax.scale_rows(x, f)
    elif out is None and dispatch.host(x, f):
        fused_rows.scale_rows(x, f)
    else:
        out = x if out is None else out
        xp = array_module(x)
        map_rows(lambda lo, hi: xp.multiply(x[lo:hi], f[lo:hi], out=out[lo:hi]), x.shape[0],
                 x.shape[1] * x.itemsize, like=x)
