"""Flash-attention in array code (phase T14): exact attention without the [T, T] matrix.

Composed attention (`layers.causal_attention`) materialises the scores S = q k^T / sqrt(D) and
the probabilities P = softmax(S) for every head: T x T numbers, kept for backward. Here the
forward walks over key/value tiles with the *online softmax* (a running row maximum m, a
running row sum l, and an accumulator rescaled whenever m grows) and keeps only the output O
and the per-row logsumexp L = m + log(l). The backward recomputes each tile of P from
q, k and L (P = exp(S - L)) and uses D = rowsum(dO * O), which equals rowsum(dP * P).

    from xtrain_lessons.model.flash_attention import flash_attention, flash_attention_fwd
    out = flash_attention(q, k, v)                   # Tensors, layout of nn.causal_attention
    out, lse = flash_attention_fwd(q.data, k.data, v.data, block_q=32, block_k=32)

Shapes: q (B, Tq, H, D); k, v (B, Tk, Hkv, D) with Hkv dividing H (grouped-query attention:
query head h reads kv head h // G, G = H / Hkv) and Tk >= Tq (the queries are the last Tq
positions, as in `layers.attention_fwd`, so decoding with a KV cache works). lse: (B, H, Tq).
Array code against `xp` (NumPy or CuPy, taken from the input). Fully masked key tiles (all
keys in the future of every query of the tile) are skipped; the CUDA C version of the same
algorithm is `xtrain_lessons/runtime/kernels/flash_attention.cu`.

`attention_memory(...)` measures the bytes an attention call keeps for backward and its peak
(with tracemalloc, which sees every NumPy allocation); T14's notebook reports both paths.

On a GPU (CuPy arrays) the same node runs as CUDA C kernels instead of array code:
bfloat16 q, k, v (head dim <= 128) on the tensor cores (`runtime/kernels/flash_attention_tc.cu`:
mma.sync, float32 softmax statistics), float32 on the CUDA cores
(`runtime/kernels/flash_attention.cu`), chosen beneath `opset.flash_kernels`. `gpu_attention` is
the attention of the bf16 forward (model/precision.py): the tensor-core kernels where they apply,
composed attention otherwise (issue 39: flash-attention as the GPU's attention).
"""

from __future__ import annotations

import math

import numpy as np

from xtrain_lessons.autograd.tensor import Tensor, make_node
from xtrain_lessons.model.layers import causal_attention
from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.device import array_module

__all__ = ["flash_attention", "flash_attention_fwd", "flash_attention_bwd", "gpu_attention",
           "kernel_attention", "attention_reference", "saved_bytes",
           "attention_memory", "DEFAULT_BLOCK"]

DEFAULT_BLOCK = 64


def _check(q, k, v, block_q, block_k):
    B, Tq, H, D = q.shape
    if k.ndim != 4 or k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"flash_attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit "
                         f"(need q (B, Tq, H, D) and k, v (B, Tk, Hkv, D))")
    Tk, Hkv = k.shape[1], k.shape[2]
    if H % Hkv:
        raise ValueError(f"flash_attention: {H} query heads not divisible by {Hkv} kv heads")
    if Tk < Tq:
        raise ValueError(f"flash_attention: Tk={Tk} < Tq={Tq}")
    if int(block_q) < 1 or int(block_k) < 1:
        raise ValueError(f"flash_attention: block sizes must be >= 1, got {block_q}, {block_k}")
    return B, Tq, Tk, H, Hkv, D


