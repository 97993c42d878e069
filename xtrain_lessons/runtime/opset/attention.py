"""Causal attention by blocks of queries: keys a block cannot see are never multiplied (phase T07).

    out, saved = causal_attention_fwd(q, k, v)          # arrays: q (B, Tq, H, D), k, v (B, Tk, Hkv, D)
    dq, dk, dv = causal_attention_bwd(q, k, v, g, saved)
    causal_softmax_fwd(s, Tq, scale)  causal_softmax_bwd(p, dp, Tq, scale)    # in place, over rows

Composed attention computes every score of the (T, T) matrix and masks the upper half to -inf:
half of the products of S = q k^T and of P V are thrown away. Cut the queries into blocks of
`block` rows: block [a, b) sees keys 0 .. Tk - Tq + b - 1 only, so its products are (b - a) x n_k
with n_k = Tk - Tq + b. With T/block blocks the matmuls do (1 + block/T) / 2 of the work (62.5% at
4 blocks); smaller blocks skip more but run BLAS on smaller matrices.

saved = (blocks, probs): probs[i] (B, Hkv, G*(b-a), n_k) holds block i's probabilities, rows
ordered (query head of the group, query): row r of a block is query a + r % (b - a).

Kernels: on the CPU (float32 NumPy arrays) the whole forward and backward run in C++
(runtime/host/fused_rows.cpp), calling the BLAS sgemm runtime/blas.py chose; a GPU runs one block
of all the queries (one big launch per product: cuBLAS, and the causal softmax kernel of
kernels/softmax.cu); otherwise NumPy's batched matmuls and the softmax of each block, C++ when it
applies. Every sequence runs on one thread with its blocks in a fixed order, so the bits do not
depend on the thread count; dK and dV add the blocks' contributions in that order.
`reference=True` runs NumPy's batched matmuls and softmax even where the C++ could run (T05's
composed attention, T14's baseline).
"""

from __future__ import annotations

import math

import numpy as np

from xtrain_lessons.runtime.allocator import empty
from xtrain_lessons.runtime.cpu_threads import map_rows
from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.runtime.host import fused_rows
from xtrain_lessons.runtime.kernels import softmax as _softmax
from xtrain_lessons.runtime.opset import dispatch, lowp
from xtrain_lessons.runtime.opset.casts import is_low
from xtrain_lessons.runtime.opset.products import matmul
from xtrain_lessons.runtime.opset.table import op

__all__ = ["query_blocks", "causal_attention_fwd", "causal_attention_bwd", "causal_softmax_fwd",
           "causal_softmax_bwd", "keys_t"]


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


@op("attention", cpu="host/fused_rows.cpp: causal_softmax_fwd", gpu="kernels/softmax.cu: causal_softmax_fwd",
    reference="opset/attention.py: _causal_softmax_rows", test="test_fused_rows.py, test_kernels_step.py")
def causal_softmax_fwd(s, rows_q: int, scale) -> None:
    """In place: the causal softmax of s * scale (0 where masked) for s (..., R, n_k), row r being
    query r % rows_q of a block whose last query sees all n_k keys."""
    if dispatch.gpu(s):
        _softmax.causal_softmax_fwd(s, rows_q, scale)
    elif dispatch.host(s):
        fused_rows.causal_softmax_fwd(s, rows_q, scale)
    else:
        _causal_softmax_rows(s, rows_q, scale)


def _causal_softmax_rows(s, rows_q: int, scale) -> None:
    xp = array_module(s)
    n_k = s.shape[-1]
    future = xp.arange(n_k)[None, :] > (n_k - rows_q + xp.arange(rows_q))[:, None]
    s3 = s.reshape(-1, rows_q, n_k)
    s3 *= scale
    s3 += xp.where(future, -xp.inf, 0.0).astype(s.dtype)
    s3 -= s3.max(axis=-1, keepdims=True)  # max subtraction: exp never overflows
    xp.exp(s3, out=s3)
    s3 /= s3.sum(axis=-1, keepdims=True)


@op("attention", cpu="host/fused_rows.cpp: causal_softmax_bwd", gpu="kernels/softmax.cu: causal_softmax_bwd",
    reference="opset/attention.py: causal_softmax_bwd", test="test_fused_rows.py, test_kernels_step.py")
def causal_softmax_bwd(p, ds, rows_q: int, scale) -> None:
    """In place over ds = dP: dS = P * (dP - rowsum(dP * P)) * scale."""
    if dispatch.gpu(p, ds):
        _softmax.causal_softmax_bwd(p, ds, rows_q, scale)
    elif dispatch.host(p, ds):
        fused_rows.causal_softmax_bwd(p, ds, rows_q, scale)
    else:
        _reference_softmax_bwd(p, ds, rows_q, scale)


@op("attention", cpu="host/fused_rows.cpp: attention_fwd", gpu="kernels/softmax.cu: causal_softmax_fwd + cuBLAS",
    reference="opset/attention.py: causal_attention_fwd", test="test_fused_rows.py, test_kernels_step.py")
