"""The embedding's backward: the rows of the output gradient summed into the rows of their token
ids (phases T02, T04, T07).

    gw = embedding_bwd(ids, g, V)      ids (N,) int, g (N, D) -> gw (V, D)

A token that appears several times receives the sum of its rows, in position order (np.add.at's
order: deterministic). A GPU sorts the positions by (id, position) and runs one block per token's
run of positions (kernels/embedding.cu, no atomics); the CPU gives each thread a range of vocabulary
rows (C++, runtime/host/fused_rows.cpp); the NumPy reference does the same with np.add.at.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.allocator import empty
from xtrain_lessons.runtime.cpu_threads import get_threads, map_rows
from xtrain_lessons.runtime.device import array_module, scatter_add
from xtrain_lessons.runtime.host import fused_rows
from xtrain_lessons.runtime.kernels import embedding as _embedding
from xtrain_lessons.runtime.opset import dispatch
from xtrain_lessons.runtime.opset.table import op

__all__ = ["embedding_bwd"]


@op("embedding", cpu="host/fused_rows.cpp: embedding_bwd", gpu="kernels/embedding.cu: embedding_bwd",
    reference="opset/embedding.py: _embedding_bwd_rows", test="test_kernels_step.py")
def embedding_bwd(ids, g, V: int):
    """gw (V, D) = the rows of g (N, D) summed into rows ids (N,) (ids on g's device)."""
    gw = empty((V, g.shape[1]), g.dtype, g)
    if dispatch.gpu(g, gw):
        kernel = _embedding.embedding_bwd
    elif dispatch.host(g, gw):
        kernel = fused_rows.embedding_bwd
    else:
        _embedding_bwd_rows(ids, g, gw)
        return gw
    kernel(array_module(g).ascontiguousarray(ids, dtype=np.int64), g, gw)
    return gw


def _embedding_bwd_rows(flat, g2, gw) -> None:
    V = gw.shape[0]

    def vocab_rows(lo, hi):  # the rows of token ids lo..hi-1, one range per thread
        part = gw[lo:hi]
        part[...] = 0
        if lo == 0 and hi == V:
            scatter_add(part, flat, g2)  # fast in NumPy >= 1.25
        else:  # this range's tokens, in their order: the same additions as one call
            mine = (flat >= lo) & (flat < hi)
            scatter_add(part, flat[mine] - lo, g2[mine])

    map_rows(vocab_rows, V, 1, like=gw, block_bytes=-(-V // get_threads()))