def _grouped(x, Hkv):
    """(B, T, H, D) -> (B, Hkv, G, T, D): query head h = j*G + g goes to kv group j."""
    B, T, H, D = x.shape
    xp = array_module(x)
    return xp.ascontiguousarray(x.transpose(0, 2, 1, 3).reshape(B, Hkv, H // Hkv, T, D))


def _ungrouped(x):
    """(B, Hkv, G, T, D) -> (B, T, H, D), contiguous."""
    B, Hkv, G, T, D = x.shape
    xp = array_module(x)
    return xp.ascontiguousarray(x.reshape(B, Hkv * G, T, D).transpose(0, 2, 1, 3))


def _kv_end(i1, Tq, Tk, causal):
    """Number of keys any query of a tile ending (exclusively) at row i1 may see."""
    return min(Tk, Tk - Tq + i1) if causal else Tk


def _tile_mask(i0, i1, j0, j1, Tq, Tk, xp):
    """(i1-i0, j1-j0) bool, True where key j is in the future of query i (masked)."""
    qpos = Tk - Tq + xp.arange(i0, i1)
    return xp.arange(j0, j1)[None, :] > qpos[:, None]


def flash_attention_fwd(q, k, v, causal: bool = True, block_q: int = DEFAULT_BLOCK,
                        block_k: int = DEFAULT_BLOCK):
    """Arrays in: (out (B, Tq, H, D), lse (B, H, Tq)), in the dtype of q.

    For each query tile, over the key tiles j (online softmax, per row):
        S_j = q k_j^T / sqrt(D);  m' = max(m, rowmax S_j);  P_j = exp(S_j - m')
        l = exp(m - m') l + rowsum P_j;  acc = exp(m - m') acc + P_j v_j;  m = m'
    then out = acc / l and lse = m + log l.
    """
    B, Tq, Tk, H, Hkv, D = _check(q, k, v, block_q, block_k)
    xp = array_module(q)
    dt = q.dtype.type
    scale = dt(1.0 / math.sqrt(D))
    qg = _grouped(q, Hkv)  # (B, Hkv, G, Tq, D)
    kg = k.transpose(0, 2, 1, 3)[:, :, None]  # (B, Hkv, 1, Tk, D)
    vg = v.transpose(0, 2, 1, 3)[:, :, None]
    out = xp.empty_like(qg)  # (B, Hkv, G, Tq, D)
    lse = xp.empty(qg.shape[:-1], dtype=q.dtype)  # (B, Hkv, G, Tq)
    for i0 in range(0, Tq, block_q):
        i1 = min(i0 + block_q, Tq)
        qi = qg[:, :, :, i0:i1]  # (B, Hkv, G, bq, D)
        m = xp.full(qi.shape[:-1], -xp.inf, dtype=q.dtype)  # running row max
        l = xp.zeros(qi.shape[:-1], dtype=q.dtype)  # running row sum
        acc = xp.zeros(qi.shape, dtype=q.dtype)  # running (unnormalised) output
        for j0 in range(0, _kv_end(i1, Tq, Tk, causal), block_k):  # later tiles: all masked
            j1 = min(j0 + block_k, Tk)
            s = qi @ kg[:, :, :, j0:j1].swapaxes(-1, -2)  # (B, Hkv, G, bq, bk)
            s *= scale
            if causal and j1 - 1 > Tk - Tq + i0:  # the tile crosses the diagonal
                s[..., _tile_mask(i0, i1, j0, j1, Tq, Tk, xp)] = -xp.inf
            m_new = xp.maximum(m, s.max(axis=-1))  # finite: key 0 is visible to every row
            p = xp.exp(s - m_new[..., None])
            alpha = xp.exp(m - m_new)  # rescales what was summed under the old max
            l = alpha * l + p.sum(axis=-1)
            acc = alpha[..., None] * acc + p @ vg[:, :, :, j0:j1]
            m = m_new
        out[:, :, :, i0:i1] = acc / l[..., None]
        lse[:, :, :, i0:i1] = m + xp.log(l)
    return _ungrouped(out), lse.reshape(B, H, Tq)


def flash_attention_bwd(q, k, v, out, lse, dout, causal: bool = True,
                        block_q: int = DEFAULT_BLOCK, block_k: int = DEFAULT_BLOCK):
    """(dq, dk, dv) from the inputs, the saved out and lse, and dout (arrays).

    D = rowsum(dO * O). Over the key tiles j (outer) and query tiles i (inner):
        P = exp(S - L);  dV_j += P^T dO_i;  dP = dO_i v_j^T;  dS = P * (dP - D_i)
        dQ_i += dS k_j / sqrt(D);  dK_j += dS^T q_i / sqrt(D)
    dK and dV of a kv head sum over the G query heads of its group (a plain sum over an
    axis: deterministic, no atomics).
    """
    B, Tq, Tk, H, Hkv, D = _check(q, k, v, block_q, block_k)
    xp = array_module(q)
    dt = q.dtype.type
    scale = dt(1.0 / math.sqrt(D))
    G = H // Hkv
    qg, og, dog = _grouped(q, Hkv), _grouped(out, Hkv), _grouped(dout.astype(q.dtype, copy=False), Hkv)
    kg = k.transpose(0, 2, 1, 3)[:, :, None]  # (B, Hkv, 1, Tk, D)
    vg = v.transpose(0, 2, 1, 3)[:, :, None]
    L = lse.reshape(B, Hkv, G, Tq)
    Dr = (dog * og).sum(axis=-1)  # (B, Hkv, G, Tq): rowsum(dO * O) = rowsum(dP * P)
    dq = xp.zeros_like(qg)
    dk = xp.zeros((B, Hkv, Tk, D), dtype=q.dtype)
    dv = xp.zeros((B, Hkv, Tk, D), dtype=q.dtype)
    for j0 in range(0, Tk, block_k):
        j1 = min(j0 + block_k, Tk)
        kj, vj = kg[:, :, :, j0:j1], vg[:, :, :, j0:j1]  # (B, Hkv, 1, bk, D)
        # causal: the first query that sees key j0 is row j0 - (Tk - Tq)
        first = max(0, j0 - (Tk - Tq)) if causal else 0
        for i0 in range((first // block_q) * block_q, Tq, block_q):
            i1 = min(i0 + block_q, Tq)
            qi, doi = qg[:, :, :, i0:i1], dog[:, :, :, i0:i1]  # (B, Hkv, G, bq, D)
            s = qi @ kj.swapaxes(-1, -2)  # (B, Hkv, G, bq, bk)
            s *= scale
            if causal and j1 - 1 > Tk - Tq + i0:
                s[..., _tile_mask(i0, i1, j0, j1, Tq, Tk, xp)] = -xp.inf
            p = xp.exp(s - L[:, :, :, i0:i1, None])  # the probabilities, recomputed
            dv[:, :, j0:j1] += (p.swapaxes(-1, -2) @ doi).sum(axis=2)
            dp = doi @ vj.swapaxes(-1, -2)  # (B, Hkv, G, bq, bk)
            ds = p * (dp - Dr[:, :, :, i0:i1, None])
            ds *= scale
            dq[:, :, :, i0:i1] += ds @ kj
            dk[:, :, j0:j1] += (ds.swapaxes(-1, -2) @ qi).sum(axis=2)
    dk = xp.ascontiguousarray(dk.transpose(0, 2, 1, 3))  # (B, Tk, Hkv, D)
    dv = xp.ascontiguousarray(dv.transpose(0, 2, 1, 3))
    return _ungrouped(dq), dk, dv


def flash_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = True,
                    block_q: int = DEFAULT_BLOCK, block_k: int = DEFAULT_BLOCK) -> Tensor:
    """Attention as one graph node that saves only (out, lse) besides its inputs.

    Same layout and result as `layers.causal_attention` (with causal=True): q (B, Tq, H, D),
    k, v (B, Tk, Hkv, D) -> (B, Tq, H, D). On a GPU it runs as CUDA kernels (module doc;
    block_q / block_k then do not apply).
    """
    kernels = opset.flash_kernels(q.data, k.data, v.data)  # a GPU's CUDA kernels, or None
    if kernels is not None:
        return kernel_attention(q, k, v, kernels, causal)
    out, lse = flash_attention_fwd(q.data, k.data, v.data, causal, block_q, block_k)

    def backward(g):
        return flash_attention_bwd(q.data, k.data, v.data, out, lse, g, causal, block_q, block_k)

    return make_node(out, (q, k, v), backward, "flash_attention")


def kernel_attention(q: Tensor, k: Tensor, v: Tensor, kernels, causal: bool = True) -> Tensor:
    """Flash-attention as one node by compiled kernels (`opset.flash_kernels`: name, forward ->
    (o, lse), backward -> dq, dk, dv recomputed from them). Keeps o and lse for backward."""
    name, fwd, bwd = kernels
    out, lse = fwd(q.data, k.data, v.data, causal)

    def backward(g):
        return bwd(q.data, k.data, v.data, out, lse, g, causal)

    return make_node(out, (q, k, v), backward, name)


def gpu_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """The causal attention of the bf16 forward (model/precision.py): the flash kernels where they
    take the arrays (bf16 on a GPU: the tensor cores; O(T) memory, masked tiles skipped),
    `layers.causal_attention` for anything else (float16, head dims above 128, NumPy arrays)."""
    kernels = opset.flash_kernels(q.data, k.data, v.data)
    return causal_attention(q, k, v) if kernels is None else kernel_attention(q, k, v, kernels)


def attention_reference(q, k, v, causal: bool = True):
    """The plain formula, arrays in: (out (B, Tq, H, D), lse (B, H, Tq)), computed in float64
    with the full score matrix (K, V repeated per query head). The oracle of the tests."""
    xp = array_module(q)
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    G = H // Hkv
    qh = q.astype(np.float64).transpose(0, 2, 1, 3)  # (B, H, Tq, D)
    kh = xp.repeat(k.astype(np.float64).transpose(0, 2, 1, 3), G, axis=1)  # (B, H, Tk, D)
    vh = xp.repeat(v.astype(np.float64).transpose(0, 2, 1, 3), G, axis=1)
    s = qh @ kh.swapaxes(-1, -2) / math.sqrt(D)  # (B, H, Tq, Tk)
    if causal:
        s = xp.where(_tile_mask(0, Tq, 0, Tk, Tq, Tk, xp), -xp.inf, s)
    m = s.max(axis=-1, keepdims=True)
    e = xp.exp(s - m)
    lse = m[..., 0] + xp.log(e.sum(axis=-1))
    out = (e / e.sum(axis=-1, keepdims=True)) @ vh  # (B, H, Tq, D)
    return out.transpose(0, 2, 1, 3).astype(q.dtype), lse.astype(q.dtype)


# ----------------------------------------------------------------------------------------
# measuring memory


def saved_bytes(node: Tensor) -> int:
    """Bytes of the arrays a node's backward closure keeps alive beyond its inputs' own data.

    Looks into the closure cells of `node._backward` (one level, as our ops are written, and
    into lists and tuples there: causal attention keeps one array per block of queries):
    every array there that is not the data of a parent counts, once (views count at the
    size of their base)."""
    if node._backward is None:
        return 0
    parent_data = {id(p.data) for p in node._parents}
    seen, total = set(), 0
    cells = [cell.cell_contents for cell in node._backward.__closure__ or ()]
    for x in [x for c in cells for x in (c if isinstance(c, (list, tuple)) else [c])]:
        if hasattr(x, "nbytes") and hasattr(x, "shape") and id(x) not in parent_data:
            base = x
            while getattr(base, "base", None) is not None:
                base = base.base
            if id(base) not in seen and id(base) not in parent_data:
                seen.add(id(base))
                total += int(base.nbytes)
    return total


def attention_memory(attn, q, k, v, g) -> dict:
    """Measure one attention call `attn(q, k, v)` (Tensors) followed by its backward with
    upstream gradient `g` (an array). NumPy only (tracemalloc sees NumPy's allocations).

    Returns bytes: `saved` (closure arrays kept for backward, `saved_bytes`), `after_forward`
    (memory allocated by the forward and still held: output + saved), `peak` (the highest
    allocation above the starting point during forward and backward, the input gradients
    included). Inputs and g are allocated before the start and not counted.
    """
    import gc
    import tracemalloc

    for t in (q, k, v):
        t.grad = None
    gc.collect()
    was_tracing = tracemalloc.is_tracing()
    if not was_tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        out = attn(q, k, v)
        after_forward = tracemalloc.get_traced_memory()[0] - base
        saved = saved_bytes(out)
        out.backward(g)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if not was_tracing:
            tracemalloc.stop()
    del out
    for t in (q, k, v):
        t.grad = None
    return {"saved": saved, "after_forward": after_forward, "peak": peak}
