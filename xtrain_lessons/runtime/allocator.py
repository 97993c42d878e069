"""A caching allocator (phase T11).

Allocating per op is slow where asking the system for memory is slow: on a GPU `cudaMalloc`
synchronises the device and costs microseconds to milliseconds; on the CPU a large buffer
(above glibc's mmap threshold, 128 KiB to 32 MiB) comes fresh from the kernel as untouched
pages, and its first write page-faults every 4 KiB. A training step allocates the same sizes
in the same order every step, so a cache that keeps freed buffers and hands them out again
turns almost every allocation into a dictionary look-up.

    from xtrain_lessons.runtime.allocator import CachingAllocator
    pool = CachingAllocator()
    a = pool.alloc((1024, 1024), np.float32)   # a NumPy array on a cached buffer
    pool.free(a)                               # back to the free list of its size class
    with pool.scope():                         # everything allocated inside is freed at exit
        b = pool.alloc((256,), np.float64)
    print(pool.stats)                          # hits, misses, bytes in use, peak, ...

Public API
----------
size_class(nbytes, min_bytes=512) -> int
    The bytes actually reserved for a request: at least `min_bytes`, then the next power of
    two up to 1 MiB, and above that the next multiple of 1/4 of the power of two below
    (e.g. 5 MiB -> 5 MiB, 5.1 MiB -> 6 MiB): power-of-two-ish, at most 25% (large) or 100%
    (small) wasted, and few distinct classes so buffers are reused often.
CachingAllocator(xp=numpy, min_bytes=512)
    alloc(shape, dtype) -> array (C-contiguous, uninitialised, on a cached buffer);
    free(arr) (the exact array `alloc` returned); scope() context manager; empty_cache()
    (drop the cached free buffers); stats: AllocatorStats; reset_stats().
    With xp=cupy the buffers come from CuPy's own memory pool (which is itself a caching
    allocator); this layer only adds the statistics (tested on the tests' CuPy stand-in, not a GPU).
    lease(shape, dtype) -> array that gives its buffer back BY ITSELF when the last array
    using its memory (views included) is gone: no free() to call, so the engine can use it.
engine_allocator(pool=None) context manager: inside it the engine's large buffers (matmul
    outputs, the row-block ops' outputs, gradients they write) are leases of `pool` (a new
    CachingAllocator by default) instead of fresh np.empty; `empty(shape, dtype, like)` is
    the function the engine calls. Off by default: then plain np.empty.
AllocatorStats: allocations, frees, hits, misses, bytes_in_use, peak_bytes_in_use,
    bytes_cached (free buffers held), bytes_reserved (in use + cached), hit_rate.
The whole-step memory report lives in `xtrain_lessons.measure.memory_report`.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from dataclasses import dataclass

import numpy as np

from xtrain_lessons.runtime.device import array_module, on_gpu

__all__ = ["size_class", "CachingAllocator", "AllocatorStats", "engine_allocator", "empty", "keep_freed_memory",
           "fmt_bytes", "LEASE_MIN_BYTES"]

_LARGE = 1 << 20  # above 1 MiB: quarter steps between powers of two


def size_class(nbytes: int, min_bytes: int = 512) -> int:
    """Bytes reserved for a request of `nbytes` (see the module docstring)."""
    n = max(int(nbytes), int(min_bytes), 1)
    p = 1 << (n - 1).bit_length()  # next power of two >= n
    if p <= _LARGE:
        return p
    step = p // 8  # quarter of the power of two below p
    return -(-n // step) * step


@dataclass
class AllocatorStats:
    allocations: int = 0
    frees: int = 0
    hits: int = 0
    misses: int = 0
    bytes_in_use: int = 0
    peak_bytes_in_use: int = 0
    bytes_cached: int = 0
    requested_bytes_in_use: int = 0

    @property
    def bytes_reserved(self) -> int:
        return self.bytes_in_use + self.bytes_cached

    @property
    def hit_rate(self) -> float:
        return self.hits / self.allocations if self.allocations else 0.0

    def __str__(self) -> str:
        return (f"allocations {self.allocations}, hits {self.hits}, misses {self.misses} "
                f"(hit rate {self.hit_rate:.0%}), frees {self.frees}, in use "
                f"{fmt_bytes(self.bytes_in_use)}, peak {fmt_bytes(self.peak_bytes_in_use)}, "
                f"cached {fmt_bytes(self.bytes_cached)}")


class CachingAllocator:
    """Free lists of raw byte buffers keyed by size class (see the module docstring)."""

    def __init__(self, xp=np, min_bytes: int = 512):
        self.xp = xp
        self.min_bytes = int(min_bytes)
        self.free_lists: dict[int, list] = {}  # size class -> free buffers (uint8, 1-D)
        self._live: dict[int, tuple] = {}  # id(array) -> (array, buffer, class, requested)
        self._scopes: list[list[int]] = []
        self._lock = threading.Lock()
        self.stats = AllocatorStats()

    # -- the two halves of a cache: get a buffer, put it back --------------------------------
    def _get(self, cls: int):
        free = self.free_lists.get(cls)
        if free:
            self.stats.hits += 1
            self.stats.bytes_cached -= cls
            return free.pop()
        self.stats.misses += 1
        return self.xp.empty(cls, dtype=np.uint8)

    def _put(self, cls: int, buf) -> None:
        self.free_lists.setdefault(cls, []).append(buf)
        self.stats.bytes_cached += cls

    # -- public ------------------------------------------------------------------------------
    def alloc(self, shape, dtype=np.float32):
        """An uninitialised C-contiguous array of `shape` and `dtype` on a cached buffer."""
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        cls = size_class(nbytes, self.min_bytes)
        buf = self._get(cls)
        arr = buf[:nbytes].view(dtype).reshape(shape)
        s = self.stats
        s.allocations += 1
        s.bytes_in_use += cls
        s.requested_bytes_in_use += nbytes
        s.peak_bytes_in_use = max(s.peak_bytes_in_use, s.bytes_in_use)
        self._live[id(arr)] = (arr, buf, cls, nbytes)
        if self._scopes:
            self._scopes[-1].append(id(arr))
        return arr

    def free(self, arr) -> None:
        """Give `arr` (an array returned by `alloc`) back to the cache. Do not use it after."""
        entry = self._live.pop(id(arr), None)
        if entry is None or entry[0] is not arr:
            raise ValueError("CachingAllocator.free: not an array of this allocator "
                             "(or freed twice; pass the array alloc returned, not a view)")
        _, buf, cls, nbytes = entry
        self.stats.frees += 1
        self.stats.bytes_in_use -= cls
        self.stats.requested_bytes_in_use -= nbytes
        self._put(cls, buf)

    @contextlib.contextmanager
    def scope(self):
        """Free every array allocated inside the block (and not freed already) at its end."""
        self._scopes.append([])
        try:
            yield self
        finally:
            for key in reversed(self._scopes.pop()):
                entry = self._live.get(key)
                if entry is not None:
                    self.free(entry[0])

    def empty_cache(self) -> int:
        """Release the cached free buffers; returns the bytes released."""
        released = self.stats.bytes_cached
        self.free_lists.clear()
        self.stats.bytes_cached = 0
        return released

    def reset_stats(self) -> None:
        """Zero the counters (allocations, hits, misses, frees) and reset the peak to now."""
        s = self.stats
        s.allocations = s.frees = s.hits = s.misses = 0
        s.peak_bytes_in_use = s.bytes_in_use

    @property
    def live_arrays(self) -> int:
        return len(self._live)

    def lease(self, shape, dtype=np.float32):
        """An uninitialised C-contiguous array on a cached buffer that returns the buffer to
        the free list when the array and every view of it are gone (see _Lease). CPU only."""
        if on_gpu(self.xp):
            raise TypeError("CachingAllocator.lease: CPU (NumPy) pools only; on a GPU CuPy's "
                            "own memory pool already returns freed buffers")
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        cls = size_class(nbytes, self.min_bytes)
        with self._lock:
            buf = self._get(cls)
            s = self.stats
            s.allocations += 1
            s.bytes_in_use += cls
            s.requested_bytes_in_use += nbytes
            s.peak_bytes_in_use = max(s.peak_bytes_in_use, s.bytes_in_use)
        raw = np.asarray(_Lease(self, buf, cls, nbytes))  # uint8, its .base is the lease
        return raw.view(dtype).reshape(shape)  # (a view: any dtype, ml_dtypes' bf16 too)

    def _give_back(self, buf, cls, nbytes) -> None:
        with self._lock:  # a lease can die on any thread (the row-block pool's too)
            self.stats.frees += 1
            self.stats.bytes_in_use -= cls
            self.stats.requested_bytes_in_use -= nbytes
            self._put(cls, buf)


class _Lease:
    """Owner of a leased buffer: the array made from it (np.asarray through
    __array_interface__) and all its views keep this object alive as their `.base`; when the
    last of them is gone, __del__ hands the buffer back to the allocator's free list."""

    def __init__(self, pool, buf, cls, nbytes):
        self._pool, self._buf, self._cls, self._nbytes = pool, buf, cls, nbytes
        self.__array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "version": 3,
                                    "data": (buf.ctypes.data, False)}

    def __del__(self):
        pool, self._pool = self._pool, None
        if pool is not None:
            pool._give_back(self._buf, self._cls, self._nbytes)


