"""The fused kernels of a training step, under one set of names for both devices (phase T07).

The layers above `runtime/` call these and never ask which device runs them:

    from xtrain_lessons.runtime import fused
    if fused.usable(x, w):                   # this device has the kernel for these arrays
        fused.rmsnorm_fwd(x, w, xhat, out, r, eps)
    else:                                    # float64, or no C++ compiler: the NumPy path
        ...

On the CPU (float32 NumPy arrays) a call goes to runtime/host's C++ row kernels (fused_rows, run
on the engine's worker pool); on a GPU (CuPy arrays of float32, bfloat16 or float16) to the CUDA C
kernels of runtime/kernels/, one launch each, launched through CuPy — no row blocks and no
threads: a GPU wants one big launch. Each name has the same arguments and meaning on both sides
(out-parameters, in place where the name says so); each side has its NumPy reference beside its
launcher (`fused_rows.ref_*`, `kernels/<family>.py`).

What only one side has: the CPU's `causal_softmax_*` over blocks of queries and its C++ attention
(model/causal_blocks.py), and the GPU's fused classifier (`cross_entropy_fwd/bwd`, reading the
upstream gradient on the device) and multi-tensor optimizer step (training/fused_adamw.py).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime import cpu_threads
from xtrain_lessons.runtime.device import array_module, on_gpu
from xtrain_lessons.runtime.host import fused_rows as cpu
from xtrain_lessons.runtime.kernels import cross_entropy as _ce
from xtrain_lessons.runtime.kernels import embedding as _embedding
from xtrain_lessons.runtime.kernels import residual as _residual
from xtrain_lessons.runtime.kernels import rmsnorm as _rmsnorm
from xtrain_lessons.runtime.kernels import rope as _rope
from xtrain_lessons.runtime.kernels import softmax as _softmax
from xtrain_lessons.runtime.kernels import swiglu as _swiglu
from xtrain_lessons.runtime.kernels._common import STORAGE

__all__ = ["usable", "on_device", "rmsnorm_fwd", "rmsnorm_bwd", "swiglu_fwd", "swiglu_bwd", "rope", "add",
           "causal_softmax_fwd", "causal_softmax_bwd", "softmax_exp_rows", "scale_rows", "embedding_bwd",
           "cross_entropy_fwd", "cross_entropy_bwd", "mean_loss"]


def on_device(*arrays) -> bool:
    """Every array (None skipped) is a C-contiguous GPU array of a kernel storage dtype."""
    present = [a for a in arrays if a is not None]
    return bool(present) and all(on_gpu(a) and a.dtype in STORAGE and a.flags.c_contiguous for a in present)


def usable(*arrays) -> bool:
    """This device has the fused kernels for these arrays: the GPU's for CuPy arrays (float32,
    bfloat16, float16), the C++ ones for float32 NumPy arrays (when built and not turned off)."""
    first = next((a for a in arrays if a is not None), None)
    if first is not None and on_gpu(first):
        return on_device(*arrays)
    return cpu.usable(*arrays)


def rmsnorm_fwd(x, w, xhat, out, r, eps) -> None:
    """x (N, D) -> xhat = x / rms(x), out = xhat * w (w None: out not written), r (N,) = 1 / rms."""
    (_rmsnorm.rmsnorm_fwd if on_gpu(x) else cpu.rmsnorm_fwd)(x, w, xhat, out, r, eps)


def rmsnorm_bwd(g, xhat, w, r, gx, gw) -> None:
    """gx (N, D) or None; gw (D,) float32 or None: the sum over rows of g * xhat, in a fixed order
    (the CPU adds per-block partial sums of the engine's row grid in row order: the same bits for
    any thread count; the GPU adds fixed blocks of rows column by column)."""
    if on_gpu(g):
        _rmsnorm.rmsnorm_bwd(g, xhat, w, r, gx, gw)
        return
    N, D = xhat.shape
    block_rows = len(range(*cpu_threads.grid(0, N, D * xhat.itemsize)[0]))
    parts = np.zeros((-(-N // block_rows), D), np.float32) if gw is not None else None
    cpu.rmsnorm_bwd(g, xhat, w, r, gx, parts, block_rows)
    if gw is not None:
        gw[...] = cpu_threads.sum_blocks(list(parts))


def swiglu_fwd(a, u, out) -> None:
    """out = silu(a) * u."""
    (_swiglu.swiglu_fwd if on_gpu(a) else cpu.swiglu_fwd)(a, u, out)


def swiglu_bwd(a, u, g, da, du) -> None:
    (_swiglu.swiglu_bwd if on_gpu(a) else cpu.swiglu_bwd)(a, u, g, da, du)


def rope(x, cos, sin, out, sign: float = 1.0) -> None:
    """out = x * cos + rotate_half(x) * sin * sign for x (B, T, H, D) and tables (T, D)."""
    (_rope.rope if on_gpu(x) else cpu.rope)(x, cos, sin, out, sign)


def add(a, b, out=None):
    """a + b for same-shaped arrays (`out` may be a or b), or None when the CPU kernel would not
    pay (small, or not float32): the caller adds with NumPy then. One launch on a GPU."""
    if not on_gpu(a):
        return cpu.add(a, b, out)
    if a.shape != b.shape or a.dtype != b.dtype or (out is not None and out.dtype != a.dtype) \
            or not on_device(a, b, out):
        return None
    out = array_module(a).empty_like(a) if out is None else out
    _residual.add(a, b, out)
    return out


def causal_softmax_fwd(s, Tq: int, scale) -> None:
    """In place over s (..., Tk): scale, causal mask (row i is the query at Tk - Tq + i % Tq), softmax."""
    (_softmax.causal_softmax_fwd if on_gpu(s) else cpu.causal_softmax_fwd)(s, Tq, scale)


def causal_softmax_bwd(p, dp, Tq: int, scale) -> None:
    """In place over dp: dS = P * (dP - rowsum(dP * P)) * scale."""
    (_softmax.causal_softmax_bwd if on_gpu(p) else cpu.causal_softmax_bwd)(p, dp, Tq, scale)


def softmax_exp_rows(x, s, lse) -> None:
    """x (N, V) -> exp(x - rowmax) in place; s its row sums, lse the log-sum-exp."""
    (_softmax.softmax_exp_rows if on_gpu(x) else cpu.softmax_exp_rows)(x, s, lse)


def scale_rows(x, f) -> None:
    """x[r, :] *= f[r] in place."""
    (_softmax.scale_rows if on_gpu(x) else cpu.scale_rows)(x, f)


def embedding_bwd(ids, g, gw) -> None:
    """gw (V, D) = the rows of g (N, D) summed into rows ids (N,) of int64 (on g's device)."""
    (_embedding.embedding_bwd if on_gpu(g) else cpu.embedding_bwd)(ids, g, gw)


# ----- the GPU's fused classifier: softmax, loss and d loss / d logits, reading no value on the host
def cross_entropy_fwd(logits, targets, s, lse, losses, ignore_index: int = -100) -> None:
    """logits (N, V) -> exp(logits - rowmax) in place; s, lse (N,) and the per-row losses
    (0 where the target is ignore_index). GPU arrays."""
    _ce.cross_entropy_fwd(logits, targets, s, lse, losses, ignore_index)


def cross_entropy_bwd(e, s, targets, dloss, inv_count, ignore_index: int = -100) -> None:
    """e (N, V) -> d loss / d logits in place, for the upstream gradient dloss (a device scalar)
    of the mean over `1 / inv_count` valid rows. GPU arrays."""
    _ce.cross_entropy_bwd(e, s, targets, dloss, inv_count, ignore_index)


def mean_loss(losses, inv_count, out) -> None:
    """out (a device scalar) = sum(losses) * inv_count, deterministic."""
    _ce.mean_loss(losses, inv_count, out)
