"""The NumPy references of the op set for bfloat16 and float16 storage (phases T12 and T12b).

A GPU's kernels read bf16/fp16 values, compute in float32 and round each stored result once; the
CPU has no such kernels (NumPy's bf16 arithmetic would round after every operation, and is slow),
so these references do the same value for value with float32 arithmetic on the widened values:
  * products: the operands' values in float32, one float32 product (np.matmul), the result
    rounded once to the storage dtype;
  * RMSNorm, RoPE, SwiGLU: float32 arithmetic, each output rounded once; RMSNorm's statistics stay
    float32, and SwiGLU's backward uses the sigmoid and silu rounded as a stored copy would hold them;
  * attention: the scores and the softmax in float32, P rounded (and kept) in the storage dtype;
  * the loss: log-sum-exp and the mean in float32, exp(z - max) kept in the storage dtype.
The gradients are rounded to their tensor's storage dtype, as the engine rounds every gradient.
Where a GPU rounds in other places (cuBLAS returns bf16 attention scores, as torch.autocast does),
the two devices differ by a rounding; both are measured against float32 (tests/test_fake_cupy.py).
"""

from __future__ import annotations

import math

import numpy as np

from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.runtime.opset.casts import F32, cast

__all__ = ["matmul", "rmsnorm_fwd", "rmsnorm_bwd", "rope", "swiglu_fwd", "swiglu_bwd", "attention_fwd",
           "attention_bwd", "cross_entropy_fwd", "cross_entropy_bwd"]


def _f32(a):
    return cast(a, F32)


def matmul(a, b, out=None):
    """a @ b from the operands' values in float32, rounded once to their result dtype."""
    y = np.matmul(_f32(a), _f32(b))
    want = np.result_type(a.dtype, b.dtype)
    if out is None:
        return cast(y, want)
    out[...] = cast(y, out.dtype)
    return out


def rmsnorm_fwd(x, w, xhat, out, r, eps) -> None:
    xf = _f32(x)
    r[...] = np.float32(1.0) / np.sqrt((xf * xf).mean(axis=-1, keepdims=True) + np.float32(eps))
    xh = xf * r
    if w is not None:
        out[...] = cast(xh * w, out.dtype)
    xhat[...] = cast(xh, xhat.dtype)


def rmsnorm_bwd(g, xhat, w, r, gx, want_gw: bool):
    gf, xh = _f32(g), _f32(xhat)
    gw = (gf * xh).sum(axis=0) if want_gw else None
    if gx is not None:
        gh = gf * w if w is not None else gf
        d = gh - xh * (gh * xh).mean(axis=-1, keepdims=True)
        d *= r
        gx[...] = cast(d, gx.dtype)
    return gw


def rope(x, cos, sin, sign: float, rows):
    """x rotated in float32 by `rows` (the float32 rotation), rounded once to x's dtype."""
    return cast(rows(_f32(x), cos, sin, sign), x.dtype)


def _sigmoid(a):
    return np.float32(0.5) * (np.tanh(a * np.float32(0.5)) + np.float32(1.0))


def swiglu_fwd(a, u, out) -> None:
    af = _f32(a)
    out[...] = cast(af * _sigmoid(af) * _f32(u), out.dtype)


def swiglu_bwd(a, u, g, da, du) -> None:
    """The sigmoid and silu as a stored low-precision copy holds them (rounded), so the backward
    sees the forward's values."""
    af = _f32(a)
    sig = _sigmoid(af)
    sg, silu = _f32(cast(sig, a.dtype)), _f32(cast(af * sig, a.dtype))
    gf, one = _f32(g), np.float32(1.0)
    da[...] = cast(gf * _f32(u) * sg * (one + af * (one - sg)), da.dtype)
    du[...] = cast(gf * silu, du.dtype)


def _to_heads(x, Hkv):
    B, T, H, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, Hkv, (H // Hkv) * T, D)


def _from_heads(y, B, T, H, D):
    return array_module(y).ascontiguousarray(y.reshape(B, H, T, D).transpose(0, 2, 1, 3))


def attention_fwd(q, k, v):
    """(out, saved) of causal grouped-query attention: S = Q K^T in float32, the softmax in float32,
    P rounded to the storage dtype (kept, and the operand of P V), the output rounded."""
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    scale = np.float32(1.0 / math.sqrt(D))
    qh = _to_heads(_f32(q), Hkv)
    kh = _f32(k).transpose(0, 2, 1, 3)
    vh = _f32(v).transpose(0, 2, 1, 3)
    s = (qh @ kh.swapaxes(-1, -2)) * scale
    s = s.reshape(B, Hkv, H // Hkv, Tq, Tk)
    future = np.arange(Tk)[None, :] > (Tk - Tq + np.arange(Tq))[:, None]
    s += np.where(future, -np.inf, 0.0).astype(np.float32)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    p = cast(s.reshape(B, Hkv, -1, Tk), q.dtype)  # (B, Hkv, G*Tq, Tk): one block of every query
    out = cast(_from_heads(_f32(p) @ vh, B, Tq, H, D), q.dtype)
    return out, ([(0, Tq, Tk)], [p])


def attention_bwd(q, k, v, g, saved):
    B, Tq, H, D = q.shape
    Hkv = k.shape[2]
    scale = np.float32(1.0 / math.sqrt(D))
    p = _f32(saved[1][0])
    qh = _to_heads(_f32(q), Hkv)
    kh = _f32(k).transpose(0, 2, 1, 3)
    vh = _f32(v).transpose(0, 2, 1, 3)
    gh = _to_heads(_f32(g), Hkv)
    dv = p.swapaxes(-1, -2) @ gh
    ds = gh @ vh.swapaxes(-1, -2)
    ds -= (ds * p).sum(axis=-1, keepdims=True)
    ds *= p
    ds *= scale
    dq = _from_heads(ds @ kh, B, Tq, H, D)
    dk = ds.swapaxes(-1, -2) @ qh
    return (cast(dq, q.dtype), cast(np.ascontiguousarray(dk.transpose(0, 2, 1, 3)), k.dtype),
            cast(np.ascontiguousarray(dv.transpose(0, 2, 1, 3)), v.dtype))


def cross_entropy_fwd(logits, t_safe, valid, n_valid):
    """(mean loss (float32), saved) from stored logits (N, V): computed in float32, exp(z - max)
    kept in the storage dtype, the row sums in float32."""
    xp = array_module(logits)
    x = _f32(logits)
    rows = xp.arange(x.shape[0])
    n = np.float32(n_valid)
    m = x.max(axis=1, keepdims=True)
    e = xp.exp(x - m)
    s = e.sum(axis=1, keepdims=True)  # float32 sums
    losses = (xp.log(s) + m)[:, 0] - x[rows, t_safe]
    with np.errstate(invalid="ignore", divide="ignore"):
        loss = ((losses * valid).sum() / n).astype(np.float32)
    return loss, (cast(e, logits.dtype), s, t_safe, valid, n)


def cross_entropy_bwd(g, saved):
    """d loss / d logits in float32 for the upstream gradient g of the mean loss."""
    e16, s, t_safe, valid, n = saved
    xp = array_module(e16)
    with np.errstate(invalid="ignore", divide="ignore"):
        scale = valid.astype(np.float32) * (xp.asarray(g, dtype=np.float32) / n)
    gx = _f32(e16) * (scale / s[:, 0])[:, None]
    gx[xp.arange(gx.shape[0]), t_safe] -= scale
    return gx
