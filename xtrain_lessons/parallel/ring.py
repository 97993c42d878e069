"""A ring all-reduce written by hand: reduce-scatter, then all-gather, over send/recv.

The array on each of the W ranks is cut into W chunks (``np.array_split`` boundaries, so any
size works). Ranks form a ring: rank r sends to r+1 and receives from r-1 (mod W).

    reduce-scatter, step s = 0 .. W-2:  rank r sends chunk (r - s) mod W,
                                        receives chunk (r - s - 1) mod W and adds it in.
        After W-1 steps rank r holds the full sum of chunk (r + 1) mod W.
    all-gather, step s = 0 .. W-2:      rank r sends chunk (r + 1 - s) mod W,
                                        receives chunk (r - s) mod W and overwrites its own.

Each rank sends 2·(W-1) messages of n/W elements: 2·(W-1)/W·n in all, nearly independent of W
— the reason NCCL and gloo use rings (and trees) for large gradients.

``ring_schedule`` is the pure schedule, ``simulate_ring_all_reduce`` runs it on Python lists
(no processes), ``ring_all_reduce`` runs it between real processes through
``xtrain_lessons.parallel.collectives.sendrecv``.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.parallel import collectives

__all__ = ["ring_schedule", "chunk_bounds", "simulate_ring_all_reduce", "ring_all_reduce"]


def ring_schedule(world_size: int, rank: int, step: int, phase: str) -> tuple[int, int]:
    """(chunk sent, chunk received) by ``rank`` at ``step`` of ``phase``
    ("reduce_scatter" or "all_gather")."""
    W, r, s = world_size, rank, step
    if phase == "reduce_scatter":
        return (r - s) % W, (r - s - 1) % W
    if phase == "all_gather":
        return (r + 1 - s) % W, (r - s) % W
    raise ValueError(f"phase must be 'reduce_scatter' or 'all_gather', got {phase!r}")


def chunk_bounds(n: int, world_size: int) -> list[tuple[int, int]]:
    """[start, stop) of each of the W chunks of n elements (the first n % W get one more)."""
    q, rem = divmod(n, world_size)
    out, start = [], 0
    for c in range(world_size):
        stop = start + q + (1 if c < rem else 0)
        out.append((start, stop))
        start = stop
    return out


def simulate_ring_all_reduce(values: list[list[float]]) -> list[list[float]]:
    """Run the ring schedule on W lists (one per rank) in plain Python; return the W results.
    Messages of one step are all taken before any is applied, as on a real ring."""
    W, n = len(values), len(values[0])
    data = [list(v) for v in values]
    bounds = chunk_bounds(n, W)
    for phase in ("reduce_scatter", "all_gather"):
        for s in range(W - 1):
            msgs = []
            for r in range(W):
                c, _ = ring_schedule(W, r, s, phase)
                a, b = bounds[c]
                msgs.append(((r + 1) % W, c, data[r][a:b]))
            for dst, c, chunk in msgs:
                _, expect = ring_schedule(W, dst, s, phase)
                assert c == expect, "schedule mismatch"
                a, b = bounds[c]
                if phase == "reduce_scatter":
                    data[dst][a:b] = [x + y for x, y in zip(data[dst][a:b], chunk)]
                else:
                    data[dst][a:b] = chunk
    return data


def ring_all_reduce(arr: np.ndarray, dist=None) -> np.ndarray:
    """Sum ``arr`` over all ranks of the initialised group, in place, with the ring above.
    ``dist``: the collective layer (default ``xtrain_lessons.parallel.collectives``)."""
    dist = collectives if dist is None else dist
    W, r = dist.world_size(), dist.rank()
    if W == 1:
        return arr
    if not (isinstance(arr, np.ndarray) and arr.flags.c_contiguous):
        raise ValueError("ring_all_reduce works in place on a C-contiguous NumPy array")
    flat = arr.reshape(-1)  # a view of the same memory
    bounds = chunk_bounds(flat.size, W)
    buf = np.empty(max(b - a for a, b in bounds), dtype=flat.dtype)
    right, left = (r + 1) % W, (r - 1) % W
    for phase in ("reduce_scatter", "all_gather"):
        for s in range(W - 1):
            cs, cr = ring_schedule(W, r, s, phase)
            (a, b), (c, d) = bounds[cs], bounds[cr]
            got = dist.sendrecv(np.ascontiguousarray(flat[a:b]), right, buf[:d - c], left)
            if phase == "reduce_scatter":
                flat[c:d] += got
            else:
                flat[c:d] = got
    return arr
