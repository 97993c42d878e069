"""Causal attention by blocks of queries (phase T07): keys a block cannot see are never multiplied.

`layers.attention_fwd` computes every score of the (T, T) matrix and masks the upper half to
-inf: half of the products of S = q k^T and of P V are thrown away. Cut the queries into
blocks of `block` rows: block [a, b) sees keys 0 .. Tk - Tq + b - 1 only, so its products are
(b - a) x n_k with n_k = Tk - Tq + b. With T/block blocks the matmuls do (1 + block/T) / 2 of
the work (62.5% at 4 blocks); smaller blocks skip more but run BLAS on smaller matrices.

    out, blocks, probs = causal_forward(q, k, v)       # arrays: q (B, Tq, H, D), k, v (B, Tk, Hkv, D)
    dq, dk, dv = causal_backward(q, k, v, g, blocks, probs)

probs[i] (B, Hkv, G*(b-a), n_k) holds block i's probabilities, rows ordered (query head of
the group, query): row r of a block is query a + r % (b - a). The softmax of a block runs in
runtime/host's C++ (float32 NumPy arrays) or in NumPy. Every sequence runs on one thread with
its blocks in a fixed order, so the bits do not depend on the thread count; dK and dV add
the blocks' contributions in that order.
"""

from __future__ import annotations

import math

import numpy as np

from xtrain_lessons.runtime.allocator import empty
from xtrain_lessons.runtime.cpu_threads import map_rows
from xtrain_lessons.runtime import fused, opset
from xtrain_lessons.runtime.device import array_module, on_gpu
from xtrain_lessons.runtime.host import fused_rows

__all__ = ["query_blocks", "causal_forward", "causal_backward", "keys_t"]


def _scale(dtype, D: int):
    """1/sqrt(D) in the arithmetic's precision: float32 for bf16/fp16 storage (the kernels compute
    in float32; a bf16 scale would be off by up to 0.4%)."""
    return (np.float32 if np.dtype(dtype).itemsize < 4 else np.dtype(dtype).type)(1.0 / math.sqrt(D))


def query_blocks(Tq: int, Tk: int, block: int | None = None) -> list[tuple[int, int, int]]:
    """[(a, b, n_k)]: query rows a..b-1 and the n_k keys they see. Default block: 64 rows up
    to Tq = 256, then 128 (T07 measures the trade-off)."""
    block = block or (64 if Tq <= 256 else 128)
    return [(a, min(a + block, Tq), Tk - Tq + min(a + block, Tq)) for a in range(0, Tq, block)]


def keys_t(k):
    """(B, Tk, Hkv, D) -> (B, Hkv, D, Tk), C-contiguous. NumPy's batched matmul calls BLAS
    only when each matrix has a unit stride; `q @ k.swapaxes(-1, -2)` of the transposed
    view falls back to a loop about 3x slower than this copy plus the BLAS call."""
    return array_module(k).ascontiguousarray(k.transpose(0, 2, 3, 1))


def _heads(x5, lo, hi, a, b):
    """Rows a..b-1 of sequences lo..hi-1 of x (B, T, Hkv, G, D), as (n, Hkv, G*(b-a), D)."""
    n, _, Hkv, G, D = x5[lo:hi].shape
    return array_module(x5).ascontiguousarray(x5[lo:hi, a:b].transpose(0, 2, 3, 1, 4)).reshape(n, Hkv, G * (b - a), D)


def _softmax(s, rows_q: int, scale, use_kernels: bool) -> None:
    """In place: the causal softmax of s * scale (0 where masked) for s (..., R, n_k), row r
    being query r % rows_q of a block whose last query sees all n_k keys."""
    n_k = s.shape[-1]
    if use_kernels:  # one pass per row: C++, or one GPU launch
        fused.causal_softmax_fwd(s, rows_q, scale)
        return
    xp = array_module(s)
    future = xp.arange(n_k)[None, :] > (n_k - rows_q + xp.arange(rows_q))[:, None]
    s3 = s.reshape(-1, rows_q, n_k)
    s3 *= scale
    s3 += xp.where(future, -xp.inf, 0.0).astype(s.dtype)
    s3 -= s3.max(axis=-1, keepdims=True)  # max subtraction: exp never overflows
    xp.exp(s3, out=s3)
    s3 /= s3.sum(axis=-1, keepdims=True)


def _softmax_backward(p, ds, rows_q: int, scale, use_kernels: bool) -> None:
    """In place over ds = dP: dS = P * (dP - rowsum(dP * P)) * scale."""
    if use_kernels:
        fused.causal_softmax_bwd(p, ds, rows_q, scale)
        return
    ds -= (ds * p).sum(axis=-1, keepdims=True)
    ds *= p
    ds *= scale


