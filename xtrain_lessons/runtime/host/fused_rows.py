"""The fused row kernels of `fused_rows.cpp` on NumPy arrays, and a NumPy reference of each
(phase T07: what a compiler's fusion buys on the CPU).

The C++ file is compiled once per machine and compiler by g++ (-O3 -march=native
-ffp-contract=off), cached beside the emulator's kernels ($XTRAIN_CACHE_DIR or
~/.cache/xtrain-lessons/kernels), and called through ctypes, which lets go of the GIL. Each
call hands its rows to the library's own worker pool, cut into the runs the engine's threads
would take (cpu_threads.runs: whole cache-sized blocks, so the same bits for any thread
count); inside a parallel region (a pool worker, or the caller running its own span) a call
runs on its thread alone.

    from xtrain_lessons.runtime.host import fused_rows as fr
    if fr.usable(x, w):                    # float32 NumPy arrays, kernels built, not turned off
        fr.rmsnorm_fwd(x, w, xhat, out, r, eps=1e-6)
    with fr.disabled():                    # the engine's NumPy path instead (T07 compares them)
        ...

The attention (`attention_fwd`/`attention_bwd`, runtime/opset/attention.py's blocks of queries)
calls the BLAS sgemm runtime/blas.py chose through a function pointer, from C++.

Used for float32 NumPy arrays only: float64 (gradcheck), bf16/fp16 storage and CuPy arrays
keep the NumPy (or CuPy) path. Without a C++ compiler, or with XTRAIN_FUSED=0, nothing is
built and the engine runs its NumPy path: the same model, other last bits.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import hashlib
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from xtrain_lessons.runtime import blas, cpu_threads
from xtrain_lessons.runtime.cuda.emulator import KernelError, build_host_library

__all__ = ["SOURCE", "FLAGS", "usable", "available", "enabled", "disabled", "library", "timed",
           "exp", "add", "rmsnorm_fwd", "rmsnorm_bwd", "swiglu_fwd", "swiglu_bwd", "rope",
           "causal_softmax_fwd", "causal_softmax_bwd", "softmax_exp_rows",
           "attention_usable", "attention_fwd", "attention_bwd", "gemm_tasks",
           "sum_squares", "scale_arrays", "adamw_arrays", "scale_rows", "embedding_bwd",
           "ref_exp", "ref_rmsnorm_fwd", "ref_rmsnorm_bwd", "ref_swiglu_fwd", "ref_swiglu_bwd",
           "ref_rope", "ref_causal_softmax_fwd", "ref_causal_softmax_bwd", "ref_softmax_exp_rows"]

SOURCE = Path(__file__).with_name("fused_rows.cpp")
FLAGS = ("-std=c++20", "-O3", "-march=native", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
         "-mprefer-vector-width=512",
         "-shared", "-fPIC", "-fvisibility=hidden", "-pthread")

P, I64, I32, F32 = ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int, ctypes.c_float
_SIGNATURES = {
    "exp_rows": (P, P, I64),
    "rmsnorm_fwd": (P, P, P, P, P, I32, F32, P, I32),
    "rmsnorm_bwd": (P, P, P, P, P, P, I32, I64, P, I32),
    "add": (P, P, P, P, I32),
    "swiglu_fwd": (P, P, P, P, I32),
    "swiglu_bwd": (P, P, P, P, P, P, I32),
    "rope": (P, P, P, P, I32, I32, I32, F32, P, I32),
    "causal_softmax_fwd": (P, I32, I32, F32, P, I32),
    "causal_softmax_bwd": (P, P, I32, I32, F32, P, I32),
    "softmax_exp_rows": (P, P, P, I32, P, I32),
    "set_sgemm": (P, I32, P),
    "attention_fwd": (P, P, P, P, P, P, P, P, I32, I32, I32, I32, I32, I32, I32, F32, P, I32),
    "attention_bwd": (P, P, P, P, P, P, P, P, I32, I32, I32, I32, I32, I32, I32, F32, P, P, P, P, I32),
    "gemm_tasks": (P, I32, I32),
    "set_spin": (ctypes.c_long,),
    "sum_squares": (P, I32, P, I32),
    "scale_arrays": (P, I32, F32, I32),
    "adamw_arrays": (P, I32, I32),
    "scale_rows": (P, P, I32, P, I32),
    "embedding_bwd": (P, I64, P, P, I32, P, I32),
}
_GEMM_TASK = np.dtype([("M", "i8"), ("N", "i8"), ("K", "i8"), ("lda", "i8"), ("ldb", "i8"), ("ldc", "i8"),
                       ("A", "u8"), ("B", "u8"), ("C", "u8"), ("ta", "i4"), ("tb", "i4")])  # struct GemmTask

_ARRAY_TASK = np.dtype([("p", "u8"), ("g", "u8"), ("m", "u8"), ("v", "u8"), ("n", "i8"),
                        ("decay", "f4"), ("one_minus_b1", "f4"), ("b2", "f4"), ("one_minus_b2", "f4"),
                        ("bc2_sqrt", "f4"), ("eps", "f4"), ("step", "f4"), ("decays", "i4")],
                       align=True)  # struct ArrayTask

_lib = None  # the loaded library, False once building it failed
_lock = threading.Lock()
_off_all = [os.environ.get("XTRAIN_FUSED", "1") == "0"]  # process-wide: the pool's threads too


def _cpu_key() -> str:
    """-march=native code runs only on CPUs with the same features: part of the cache key."""
    try:
        info = open("/proc/cpuinfo", encoding="utf-8").read()
        lines = [ln for ln in info.splitlines() if ln.startswith(("model name", "flags"))][:2]
    except OSError:
        lines = [os.uname().machine]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def library():
    """The compiled kernels (ctypes.CDLL), built on first use; None if they cannot be built
    (no compiler: the reason is printed once on stderr)."""
    global _lib
    if _lib is None:
        with _lock:
            if _lib is None:
                _lib = _load()
    return _lib or None


def _load():
    cpp = SOURCE.read_text() + f"\n// cpu {_cpu_key()}\n"
    try:
        lib = ctypes.CDLL(str(build_host_library(cpp, FLAGS, "xtrain-fused-", SOURCE.name)))
    except (KernelError, OSError) as e:
        print(f"xtrain: fused CPU kernels unavailable ({str(e).splitlines()[0]}); using the NumPy path",
              file=sys.stderr)
        return False
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = args, None
    return lib


def enabled() -> bool:
    return not _off_all[0]


@contextlib.contextmanager
def disabled():
    """The engine's NumPy path inside the block (process-wide: the pool's threads too)."""
    before = _off_all[0]
    _off_all[0] = True
    try:
        yield
    finally:
        _off_all[0] = before


class _Timed:
    """The library, with the seconds of every call made outside a parallel region added up by
    name (`timed`)."""

    def __init__(self, lib, seconds):
        self._lib, self._seconds = lib, seconds

    def __getattr__(self, name):
        fn = getattr(self._lib, name)

        def call(*args):
            if cpu_threads.in_parallel_region():  # inside someone's hand-over: counted there
                return fn(*args)
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                self._seconds[name] += time.perf_counter() - t0
        return call


@contextlib.contextmanager
def timed():
    """{kernel name: seconds} spent in the C++ kernels inside the block (what the step spends
    outside them is Python, the matmuls and the pool's hand-overs)."""
    global _lib
    real = library()
    seconds = collections.defaultdict(float)
    if real is None:
        yield seconds
        return
    _lib = _Timed(real, seconds)
    try:
        yield seconds
    finally:
        _lib = real


def available() -> bool:
    """The kernels are built (or can be) on this machine."""
    return library() is not None


def usable(*arrays) -> bool:
    """Run these arrays through the kernels? All float32 C-contiguous NumPy arrays (None is
    skipped), kernels not disabled, and built."""
    if _off_all[0]:
        return False
    for a in arrays:
        if a is not None and not (type(a) is np.ndarray and a.dtype == np.float32 and a.flags.c_contiguous):
            return False
    return library() is not None


def _p(a):
    return None if a is None else a.ctypes.data


# ------------------------------------------------------------------ the launchers
def _cuts(n_rows: int, row_bytes: int, block_rows: int | None = None):
    """(cuts, parts): the runs of rows of the engine's threads (cpu_threads.runs: whole grid
    blocks, one run per thread), as int64 boundaries for the C++ pool; one run inside a
    parallel region (the thread is one of several already at work)."""
    threads = 1 if cpu_threads.in_parallel_region() else cpu_threads.get_threads()
    if threads <= 1 or n_rows <= 0:
        return np.array([0, max(n_rows, 0)], np.int64), 1
    block_bytes = block_rows * row_bytes if block_rows else cpu_threads.BLOCK_BYTES
    spans = cpu_threads.runs(n_rows, row_bytes, block_bytes, threads)
    return np.array([lo for lo, _ in spans] + [spans[-1][1]], np.int64), len(spans)


def _run(name, *args, n_rows, row_bytes, block_rows=None):
    cuts, parts = _cuts(n_rows, row_bytes, block_rows)
    getattr(library(), name)(*args, cuts.ctypes.data, parts)


def exp(x: np.ndarray) -> np.ndarray:
    y = np.empty_like(x)
    library().exp_rows(_p(x), _p(y), x.size)
    return y


def rmsnorm_fwd(x, w, xhat, out, r, eps):
    """x, xhat, out (N, D), w (D,) or None (out is then not written), r (N,) or (N, 1)."""
    N, D = x.shape
    _run("rmsnorm_fwd", _p(x), _p(w), _p(xhat), _p(out), _p(r), D, float(eps), n_rows=N, row_bytes=D * 4)


def rmsnorm_bwd(g, xhat, w, r, gx, gw_parts, block_rows):
    """gx (N, D) or None; gw_parts (n_blocks, D), zeroed by the caller, or None: block k's
    partial sum of g * xhat over rows k*block_rows .. (k+1)*block_rows - 1."""
    N, D = xhat.shape
    _run("rmsnorm_bwd", _p(g), _p(xhat), _p(w), _p(r), _p(gx), _p(gw_parts), D, block_rows,
         n_rows=N, row_bytes=D * 4, block_rows=block_rows)


ADD_MIN_SIZE = 1 << 16  # below this NumPy's own loop is as fast as a hand-over to the pool


def add(a, b, out=None):
    """a + b for same-shaped arrays, spread over the pool's threads (the same bits as NumPy's:
    one rounding per element); `out` may be a or b. None when they cannot go (not `usable`,
    shapes differ, or too small to be worth it): the caller adds with NumPy."""
    if a.shape != b.shape or a.size < ADD_MIN_SIZE or not usable(a, b, out):
        return None
    out = np.empty_like(a) if out is None else out
    _run("add", _p(a), _p(b), _p(out), n_rows=a.size, row_bytes=4)
    return out


def swiglu_fwd(a, u, out):
    """out = silu(a) * u for same-shaped arrays."""
    _run("swiglu_fwd", _p(a), _p(u), _p(out), n_rows=a.size, row_bytes=4)


def swiglu_bwd(a, u, g, da, du):
    _run("swiglu_bwd", _p(a), _p(u), _p(g), _p(da), _p(du), n_rows=a.size, row_bytes=4)


def rope(x, cos, sin, out, sign=1.0):
    """x, out (B, T, H, D); cos, sin (T, D); sign -1: the inverse rotation."""
    B, T, H, D = x.shape
    _run("rope", _p(x), _p(cos), _p(sin), _p(out), T, H, D, float(sign), n_rows=B, row_bytes=T * H * D * 4)


def causal_softmax_fwd(s, Tq, scale):
    """In place over s (..., Tk) seen as rows, row q's query at position Tk - Tq + q % Tq."""
    Tk = s.shape[-1]
    _run("causal_softmax_fwd", _p(s), Tq, Tk, float(scale), n_rows=s.size // Tk, row_bytes=Tk * 4)


def causal_softmax_bwd(p, dp, Tq, scale):
    Tk = p.shape[-1]
    _run("causal_softmax_bwd", _p(p), _p(dp), Tq, Tk, float(scale), n_rows=p.size // Tk, row_bytes=Tk * 4)


def softmax_exp_rows(x, s, lse):
    """x (N, V) -> exp(x - max) in place; s, lse (N,) or (N, 1)."""
    N, V = x.shape
    _run("softmax_exp_rows", _p(x), _p(s), _p(lse), V, n_rows=N, row_bytes=V * 4)


def _attention_args(q, k, blocks, probs):
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    qa, qb, nk = (np.array([blk[i] for blk in blocks], np.int64) for i in range(3))
    # a NumPy array of the addresses (a ctypes array type made per call would be a new class,
    # with reference cycles only the garbage collector frees)
    pointers = np.array([p.ctypes.data for p in probs], np.uint64)
    return (_p(pointers), _p(qa), _p(qb), _p(nk), len(blocks), B, Tq, Tk, H, Hkv, D), (qa, qb, nk, pointers)


def attention_usable(*arrays) -> bool:
    """The C++ attention can run: usable(arrays) and a CBLAS sgemm to call (runtime/blas.py)."""
    return usable(*arrays) and blas.sgemm_address() is not None


_sgemm_set = [None]  # (library, sgemm) last set: set again only when either changes


def _with_sgemm(fn):
    chosen, lib = blas.sgemm_address(), library()
    if (lib, chosen) != _sgemm_set[0]:
        address, wide, set_local_threads = chosen
        lib.set_sgemm(address, int(wide), set_local_threads)
        _sgemm_set[0] = (lib, chosen)
    if chosen[2] is not None:  # MKL: one thread inside each call already (runtime/blas.py)
        return fn()
    with cpu_threads.one_blas_thread():  # OpenBLAS: one thread inside each call
        return fn()


def attention_fwd(q, k, v, out, probs, blocks, scale):
    """runtime/opset/attention.py's forward in C++: q, out (B, Tq, H, D), k, v (B, Tk, Hkv, D),
    probs[i] (B, Hkv, G*(b-a), n_k) for blocks[i] = (a, b, n_k); one task per (sequence, kv head)."""
    args, keep = _attention_args(q, k, blocks, probs)
    B, Hkv = q.shape[0], k.shape[2]
    _with_sgemm(lambda: _run("attention_fwd", _p(q), _p(k), _p(v), _p(out), *args, float(scale),
                             n_rows=B * Hkv, row_bytes=4, block_rows=1))


def attention_bwd(q, k, v, dout, probs, blocks, scale, dq, dk, dv):
    args, keep = _attention_args(q, k, blocks, probs)
    B, Hkv = q.shape[0], k.shape[2]
    _with_sgemm(lambda: _run("attention_bwd", _p(q), _p(k), _p(v), _p(dout), *args, float(scale), _p(dq), _p(dk),
                             _p(dv), n_rows=B * Hkv, row_bytes=4, block_rows=1))


def gemm_tasks(products) -> bool:
    """out = a @ b for every (a, b, out) of `products` (float32 2-D, `out` C-contiguous), in
    this order of taking, on the library's pool: the threads take the next product nobody has
    started, each one BLAS sgemm call (runtime/blas.py's). False, nothing done, when they cannot
    all go (then cpu_threads runs them on its Python threads)."""
    if not products or not usable(*(out for _, _, out in products)) or blas.sgemm_address() is None:
        return False
    if not all(type(x) is np.ndarray and x.dtype == np.float32 for a, b, _ in products for x in (a, b)):
        return False  # a and b may be transposed views (a linear's g.T): blas.layout reads them
    rows = []
    for a, b, out in products:
        la, lb = blas.layout(a), blas.layout(b)
        if la is None or lb is None or 0 in a.shape or b.shape[1] == 0:
            return False
        (M, K), N = a.shape, b.shape[1]
        rows.append((M, N, K, la[1], lb[1], max(N, 1), a.ctypes.data, b.ctypes.data, out.ctypes.data,
                     la[0] == blas.TRANS, lb[0] == blas.TRANS))  # struct GemmTask's fields, in order
    table = np.array(rows, _GEMM_TASK)
    threads = _task_threads(len(products))
    _with_sgemm(lambda: library().gemm_tasks(table.ctypes.data, len(products), threads))
    return True


def _task_threads(n_tasks: int) -> int:
    return 1 if cpu_threads.in_parallel_region() else max(1, min(cpu_threads.get_threads(), n_tasks))


def _array_table(arrays):
    """(table, order): one ArrayTask per array, the largest first (the threads finish together)."""
    order = sorted(range(len(arrays)), key=lambda i: -arrays[i].size)
    table = np.zeros(len(arrays), _ARRAY_TASK)
    table["p"] = [arrays[i].ctypes.data for i in order]
    table["n"] = [arrays[i].size for i in order]
    return table, order


def sum_squares(arrays):
    """[sum of a**2 in float64 for a in arrays] (float64 array), each array summed whole on one
    thread in 16 lanes: the same bits for any thread count. None if they cannot all go."""
    if not arrays or not usable(*arrays):
        return None
    table, order = _array_table(arrays)
    sums = np.empty(len(arrays), np.float64)
    library().sum_squares(table.ctypes.data, len(arrays), _p(sums), _task_threads(len(arrays)))
    out = np.empty_like(sums)
    out[order] = sums
    return out


def scale_arrays(arrays, coef) -> bool:
    """a *= float32(coef) in place for every array (a clip's scale); False if they cannot all go."""
    if not arrays or not usable(*arrays):
        return False
    table, _ = _array_table(arrays)
    library().scale_arrays(table.ctypes.data, len(arrays), float(np.float32(coef)), _task_threads(len(arrays)))
    return True


def adamw_arrays(updates) -> list:
    """training/optim.py's AdamW update, in place, for every ((theta, grad, m, v), hyper) of
    `updates` that can go (float32 NumPy arrays, no `where`), in one hand-over to the pool:
    whole arrays taken by the threads one by one, each constant rounded to float32 first as
    NumPy rounds a Python float, so NumPy's bits. Returns the updates it left to the caller."""
    mine, rest = [], []
    for arrays, hyper in updates:
        (mine if hyper[-1] is None and usable(*arrays) else rest).append((arrays, hyper))
    if not mine:
        return rest
    table, order = _array_table([arrays[0] for arrays, _ in mine])
    for col, k in (("g", 1), ("m", 2), ("v", 3)):
        table[col] = [mine[i][0][k].ctypes.data for i in order]
    consts = [_adamw_constants(*mine[i][1][:7]) for i in order]
    for j, col in enumerate(("decay", "decays", "one_minus_b1", "b2", "one_minus_b2", "bc2_sqrt", "eps", "step")):
        table[col] = [c[j] for c in consts]
    library().adamw_arrays(table.ctypes.data, len(mine), _task_threads(len(mine)))
    return rest


def _adamw_constants(lr, b1, b2, eps, wd, bc1, bc2_sqrt):
    """adamw's float32 constants (decay, decays, 1-b1, b2, 1-b2, bc2_sqrt, eps, step), each
    rounded to float32 as NumPy rounds a Python float."""
    def f32(x):
        return float(np.float32(x))

    return (f32(1.0 - lr * wd), int(wd != 0.0), f32(1.0 - b1), f32(b2), f32(1.0 - b2), f32(bc2_sqrt), f32(eps),
            f32(-(lr / bc1)))


def scale_rows(x, f):
    """x[r, :] *= f[r] in place for x (N, V), f (N,) or (N, 1)."""
    N, V = x.shape
    _run("scale_rows", _p(x), _p(f), V, n_rows=N, row_bytes=V * 4)


def embedding_bwd(ids, g, gw):
    """gw (V, D) = the sum of g's rows (N, D) into rows ids (N,) of int64, np.add.at's order."""
    V, D = gw.shape
    _run("embedding_bwd", _p(ids), ids.size, _p(g), _p(gw), D, n_rows=V, row_bytes=D * 4)


# ------------------------------------------------------------------ NumPy references
def ref_exp(x):
    return np.exp(x.astype(np.float64)).astype(np.float32)


def ref_rmsnorm_fwd(x, w, eps):
    x64 = x.astype(np.float64, copy=False)
    r = 1.0 / np.sqrt((x64 * x64).mean(axis=-1, keepdims=True) + eps)
    xhat = x64 * r
    return xhat, (xhat * w if w is not None else xhat), r


def ref_rmsnorm_bwd(g, xhat, w, r):
    g64, xh = g.astype(np.float64, copy=False), xhat.astype(np.float64, copy=False)
    gh = g64 * w if w is not None else g64
    gx = r * (gh - xh * (gh * xh).mean(axis=-1, keepdims=True))
    return gx, (g64 * xh).sum(axis=0)


def _ref_sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


def ref_swiglu_fwd(a, u):
    a64 = a.astype(np.float64)
    return a64 * _ref_sigmoid(a64) * u


def ref_swiglu_bwd(a, u, g):
    a64 = a.astype(np.float64)
    s = _ref_sigmoid(a64)
    return g * u * s * (1 + a64 * (1 - s)), g * a64 * s


def ref_rope(x, cos, sin, sign=1.0):
    h = x.shape[-1] // 2
    x64 = x.astype(np.float64)
    rot = np.concatenate([-x64[..., h:], x64[..., :h]], axis=-1)
    return x64 * cos[:, None, :] + rot * (sign * sin[:, None, :].astype(np.float64))


def _ref_causal_mask(n_rows, Tq, Tk):
    q = np.arange(n_rows) % Tq
    return np.arange(Tk)[None, :] <= (Tk - Tq + q)[:, None]


def ref_causal_softmax_fwd(s, Tq, scale):
    rows = s.reshape(-1, s.shape[-1]).astype(np.float64) * scale
    seen = _ref_causal_mask(len(rows), Tq, s.shape[-1])
    rows = np.where(seen, rows, -np.inf)
    e = np.exp(rows - rows.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)).reshape(s.shape)


def ref_causal_softmax_bwd(p, dp, Tq, scale):
    p64 = p.reshape(-1, p.shape[-1]).astype(np.float64, copy=False)
    d64 = dp.reshape(p64.shape).astype(np.float64, copy=False)
    seen = _ref_causal_mask(len(p64), Tq, p.shape[-1])
    ds = p64 * (d64 - (d64 * p64).sum(axis=-1, keepdims=True)) * scale
    return np.where(seen, ds, 0.0).reshape(p.shape)


def ref_softmax_exp_rows(x):
    x64 = x.astype(np.float64, copy=False)
    m = x64.max(axis=-1, keepdims=True)
    e = np.exp(x64 - m)
    s = e.sum(axis=-1, keepdims=True)
    return e, s, m + np.log(s)


cpu_threads.set_gemm_runner(gemm_tasks)  # cpu_threads.matmuls hands its chunks to the C++ pool
