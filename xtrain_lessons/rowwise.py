"""Fusion on the CPU: elementwise chains run on cache-sized blocks of rows, on every core
(phase T07).

NumPy evaluates `d = (1 - s) * a + 1` one whole-array pass at a time, each pass writing a
temporary as large as the input. At training sizes (a few MiB per activation) every pass
goes out to main memory and back, and only one core works (T07 measures the SwiGLU
backward, about ten such passes, whole-array against row blocks).
`map_rows(fn, n_rows, row_bytes)` calls `fn(lo, hi)` on blocks of about BLOCK_BYTES per
array (they stay in the core's L2 cache between passes) and hands the blocks to a small
thread pool (NumPy releases the GIL inside its loops). That is what a fused GPU kernel does
for the same chain: one trip to memory, all the cores.

    out = np.empty_like(x)
    def block(lo, hi):                       # rows lo..hi-1 of every array
        np.multiply(x[lo:hi], w, out=out[lo:hi])
        return x[lo:hi].sum(axis=0)          # optional: a partial sum over the block's rows
    partials = map_rows(block, len(x), x[0].nbytes)

Determinism: the blocks depend only on `n_rows` and `row_bytes`, never on the thread count,
and `fn`'s return values come back in row order, so a sum over rows added up block by block
(`sum_blocks`) is the same number with 1 or 8 threads. Row-local arithmetic is unchanged by
blocking; only sums over rows round differently from one whole-array sum.

Threads: `set_blas_threads(n)` sets both NumPy's OpenBLAS threads and this pool (`xtrain
train --threads`, `xtrain bench --threads`); default: the CPU count. `map_rows(..., blas=True)`
is for blocks that call matmul: BLAS is switched to one thread while the blocks run, so the
cores work on different blocks instead of splitting each small matmul (attention's
128x128x48 products, one per sequence and head). On CuPy arrays (`like=`),
`fn(0, n_rows)` runs once: a GPU wants one big launch, not blocks.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

__all__ = ["BLOCK_BYTES", "map_rows", "sum_blocks", "set_threads", "get_threads", "blocks",
           "blas_threads", "set_blas_threads"]

BLOCK_BYTES = 128 * 1024  # per array and block: a few arrays of this fit in a 1-2 MiB L2

_threads = max(1, min(os.cpu_count() or 1, 8))
_pool: ThreadPoolExecutor | None = None
_pool_pid = None  # the process that made _pool
_pool_lock = threading.Lock()
_local = threading.local()  # set inside pool workers: nested map_rows calls run inline


# ----- NumPy's OpenBLAS thread count, at run time (what threadpoolctl does) ----------------

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
            "openblas_set_num_threads64_", "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads",
            "openblas_get_num_threads64_", "openblas_get_num_threads")
_blas_fns = None  # (getters, setters) found in the loaded OpenBLAS libraries


def _blas():
    global _blas_fns
    if _blas_fns is None:
        import ctypes  # noqa: PLC0415
        import re  # noqa: PLC0415

        getters, setters = [], []
        try:
            maps = open("/proc/self/maps", encoding="utf-8").read()  # Linux: loaded libraries
        except OSError:
            maps = ""
        for path in sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", maps))):
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            for names, found in ((_GETTERS, getters), (_SETTERS, setters)):
                fn = next((getattr(lib, n) for n in names if hasattr(lib, n)), None)
                if fn is not None:
                    found.append(fn)
        _blas_fns = (getters, setters)
    return _blas_fns


def blas_threads() -> int | None:
    """Threads NumPy's OpenBLAS uses (None if it cannot be asked)."""
    getters, _ = _blas()
    return int(getters[0]()) if getters else None


def _set_blas_only(n: int) -> bool:
    _, setters = _blas()
    for fn in setters:
        fn(int(n))
    return bool(setters)