def causal_attention_fwd(q, k, v, block: int | None = None, reference: bool = False):
    """(out (B, Tq, H, D), saved) for arrays q (B, Tq, H, D), k, v (B, Tk, Hkv, D) with Tk >= Tq:
    the queries are the LAST Tq positions. `block`: query rows per block (default query_blocks')."""
    xp = array_module(q)
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    G = H // Hkv
    scale = _scale(q.dtype, D)
    if dispatch.on_gpu(q):  # a GPU wants one big launch per product: one block of all the queries
        block = Tq
    elif is_low(q):  # bf16 / fp16 storage on the CPU: float32 arithmetic on the values, P rounded
        return lowp.attention_fwd(q, k, v)
    blocks = query_blocks(Tq, Tk, block)
    probs = [empty((B, Hkv, G * (b - a), n_k), q.dtype, q) for a, b, n_k in blocks]
    out = empty((B, Tq, H, D), q.dtype, q)
    q5, out5 = q.reshape(B, Tq, Hkv, G, D), out.reshape(B, Tq, Hkv, G, D)
    vh = v.transpose(0, 2, 1, 3)  # (B, Hkv, Tk, D), a view
    if not reference and fused_rows.attention_usable(q, k, v, out, *probs):  # the same blocks in C++, no copies
        fused_rows.attention_fwd(q, k, v, out, probs, blocks, scale)
        return out, (blocks, probs)
    softmax = _causal_softmax_rows if reference else causal_softmax_fwd

    def batch_rows(lo, hi):  # sequences lo..hi-1, block by block
        kt = keys_t(k[lo:hi])
        for (a, b, n_k), p in zip(blocks, probs):
            s = p[lo:hi]
            matmul(_heads(q5, lo, hi, a, b), kt[..., :n_k], out=s)
            softmax(s, b - a, scale)
            y = matmul(s, vh[lo:hi, :, :n_k])  # (n, Hkv, G*(b-a), D)
            out5[lo:hi, a:b] = y.reshape(hi - lo, Hkv, G, b - a, D).transpose(0, 3, 1, 2, 4)

    map_rows(batch_rows, B, sum(p[0].nbytes for p in probs), like=q, blas=True)
    return out, (blocks, probs)


@op("attention", cpu="host/fused_rows.cpp: attention_bwd", gpu="kernels/softmax.cu: causal_softmax_bwd + cuBLAS",
    reference="opset/attention.py: causal_attention_bwd", test="test_fused_rows.py, test_kernels_step.py")
def causal_attention_bwd(q, k, v, g, saved, reference: bool = False):
    """(dq, dk, dv) for the upstream gradient g (B, Tq, H, D) of causal_attention_fwd's output."""
    blocks, probs = saved
    if is_low(q) and not dispatch.on_gpu(q):
        return lowp.attention_bwd(q, k, v, g, saved)
    xp = array_module(g)
    B, Tq, H, D = q.shape
    Hkv = k.shape[2]
    G = H // Hkv
    scale = _scale(q.dtype, D)
    dq, dk, dv = empty(q.shape, g.dtype, g), empty(k.shape, g.dtype, g), empty(v.shape, g.dtype, g)
    q5, g5, dq5 = (x.reshape(B, Tq, Hkv, G, D) for x in (q, g, dq))
    kh = k.transpose(0, 2, 1, 3)  # (B, Hkv, Tk, D), a view
    if not reference and fused_rows.attention_usable(q, k, v, g, *probs):
        fused_rows.attention_bwd(q, k, v, g, probs, blocks, scale, dq, dk, dv)
        return dq, dk, dv
    softmax_bwd = _reference_softmax_bwd if reference or g.dtype != probs[0].dtype else causal_softmax_bwd
    order = sorted(range(len(blocks)), key=lambda i: -blocks[i][2])  # the block seeing all keys first

    def batch_rows(lo, hi):
        n = hi - lo
        vt = keys_t(v[lo:hi])
        dkh = dvh = None  # (n, Hkv, Tk, D): the first block writes them, the others add
        for i in order:
            (a, b, n_k), p = blocks[i], probs[i][lo:hi]
            gb, qb = _heads(g5, lo, hi, a, b), _heads(q5, lo, hi, a, b)
            dv_part = matmul(p.swapaxes(-1, -2), gb)  # P^T dO: sums a group's query heads
            ds = matmul(gb, vt[..., :n_k])  # dP, overwritten by dS
            softmax_bwd(p, ds, b - a, scale)
            dk_part = matmul(ds.swapaxes(-1, -2), qb)
            if dkh is None:
                dkh, dvh = dk_part, dv_part
            else:
                dkh[:, :, :n_k] += dk_part
                dvh[:, :, :n_k] += dv_part
            y = matmul(ds, kh[lo:hi, :, :n_k])
            dq5[lo:hi, a:b] = y.reshape(n, Hkv, G, b - a, D).transpose(0, 3, 1, 2, 4)
        dk[lo:hi] = dkh.transpose(0, 2, 1, 3)
        dv[lo:hi] = dvh.transpose(0, 2, 1, 3)

    map_rows(batch_rows, B, sum(p[0].nbytes for p in probs), like=g, blas=True)
    return dq, dk, dv


def _reference_softmax_bwd(p, ds, rows_q: int, scale) -> None:
    ds -= (ds * p).sum(axis=-1, keepdims=True)
    ds *= p
    ds *= scale