def causal_forward(q, k, v, block: int | None = None, numpy_path: bool = False):
    """(out (B, Tq, H, D), blocks, probs) for arrays q (B, Tq, H, D), k, v (B, Tk, Hkv, D).
    numpy_path: NumPy's batched matmuls and softmax even where runtime/host's C++ could run."""
    xp = array_module(q)
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    G = H // Hkv
    scale = _scale(q.dtype, D)
    if on_gpu(q):  # a GPU wants one big launch per product: one block of all the queries
        block = Tq
    blocks = query_blocks(Tq, Tk, block)
    probs = [empty((B, Hkv, G * (b - a), n_k), q.dtype, q) for a, b, n_k in blocks]
    out = empty((B, Tq, H, D), q.dtype, q)
    q5, out5 = q.reshape(B, Tq, Hkv, G, D), out.reshape(B, Tq, Hkv, G, D)
    vh = v.transpose(0, 2, 1, 3)  # (B, Hkv, Tk, D), a view
    use_kernels = fused.usable(*probs) and not numpy_path
    if use_kernels and fused_rows.attention_usable(q, k, v, out):  # the same blocks in C++ (CPU), no copies
        fused_rows.attention_fwd(q, k, v, out, probs, blocks, scale)
        return out, blocks, probs

    def batch_rows(lo, hi):  # sequences lo..hi-1, block by block
        kt = keys_t(k[lo:hi])
        for (a, b, n_k), p in zip(blocks, probs):
            s = p[lo:hi]
            opset.matmul(_heads(q5, lo, hi, a, b), kt[..., :n_k], out=s)
            _softmax(s, b - a, scale, use_kernels)
            y = opset.matmul(s, vh[lo:hi, :, :n_k])  # (n, Hkv, G*(b-a), D)
            out5[lo:hi, a:b] = y.reshape(hi - lo, Hkv, G, b - a, D).transpose(0, 3, 1, 2, 4)

    map_rows(batch_rows, B, sum(p[0].nbytes for p in probs), like=q, blas=True)
    return out, blocks, probs


def causal_backward(q, k, v, g, blocks, probs, numpy_path: bool = False):
    """(dq, dk, dv) for the upstream gradient g (B, Tq, H, D) of causal_forward's output."""
    xp = array_module(g)
    B, Tq, H, D = q.shape
    Hkv = k.shape[2]
    G = H // Hkv
    scale = _scale(q.dtype, D)
    dq, dk, dv = empty(q.shape, g.dtype, g), empty(k.shape, g.dtype, g), empty(v.shape, g.dtype, g)
    q5, g5, dq5 = (x.reshape(B, Tq, Hkv, G, D) for x in (q, g, dq))
    kh = k.transpose(0, 2, 1, 3)  # (B, Hkv, Tk, D), a view
    use_kernels = fused.usable(*probs) and g.dtype == probs[0].dtype and not numpy_path
    if use_kernels and fused_rows.attention_usable(q, k, v, g):
        fused_rows.attention_bwd(q, k, v, g, probs, blocks, scale, dq, dk, dv)
        return dq, dk, dv
    order = sorted(range(len(blocks)), key=lambda i: -blocks[i][2])  # the block seeing all keys first

    def batch_rows(lo, hi):
        n = hi - lo
        vt = keys_t(v[lo:hi])
        dkh = dvh = None  # (n, Hkv, Tk, D): the first block writes them, the others add
        for i in order:
            (a, b, n_k), p = blocks[i], probs[i][lo:hi]
            gb, qb = _heads(g5, lo, hi, a, b), _heads(q5, lo, hi, a, b)
            dv_part = opset.matmul(p.swapaxes(-1, -2), gb)  # P^T dO: sums a group's query heads
            ds = opset.matmul(gb, vt[..., :n_k])  # dP, overwritten by dS
            _softmax_backward(p, ds, b - a, scale, use_kernels)
            dk_part = opset.matmul(ds.swapaxes(-1, -2), qb)
            if dkh is None:
                dkh, dvh = dk_part, dv_part
            else:
                dkh[:, :, :n_k] += dk_part
                dvh[:, :, :n_k] += dv_part
            y = opset.matmul(ds, kh[lo:hi, :, :n_k])
            dq5[lo:hi, a:b] = y.reshape(n, Hkv, G, b - a, D).transpose(0, 3, 1, 2, 4)
        dk[lo:hi] = dkh.transpose(0, 2, 1, 3)
        dv[lo:hi] = dvh.transpose(0, 2, 1, 3)

    map_rows(batch_rows, B, sum(p[0].nbytes for p in probs), like=g, blas=True)
    return dq, dk, dv
