"""Fusion on the CPU: elementwise chains run on cache-sized blocks of rows, on every core
(phase T07).

NumPy evaluates `d = (1 - s) * a + 1` one whole-array pass at a time, each pass writing a
temporary as large as the input. At training sizes (a few MiB per activation) every pass
goes out to main memory and back, and only one core works (T07 measures the SwiGLU
backward, about ten such passes, whole-array against row blocks).
`map_rows(fn, n_rows, row_bytes)` calls `fn(lo, hi)` on blocks of about BLOCK_BYTES per
array (they stay in the core's L2 cache between passes) and spreads the rows over a small
thread pool (NumPy releases the GIL inside its loops). That is what a fused GPU kernel does
for the same chain: one trip to memory, all the cores.

    out = np.empty_like(x)
    def rows(lo, hi):                        # rows lo..hi-1 of every array
        np.multiply(x[lo:hi], w, out=out[lo:hi])
        return [x[a:b].sum(axis=0) for a, b in grid(lo, hi, x[0].nbytes)]  # optional sums
    colsum = sum_blocks(map_rows(rows, len(x), x[0].nbytes))

Threads: with one thread `fn` runs once per cache-sized block. With n threads the blocks
are cut into n contiguous runs, one per thread, and `fn` runs ONCE per run, on all of its
rows: NumPy releases the GIL inside each call, but every call hands the GIL from thread to
thread, and when calls are short (tens of µs on a 128 KiB block) the hand-overs, each a
wake-up of a sleeping thread, eat into the gain (T07 measures it). Long calls on
large runs keep both cores busy; the cache effect is the smaller gain.
`set_blas_threads(n)` sets both NumPy's OpenBLAS threads and this pool (`xtrain train
--threads`, `xtrain bench --threads`); default: $XTRAIN_THREADS, else the CPU count (at most 8).

Determinism: the runs depend only on the sizes and the thread count, and row-local
arithmetic is the same on any run of rows, so outputs are the same bits with any thread
count. A sum over rows is not: `grid(lo, hi, row_bytes)` lists the fixed cache-sized blocks
inside a run (the same blocks whatever the thread count), so a per-block partial sum, added
up in row order by `sum_blocks`, is the same number with 1 or 8 threads.

Matmuls: `matmul(a, b)` cuts a 2-D product into fixed chunks of rows (`matmul_chunks`: MATMUL_ROWS,
fewer for a short product; the same for any thread count) that the threads take one by one, with OpenBLAS single-threaded
inside (`map_rows(..., blas=True)` does the same for any block); `matmuls(*pairs)` does
several products in one hand-over (a linear layer's dx and dW). Fixed chunks, not one band
per thread: OpenBLAS chooses its kernel by the size of a product, and on some CPUs (AVX-512
ones, measured) kernels for different sizes sum in different orders, so a band per thread
would give other bits with another thread count.
`map_items(fn, sizes)` shares out whole arrays instead of rows, for work whose bits depend
on taking an array whole (one reduction per gradient in the global norm).
The engine never lets OpenBLAS run its own threads during a step: they spin on the cores
for a while after each matmul waiting for more work (that is how OpenBLAS hides its
wake-up cost) and the spinning thread takes the core the next NumPy call on the pool
needed. One set of threads for everything, as torch has with OpenMP. On CuPy arrays
(`like=`), `fn(0, n_rows)` runs once: a GPU wants one big launch, not blocks.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from xtrain_lessons.runtime import blas
from xtrain_lessons.runtime.allocator import empty

__all__ = ["BLOCK_BYTES", "map_rows", "map_items", "matmul", "matmuls", "matmul_chunks", "map_chunks", "sum_blocks",
           "set_threads", "get_threads", "blocks", "grid", "runs", "split_items", "blas_threads",
           "set_blas_threads", "blas_threads_set", "in_parallel_region", "one_blas_thread", "set_gemm_runner",
           "cache_bytes"]

BLOCK_BYTES = 128 * 1024  # per array and block: a few arrays of this fit in a 1-2 MiB L2
MATMUL_SPLIT_FLOPS = 1 << 23  # below this a product is one call: splitting would cost more
# the rows of one chunk of a split product (T07 measures what cutting costs): every chunk
# call repacks the right-hand matrix, so 256-row chunks cost 5-15% of a single call on one
# thread here (more with K x N large: 31% at 512 x 1376); 1024 rows: a step of the 20M
# preset 9% faster on 1 and 2 threads, the tiny one 1.5-5%, the same bits for it on this CPU
MATMUL_ROWS = 1024
MATMUL_MIN_ROWS = 128  # a product of fewer than 2 x 1024 rows is cut in smaller halves, down to
# this: two threads then share its forward (at 8 x 128 tokens a 2-thread step 17% faster, a
# 1-thread one 1.4% slower)



def _default_threads() -> int:
    """$XTRAIN_THREADS when set (CI runs the tests again with 1), else the CPU count, at most 8."""
    value = os.environ.get("XTRAIN_THREADS", "").strip()
    if value.isdigit() and int(value) >= 1:
        return int(value)
    if value:
        print(f"xtrain: ignoring XTRAIN_THREADS={value!r} (give a number of threads >= 1)", file=sys.stderr)
    return max(1, min(os.cpu_count() or 1, 8))


_threads = _default_threads()
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
        getters, setters = [], []
        for lib in blas.openblas_libraries():
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


@contextlib.contextmanager
def _blas_single():
    """OpenBLAS on one thread inside the block (the engine's threads do the splitting),
    its own setting back afterwards."""
    before = blas_threads()
    if before and before > 1:
        _set_blas_only(1)
    try:
        yield
    finally:
        if before and before > 1:
            _set_blas_only(before)


def one_blas_thread():
    """Context manager: OpenBLAS on one thread inside the block (for code that calls BLAS from
    several threads of its own: runtime/host's attention), its own setting back afterwards."""
    return _blas_single()


def set_blas_threads(n: int) -> bool:
    """Use `n` CPU threads: NumPy's OpenBLAS threads and this module's pool. Returns True if
    OpenBLAS could be set. The engine's own matmuls keep OpenBLAS single-threaded inside
    (see the module docstring); the OpenBLAS setting is for other NumPy matmuls."""
    set_threads(n)
    return _set_blas_only(n)


@contextlib.contextmanager
def blas_threads_set(n: int):
    """`set_blas_threads(n)` inside the block, the process's setting back afterwards (n = 0:
    leave the threads as they are)."""
    before = blas_threads() if n else None
    if n:
        set_blas_threads(n)
    try:
        yield
    finally:
        if before:
            set_blas_threads(before)


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


def cache_bytes(level: int) -> int | None:
    """The size of CPU 0's level-`level` data or unified cache as Linux reports it (sysfs), or None
    where it does not say (another OS): what row blocks (BLOCK_BYTES) are sized to fit beside."""
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    for index in sorted(root.glob("index*")) if root.is_dir() else []:
        try:
            if int((index / "level").read_text()) != level or (index / "type").read_text().strip() == "Instruction":
                continue
            text = (index / "size").read_text().strip().upper()
        except (OSError, ValueError):
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        return int(digits) * scale if digits.isdigit() else None
    return None


def blocks(n_rows: int, row_bytes: int, block_bytes: int = BLOCK_BYTES) -> list[tuple[int, int]]:
    """The fixed grid of (lo, hi) row blocks of about `block_bytes` (one thread's calls)."""
    return grid(0, n_rows, row_bytes, block_bytes)


def grid(lo: int, hi: int, row_bytes: int, block_bytes: int = BLOCK_BYTES) -> list[tuple[int, int]]:
    """The grid blocks inside rows lo..hi-1, for a run that starts on the grid (as every
    span map_rows passes to `fn` does): the same blocks whatever the thread count."""
    lo, hi = int(lo), int(hi)
    per = max(1, int(block_bytes) // max(1, int(row_bytes)))
    return [(a, min(a + per, hi)) for a in range(lo, hi, per)]


def runs(n_rows: int, row_bytes: int, block_bytes: int = BLOCK_BYTES,
         threads: int | None = None) -> list[tuple[int, int]]:
    """The spans map_rows calls `fn` on: the grid blocks with one thread; with n threads,
    n contiguous runs of grid blocks, one per thread."""
    spans = blocks(n_rows, row_bytes, block_bytes)
    n = min(threads or _threads, len(spans))
    if n <= 1:
        return spans
    cuts = [i * len(spans) // n for i in range(n + 1)]
    return [(spans[cuts[i]][0], spans[cuts[i + 1] - 1][1]) for i in range(n)]


def map_rows(fn, n_rows: int, row_bytes: int, *, like=None, blas: bool = False,
             block_bytes: int = BLOCK_BYTES) -> list:
    """[fn(lo, hi) for each span of `runs(...)`] in row order, one span per thread.

    `fn` must only touch rows lo..hi-1 of the arrays it writes (spans run concurrently).
    `like`: an array of the op; when it is not a NumPy array (CuPy), `[fn(0, n_rows)]`.
    `blas=True`: the spans call matmul; OpenBLAS runs single-threaded meanwhile.
    An exception raised in a span is raised here once every thread has stopped, so nothing
    is still writing.
    """
    if like is not None and not isinstance(like, np.ndarray):
        return [fn(0, n_rows)]
    if getattr(_local, "worker", False):  # nested: already on one of the threads
        return [fn(lo, hi) for lo, hi in blocks(n_rows, row_bytes, block_bytes)]
    spans = runs(n_rows, row_bytes, block_bytes)
    if len(spans) <= 1 or _threads == 1:
        return [fn(lo, hi) for lo, hi in spans]
    with _blas_single() if blas else contextlib.nullcontext():
        return _run_spans(fn, spans)


_gemm_runner = None  # runtime/host's C++ pool registers itself here (it imports this module)


def set_gemm_runner(runner) -> None:
    """`runner(products) -> bool` runs [(a, b, out), ...] (each out = a @ b) in that order of
    taking, or returns False; matmuls() hands its chunks to it first. None: Python's threads."""
    global _gemm_runner
    _gemm_runner = runner


def matmul_chunks(M: int, K: int, N: int) -> list[tuple[int, int]]:
    """The fixed pieces (lo, hi) of the rows of an (M, K) @ (K, N) product: MATMUL_ROWS rows
    each, halved (down to MATMUL_MIN_ROWS) until there are at least two, or the whole product
    when it is too small to be worth splitting. They depend on the shape only, never on the
    thread count."""
    if 2 * M * K * N < MATMUL_SPLIT_FLOPS:
        return [(0, M)] if M else []
    rows = MATMUL_ROWS
    while rows > MATMUL_MIN_ROWS and M < 2 * rows:
        rows //= 2
    return [(lo, min(lo + rows, M)) for lo in range(0, M, rows)]


def matmul(a, b, out=None):
    """a @ b for 2-D arrays, cut into the fixed row chunks of `matmul_chunks` and spread over
    the engine's threads (OpenBLAS single-threaded inside). `a` may be a transposed view
    (`g.T @ x`). The same bits for any thread count."""
    if a.ndim != 2 or b.ndim != 2:
        return a @ b if out is None else np.matmul(a, b, out=out)
    return matmuls((a, b), outs=[out])[0]


def matmuls(*pairs, outs=None):
    """[a @ b for a, b in pairs] in ONE hand-over to the threads (a linear layer's backward:
    dx and dW together). Every product is cut into its fixed row chunks (`matmul_chunks`);
    each thread takes the next chunk nobody has started, largest first, until none is left.
    A chunk is one `blas.gemm` call (MKL's sgemm when installed, else np.matmul with OpenBLAS)
    on one thread, the same call whichever thread
    makes it, so the result does not depend on the thread count. (Cutting the rows by thread
    count instead would not do: OpenBLAS picks its kernel by the size of the product, and
    on some CPUs another kernel sums in another order — measured in tests/test_cpu_threads.py.)"""
    outs = list(outs) if outs is not None else [None] * len(pairs)
    if not all(a.ndim == 2 and b.ndim == 2 for a, b in pairs):
        return [a @ b if o is None else np.matmul(a, b, out=o) for (a, b), o in zip(pairs, outs)]
    outs = [empty((a.shape[0], b.shape[1]), np.result_type(a, b)) if o is None else o  # T11
            for (a, b), o in zip(pairs, outs)]
    tasks = []  # (FLOPs, a rows, b, out rows)
    for (a, b), out in zip(pairs, outs):
        (M, K), N = a.shape, b.shape[1]
        tasks += [(2 * (hi - lo) * K * N, a[lo:hi], b, out[lo:hi]) for lo, hi in matmul_chunks(M, K, N)]
    tasks.sort(key=lambda t: -t[0])  # largest first: the threads finish together (stable sort)
    if _gemm_runner is not None and _gemm_runner([(a, b, out) for _, a, b, out in tasks]):
        return outs  # the same calls on runtime/host's C++ pool: a hand-over of a microsecond
    with _blas_single():
        if _threads == 1 or len(tasks) == 1 or getattr(_local, "worker", False):
            for _, a, b, out in tasks:
                blas.gemm(a, b, out)
        else:
            _run_tasks([lambda a=a, b=b, out=out: blas.gemm(a, b, out) for _, a, b, out in tasks])
    return outs


def map_chunks(fn, chunks, *, like=None) -> None:
    """fn(lo, hi) for each (lo, hi) of `chunks` (e.g. `matmul_chunks`), taken by the threads
    one by one as in `matmuls`, OpenBLAS single-threaded meanwhile: for work fused onto a
    matmul's row chunks (the lm_head and its cross-entropy). `fn` touches its rows only."""
    if like is not None and not isinstance(like, np.ndarray):
        fn(chunks[0][0], chunks[-1][1])
        return
    with _blas_single():
        if _threads == 1 or len(chunks) == 1 or getattr(_local, "worker", False):
            for lo, hi in chunks:
                fn(lo, hi)
        else:
            _run_tasks([lambda lo=lo, hi=hi: fn(lo, hi) for lo, hi in chunks])


def _run_tasks(tasks) -> None:
    """Run zero-argument callables on the engine's threads; each thread takes the next task
    nobody has started, until none is left (a dynamic schedule: tasks of unequal size)."""
    lock, order = threading.Lock(), iter(range(len(tasks)))

    def drain(_t, _):
        while True:
            with lock:
                i = next(order, None)
            if i is None:
                return
            tasks[i]()

    n = min(_threads, len(tasks))
    _run_spans(drain, [(t, t + 1) for t in range(n)])


def split_items(sizes, threads: int | None = None) -> list[tuple[int, int]]:
    """Cut items 0..n-1 of the given sizes into at most `threads` contiguous groups (i, j)
    of about the same total size; every item whole."""
    n = threads or _threads
    prefix = np.concatenate([[0], np.cumsum(sizes, dtype=np.float64)])  # prefix[i]: items < i
    cuts = [0]
    for k in range(1, n):  # the cut whose prefix is nearest k/n of the total
        target = prefix[-1] * k / n
        c = int(np.searchsorted(prefix, target))
        if c > 0 and (c == len(prefix) or target - prefix[c - 1] <= prefix[c] - target):
            c -= 1
        if cuts[-1] < c < len(sizes):
            cuts.append(c)
    cuts.append(len(sizes))
    return [(i, j) for i, j in zip(cuts, cuts[1:]) if j > i]


def map_items(fn, sizes, *, like=None) -> list:
    """[fn(i, j) for each group of split_items(sizes)], one group per thread, in order: for
    work that must take whole arrays (a reduction per parameter keeps its bits only whole).
    `like`: not a NumPy array (CuPy) -> [fn(0, n)]."""
    n = len(sizes)
    if (like is not None and not isinstance(like, np.ndarray)) or getattr(_local, "worker", False):
        return [fn(0, n)] if n else []
    groups = split_items(sizes)
    if len(groups) <= 1 or _threads == 1:
        return [fn(i, j) for i, j in groups]
    return _run_spans(fn, groups)


def in_parallel_region() -> bool:
    """True on a pool worker, and on the calling thread while it runs its own span: work
    started there runs on this thread alone (runtime/host's kernels too)."""
    return getattr(_local, "worker", False) or getattr(_local, "region", False)


def _run_spans(fn, spans):
    """fn on every span, the first on the calling thread, the others on the pool."""
    pool = _get_pool()
    futures = [pool.submit(fn, lo, hi) for lo, hi in spans[1:]]
    results, error = [], None
    outer = getattr(_local, "region", False)
    _local.region = True
    try:
        results.append(fn(*spans[0]))
    except BaseException as e:  # noqa: BLE001 - re-raised below, after the workers finish
        error = e
    finally:
        _local.region = outer
    for f in futures:
        try:
            results.append(f.result())
        except BaseException as e:  # noqa: BLE001
            error = error or e
    if error is not None:
        raise error
    return results


def sum_blocks(partials):
    """Sum per-block partial results in order (a fixed order: deterministic). An item may be
    a list of partials (one span's grid blocks, as `fn` returns them): it is unpacked."""
    it = (p for item in partials for p in (item if isinstance(item, list) else [item]))
    total = next(it).copy()
    for p in it:
        total += p
    return total