def set_blas_threads(n: int) -> bool:
    """Use `n` CPU threads: NumPy's OpenBLAS threads and this module's pool. Returns True if
    OpenBLAS could be set. On a busy machine 1 thread can be several times faster than 2:
    OpenBLAS threads spin while waiting for each other."""
    set_threads(n)
    return _set_blas_only(n)


# ----- the row-block pool ----------------------------------------------------------------

def set_threads(n: int) -> None:
    """Use `n` threads (the caller plus n - 1 pool workers) for map_rows (BLAS untouched)."""
    global _threads, _pool
    n = int(n)
    if n < 1:
        raise ValueError(f"set_threads: need at least 1 thread, got {n}")
    with _pool_lock:
        if n != _threads and _pool is not None:
            if _pool_pid == os.getpid():
                _pool.shutdown(wait=True)
            _pool = None
        _threads = n


def get_threads() -> int:
    return _threads


def _get_pool() -> ThreadPoolExecutor:
    global _pool, _pool_pid
    with _pool_lock:
        if _pool is None or _pool_pid != os.getpid():  # a forked child has no worker threads
            _pool = ThreadPoolExecutor(_threads - 1, thread_name_prefix="xtrain-rows",
                                       initializer=_mark_worker)
            _pool_pid = os.getpid()
        return _pool


def _mark_worker():
    _local.worker = True


def blocks(n_rows: int, row_bytes: int, block_bytes: int = BLOCK_BYTES) -> list[tuple[int, int]]:
    """The (lo, hi) row ranges map_rows uses: equal blocks of about `block_bytes`."""
    n_rows = int(n_rows)
    if n_rows <= 0:
        return []
    per = max(1, int(block_bytes) // max(1, int(row_bytes)))
    return [(lo, min(lo + per, n_rows)) for lo in range(0, n_rows, per)]


def map_rows(fn, n_rows: int, row_bytes: int, *, like=None, blas: bool = False,
             block_bytes: int = BLOCK_BYTES) -> list:
    """[fn(lo, hi) for each block] in row order, blocks spread over the thread pool.

    `fn` must only touch rows lo..hi-1 of the arrays it writes (blocks run concurrently).
    `like`: an array of the op; when it is not a NumPy array (CuPy), `[fn(0, n_rows)]`.
    `blas=True`: the blocks call matmul; OpenBLAS runs single-threaded meanwhile.
    An exception raised in a block is raised here once every thread has stopped (a thread's
    remaining blocks are skipped after its error), so nothing is still writing.
    """
    if like is not None and not isinstance(like, np.ndarray):
        return [fn(0, n_rows)]
    spans = blocks(n_rows, row_bytes, block_bytes)
    if len(spans) <= 1 or _threads == 1 or getattr(_local, "worker", False):
        return [fn(lo, hi) for lo, hi in spans]
    # contiguous groups of blocks, one per thread; the caller runs the first group
    n = min(_threads, len(spans))
    groups = [spans[i * len(spans) // n:(i + 1) * len(spans) // n] for i in range(n)]

    def run(group):
        return [fn(lo, hi) for lo, hi in group]

    before = blas_threads() if blas else None
    if before and before > 1:
        _set_blas_only(1)
    try:
        return _run_groups(run, groups)
    finally:
        if before and before > 1:
            _set_blas_only(before)


def _run_groups(run, groups):
    pool = _get_pool()
    futures = [pool.submit(run, g) for g in groups[1:]]
    results, error = [], None
    try:
        results.extend(run(groups[0]))
    except BaseException as e:  # noqa: BLE001 - re-raised below, after the workers finish
        error = e
    for f in futures:
        try:
            results.extend(f.result())
        except BaseException as e:  # noqa: BLE001
            error = error or e
    if error is not None:
        raise error
    return results


def sum_blocks(partials):
    """Sum per-block partial results in order (a fixed order: deterministic)."""
    it = iter(partials)
    total = next(it).copy()
    for p in it:
        total += p
    return total
