"""Token embeddings: launchers for kernels/embedding.cu (gather forward, scatter-add backward)
and their NumPy references.

    from xtrain_lessons.runtime.kernels.embedding import embedding_forward, embedding_backward
    out = embedding_forward(ids, weight)                  # (*ids.shape, dim) = weight[ids]
    dweight = embedding_backward(ids, dout, vocab)        # (vocab, dim): rows summed per id

ids may have any shape and any integer dtype (they are checked to lie in [0, vocab), then
passed to the kernel as int32); weight and dout must be C-contiguous float32.

The GPU engine's backward (T07b), the CUDA twin of runtime/host/fused_rows' embedding_bwd:

    embedding_bwd(ids, g, gw)
        ids (N,) int64, already range-checked by the caller (the launcher never reads them: no
        host synchronisation); g (N, D) of float32, bfloat16 or float16; gw (V, D) float32,
        zeroed by the launcher (gw.fill(0), a memset); gw[v] = the sum of g[t] over the tokens t
        with ids[t] = v, in token order, without atomics: the positions are sorted by (id,
        position) (one argsort), and the block at the start of each token's run adds its rows.
        Deterministic, and the bits of fused_rows' C++ (np.add.at's order) on the same input: an
        atomic scatter-add would complete in any order and change a row's last bits run to run.
        Reference: embedding_bwd_reference(ids, g, vocab) (float64).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.cuda import load_kernel
from xtrain_lessons.runtime.device import array_module, kernel_backend
from xtrain_lessons.runtime.kernels._common import F32, MAX_GRID, STORAGE, check, device_of, grid_for, kernel, \
    name_expression

BLOCK = 256
NAME_EXPRESSIONS = tuple(name_expression("embedding_bwd", T) for T in STORAGE)  # embedding_bwd's


def _check_float32(x, what: str) -> None:
    if x.dtype != np.float32:
        raise TypeError(f"{what}: expected a float32 array, got {x.dtype} (convert with .astype(np.float32))")
    if not x.flags.c_contiguous:
        raise ValueError(f"{what}: the array is not C-contiguous (use ascontiguousarray)")


def _checked_ids(ids, vocab: int, xp):
    """ids as a contiguous int32 array of the same device; IndexError naming the first bad id."""
    if ids.dtype.kind not in "iu":
        raise TypeError(f"ids: expected an integer array, got {ids.dtype}")
    if ids.size:
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= vocab:
            flat = ids.reshape(-1)
            bad = int(xp.argmax((flat < 0) | (flat >= vocab)))
            raise IndexError(f"token id {int(flat[bad])} at position {bad} is out of range for a vocabulary "
                             f"of {vocab} (ids must lie in [0, {vocab}))")
    return xp.ascontiguousarray(ids, dtype=xp.int32)


def embedding_forward(ids, weight, block: int = BLOCK):
    """weight[ids]: shape (*ids.shape, dim), gathered by the CUDA kernel."""
    xp = array_module(weight)
    _check_float32(weight, "weight")
    if weight.ndim != 2:
        raise ValueError(f"weight: expected shape (vocab, dim), got {weight.shape}")
    vocab, dim = weight.shape
    ids32 = _checked_ids(ids, vocab, xp)
    out = xp.empty((*ids.shape, dim), dtype=xp.float32)
    n = ids32.size * dim
    if n == 0:
        return out
    kernel = load_kernel("embedding.cu", "embedding_forward", backend=kernel_backend(xp))
    kernel(((n + block - 1) // block,), (block,),
           (ids32, weight, out, np.int32(ids32.size), np.int32(vocab), np.int32(dim)))
    return out


def embedding_backward(ids, dout, vocab: int, block: int = BLOCK):
    """dweight (vocab, dim) with dweight[v] = sum of dout[t] over the positions t where ids[t] = v,
    accumulated by the CUDA kernel with atomicAdd (summation order unspecified)."""
    xp = array_module(dout)
    _check_float32(dout, "dout")
    ids32 = _checked_ids(ids, vocab, xp)
    if dout.shape[:-1] != tuple(ids.shape):
        raise ValueError(f"dout: expected shape {(*ids.shape, 'dim')}, got {dout.shape}")
    dim = dout.shape[-1]
    dweight = xp.zeros((vocab, dim), dtype=xp.float32)
    n = ids32.size * dim
    if n == 0:
        return dweight
    kernel = load_kernel("embedding.cu", "embedding_backward", backend=kernel_backend(xp))
    kernel(((n + block - 1) // block,), (block,),
           (ids32, dout, dweight, np.int32(ids32.size), np.int32(vocab), np.int32(dim)))
    return dweight


def embedding_forward_reference(ids, weight):
    """The NumPy reference: fancy indexing."""
    return np.asarray(weight, dtype=np.float32)[np.asarray(ids)]


def embedding_backward_reference(ids, dout, vocab: int):
    """The NumPy reference: np.add.at sums the rows of dout into dweight, in float64."""
    ids = np.asarray(ids).reshape(-1)
    dout = np.asarray(dout, dtype=np.float64).reshape(ids.size, -1)
    dweight = np.zeros((vocab, dout.shape[1]), np.float64)
    np.add.at(dweight, ids, dout)
    return dweight.astype(np.float32)


def embedding_bwd(ids, g, gw) -> None:
    """gw = 0, then gw[id] = the sum of g's rows at the positions of token id, in position order
    (np.add.at's, the CPU's order: deterministic, no atomics): the positions sorted by (id,
    position) with one argsort, then one block per run of a token's positions."""
    fn = "embedding_bwd"
    xp = device_of(fn, "g", g)
    check(fn, "g", g, xp, STORAGE)
    if g.ndim != 2:
        raise ValueError(f"{fn}: g must have shape (N, D), got {tuple(g.shape)}")
    N, D = g.shape
    check(fn, "ids", ids, xp, (np.int64,), (N,))
    check(fn, "gw", gw, xp, (F32,))
    if gw.ndim != 2 or gw.shape[1] != D:
        raise ValueError(f"{fn}: gw must have shape (V, {D}), got {tuple(gw.shape)}")
    gw.fill(0)
    if N and D:
        order = xp.argsort(ids * np.int64(N) + xp.arange(N, dtype=xp.int64))  # by (id, position): unique keys
        k = kernel("embedding.cu", name_expression(fn, g.dtype), NAME_EXPRESSIONS, xp)
        k((min(N, MAX_GRID),), (min(32 * -(-D // 32), BLOCK),),
          (ids, order.astype(xp.int64, copy=False), g, gw, np.int64(N), np.int32(gw.shape[0]), np.int32(D)))


def embedding_bwd_reference(ids, g, vocab: int):
    """float64 (vocab, D): the rows of g summed into rows ids (np.add.at)."""
    g64 = np.asarray(g).astype(np.float64)
    gw = np.zeros((vocab, g64.shape[1]), np.float64)
    np.add.at(gw, np.asarray(ids), g64)
    return gw
