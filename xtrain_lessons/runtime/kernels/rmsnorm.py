"""RMSNorm on the GPU: the launchers for kernels/rmsnorm.cu and their NumPy references (T07b).

The CUDA twins of runtime/host/fused_rows' rmsnorm_fwd / rmsnorm_bwd: the same out-parameters
and semantics, on CuPy arrays (the GPU) or NumPy arrays (the CPU emulator), in float32,
bfloat16 or float16 storage.

    rmsnorm_fwd(x, w, xhat, out, r, eps)
        x (N, D) of X; w (D,) float32 or None; xhat, out (N, D) of Y; r (N,) or (N, 1) float32.
        r = 1 / sqrt(mean(x^2) + eps), xhat = x * r, out = xhat * w per row. With w None, out is
        not written (pass None, or xhat itself). One launch.
    rmsnorm_bwd(g, xhat, w, r, gx, gw)
        g, xhat (N, D) of Y; gx (N, D) of X or None; gw (D,) float32 or None.
        gx = r * (gh - xhat * mean(gh * xhat)) with gh = g * w (g when w is None);
        gw = sum over rows of g * xhat, deterministic without atomics: partial sums over fixed
        blocks of GW_ROWS rows into a float32 scratch (n_blocks, D), then a second kernel adds
        them column by column — the same bits for any block size. One launch (gx only), two
        when gw is wanted (the row kernel writes gx and the partials together). With gw, D is
        at most MAX_GW_D = 12288 (each block keeps D partial sums in 48 KB of shared memory).

(X, Y) in (float32, float32), (float32, bfloat16), (bfloat16, bfloat16), (float32, float16),
(float16, float16): X is the stored input (the residual stream), Y the normalised output.
Arithmetic is float32 throughout, each stored value rounded once. No host synchronisation.

References (float64): rmsnorm_fwd_reference(x, w, eps) -> (xhat, out, r);
rmsnorm_bwd_reference(g, xhat, w, r) -> (gx, gw): fused_rows' ref_rmsnorm_fwd/bwd, which the C++
kernels are tested against too.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.host.fused_rows import ref_rmsnorm_bwd, ref_rmsnorm_fwd
from xtrain_lessons.runtime.kernels._common import BF16, F16, F32, check, device_of, kernel, name_expression, \
    row_threads

__all__ = ["rmsnorm_fwd", "rmsnorm_bwd", "rmsnorm_fwd_reference", "rmsnorm_bwd_reference", "PAIRS",
           "NAME_EXPRESSIONS", "GW_ROWS", "MAX_GW_D"]

PAIRS = ((F32, F32), (F32, BF16), (BF16, BF16), (F32, F16), (F16, F16))  # the (X, Y) instantiations
NAME_EXPRESSIONS = tuple(name_expression(k, X, Y) for X, Y in PAIRS for k in ("rmsnorm_fwd", "rmsnorm_bwd"))
GW_ROWS = 32          # rows per block of the weight gradient's partial sums (fixes its summation order)
MAX_GW_D = 12288      # the partial sums live in shared memory: D floats, at most 48 KB per block
_FILE = "rmsnorm.cu"


def _pair(fn: str, x_name: str, X, y_name: str, Y):
    if (X, Y) not in PAIRS:
        pairs = ", ".join(f"({a}, {b})" for a, b in PAIRS)
        raise TypeError(f"{fn}: no kernel for {x_name} {X} with {y_name} {Y}; the (X, Y) pairs are {pairs}")


def _r_ok(fn, r, xp, N):
    check(fn, "r", r, xp, (F32,))
    if r.shape not in ((N,), (N, 1)):
        raise ValueError(f"{fn}: r must have shape ({N},) or ({N}, 1), got {tuple(r.shape)}")


def rmsnorm_fwd(x, w, xhat, out, r, eps, *, threads: int | None = None) -> None:
    """See the module doc. `threads`: the block size (a multiple of 32), for tests."""
    fn = "rmsnorm_fwd"
    xp = device_of(fn, "x", x)
    check(fn, "x", x, xp)
    if x.ndim != 2:
        raise ValueError(f"{fn}: x must have shape (N, D), got {tuple(x.shape)}")
    N, D = x.shape
    check(fn, "xhat", xhat, xp, shape=(N, D))
    _pair(fn, "x", x.dtype, "xhat", xhat.dtype)
    if w is not None:
        check(fn, "w", w, xp, (F32,), (D,))
        check(fn, "out", out, xp, (xhat.dtype,), (N, D))
        if xp.may_share_memory(out, xhat):
            raise ValueError(f"{fn}: out must not be xhat when w is given (both are written)")
    _r_ok(fn, r, xp, N)
    if N == 0 or D == 0:
        return
    k = kernel(_FILE, name_expression(fn, x.dtype, xhat.dtype), NAME_EXPRESSIONS, xp)
    k((N,), (threads or row_threads(D),),
      (x, r if w is None else w, xhat, xhat if w is None else out, r, np.int32(D), np.float32(eps),
       np.int32(w is not None)))


def rmsnorm_bwd(g, xhat, w, r, gx, gw, *, threads: int | None = None) -> None:
    """See the module doc. `threads`: the block size (a multiple of 32), for tests."""
    fn = "rmsnorm_bwd"
    xp = device_of(fn, "g", g)
    check(fn, "g", g, xp)
    if g.ndim != 2:
        raise ValueError(f"{fn}: g must have shape (N, D), got {tuple(g.shape)}")
    N, D = g.shape
    check(fn, "xhat", xhat, xp, (g.dtype,), (N, D))
    if w is not None:
        check(fn, "w", w, xp, (F32,), (D,))
    _r_ok(fn, r, xp, N)
    if gx is not None:
        check(fn, "gx", gx, xp, shape=(N, D))
        _pair(fn, "gx", gx.dtype, "g", g.dtype)
    X = gx.dtype if gx is not None else g.dtype  # no gx: (Y, Y), with g as gx's placeholder
    if gw is not None:
        check(fn, "gw", gw, xp, (F32,), (D,))
        if D > MAX_GW_D:
            raise ValueError(f"{fn}: D = {D} > {MAX_GW_D}: the weight gradient's partial sums do not fit "
                             "in shared memory")
    if gx is None and gw is None:
        return
    if N == 0:
        if gw is not None:
            gw.fill(0)
        return
    rows = GW_ROWS if gw is not None else 1
    n_blocks = -(-N // rows)
    parts = xp.empty((n_blocks, D), dtype=xp.float32) if gw is not None else r
    k = kernel(_FILE, name_expression(fn, X, g.dtype), NAME_EXPRESSIONS, xp)
    k((n_blocks,), (threads or row_threads(D),),
      (g, xhat, r if w is None else w, r, g if gx is None else gx, parts, np.int32(N), np.int32(D),
       np.int32(rows), np.int32(w is not None), np.int32(gx is not None), np.int32(gw is not None)),
      shared_mem=4 * D if gw is not None else 0)
    if gw is not None:
        total = kernel(_FILE, "rmsnorm_gw_sum", NAME_EXPRESSIONS, xp)
        total((max(1, -(-D // 256)),), (256,), (parts, gw, np.int32(n_blocks), np.int32(D)))


def rmsnorm_fwd_reference(x, w, eps):
    """(xhat, out, r) in float64, r of shape (N, 1); out is xhat when w is None."""
    return ref_rmsnorm_fwd(np.asarray(x).astype(np.float64), w, eps)


def rmsnorm_bwd_reference(g, xhat, w, r):
    """(gx, gw) in float64 from the stored g, xhat (any storage dtype) and r."""
    r64 = np.asarray(r, np.float64).reshape(-1, 1)
    return ref_rmsnorm_bwd(np.asarray(g).astype(np.float64), np.asarray(xhat).astype(np.float64), w, r64)
