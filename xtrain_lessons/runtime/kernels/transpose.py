"""Matrix transpose: launchers for kernels/transpose.cu (naive and tiled) and the NumPy reference.

    from xtrain_lessons.runtime.kernels.transpose import transpose
    out = transpose(x)                  # the shared-memory tiled kernel: out == x.T, contiguous
    out = transpose(x, tiled=False)     # one thread per element, uncoalesced writes

The tiled kernel moves 32x32 tiles through shared memory so that both its reads and its writes
are coalesced; see the comments in transpose.cu and notebook T02 for the segment counts.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.cuda import load_kernel
from xtrain_lessons.runtime.device import array_module, kernel_backend

TILE = 32


def _check_matrix(x) -> None:
    if x.dtype != np.float32:
        raise TypeError(f"transpose: expected a float32 array, got {x.dtype} (convert with .astype(np.float32))")
    if x.ndim != 2:
        raise ValueError(f"transpose: expected a 2-D array, got shape {x.shape}")
    if not x.flags.c_contiguous:
        raise ValueError("transpose: the array is not C-contiguous (use ascontiguousarray)")


def transpose(x, tiled: bool = True, block: tuple[int, int] | None = None):
    """x.T as a new C-contiguous float32 array, computed by a CUDA kernel.

    tiled=True: blocks of (32, block_rows) threads, block_rows dividing 32 (default 8).
    tiled=False: any 2-D block (default (32, 8)); one thread per element."""
    xp = array_module(x)
    _check_matrix(x)
    rows, cols = x.shape
    out = xp.empty((cols, rows), dtype=xp.float32)
    if x.size == 0:
        return out
    backend = kernel_backend(xp)
    bx, by = block or (TILE, 8)
    if tiled:
        if bx != TILE or by < 1 or TILE % by:
            raise ValueError(f"transpose_tiled needs block = (32, R) with R dividing 32, got {(bx, by)}")
        grid = ((cols + TILE - 1) // TILE, (rows + TILE - 1) // TILE)
        kernel = load_kernel("transpose.cu", "transpose_tiled", backend=backend)
    else:
        grid = ((cols + bx - 1) // bx, (rows + by - 1) // by)
        kernel = load_kernel("transpose.cu", "transpose_naive", backend=backend)
    kernel(grid, (bx, by), (x, out, np.int32(rows), np.int32(cols)))
    return out


def transpose_reference(x):
    """The NumPy reference: a contiguous copy of x.T."""
    return np.ascontiguousarray(np.asarray(x, dtype=np.float32).T)