# ----------------------------------------------------------------------------------------
# the engine's allocator (off by default)

LEASE_MIN_BYTES = 64 * 1024  # smaller arrays: NumPy's own small-block cache is faster (T11)
_engine = {"pool": None}


@contextlib.contextmanager
def engine_allocator(pool: "CachingAllocator | None" = None):
    """Inside the block the engine's large buffers come from `pool` (leases: given back when
    unused). Yields the pool, whose `stats` show what the engine allocated."""
    pool = CachingAllocator() if pool is None else pool
    before, _engine["pool"] = _engine["pool"], pool
    try:
        yield pool
    finally:
        _engine["pool"] = before


def empty(shape, dtype=np.float32, like=None):
    """np.empty(shape, dtype), or a lease of the engine allocator when one is active and the
    array is large (CPU only: on a GPU CuPy's own pool already caches)."""
    pool = _engine["pool"]
    if like is not None and not isinstance(like, np.ndarray):
        return array_module(like).empty(shape, dtype=dtype)
    if pool is not None:
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        if nbytes >= LEASE_MIN_BYTES:
            return pool.lease(shape, dtype)
    return np.empty(shape, dtype=dtype)


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters


def keep_freed_memory(max_bytes: int = 1 << 30) -> bool:
    """Let freed buffers of up to `max_bytes` stay in the process for the next step (glibc).

    By default glibc gives every block above its mmap threshold (at most 32 MiB) back to the
    kernel when it is freed, and the next step's buffer of the same size comes back as fresh
    pages, page-faulted one 4 KiB page at a time while it is first written — at 32 x 4096
    tokens the lm_head's (N, V) buffer is 64 MiB, and two threads faulting in the same process
    wait on each other (T07 measures a step 15% faster without it). Raising the mmap and trim
    thresholds keeps freed memory in the heap, where malloc hands it out again. The process's
    resident memory then stays at its peak, as with any caching allocator. Process-wide, for
    training processes (`xtrain train`, `xtrain bench`); False where there is no glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError, TypeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    top = min(int(max_bytes), (1 << 31) - 1)
    return bool(mallopt(_M_MMAP_THRESHOLD, top)) and bool(mallopt(_M_TRIM_THRESHOLD, min(2 * top, (1 << 31) - 1)))


def fmt_bytes(n: float) -> str:
    """1536 -> '1.5 KiB'."""
    n = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"  # pragma: no cover
