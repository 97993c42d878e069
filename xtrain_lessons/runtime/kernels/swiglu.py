"""SwiGLU on the GPU: the launchers for kernels/swiglu.cu and their NumPy references (T07b).

The CUDA twins of runtime/host/fused_rows' swiglu_fwd / swiglu_bwd, on CuPy arrays (the GPU)
or NumPy arrays (the CPU emulator):

    swiglu_fwd(a, u, out)             out = silu(a) * u = a * sigmoid(a) * u
    swiglu_bwd(a, u, g, da, du)       du = g * a * s,  da = g * u * s * (1 + a * (1 - s)),  s = sigmoid(a)

All arrays share one shape (any) and one storage dtype: float32, bfloat16 or float16. The
sigmoid is computed without overflow for any |a|; arithmetic is float32, one rounding on store.
One launch each, no host synchronisation.

References (float64): swiglu_fwd_reference(a, u) and swiglu_bwd_reference(a, u, g) -> (da, du),
fused_rows' ref_swiglu_fwd / ref_swiglu_bwd on the stored values.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.host.fused_rows import ref_swiglu_bwd, ref_swiglu_fwd
from xtrain_lessons.runtime.kernels._common import BLOCK, STORAGE, check, device_of, grid_for, kernel, \
    name_expression

__all__ = ["swiglu_fwd", "swiglu_bwd", "swiglu_fwd_reference", "swiglu_bwd_reference", "NAME_EXPRESSIONS"]

NAME_EXPRESSIONS = tuple(name_expression(k, T) for T in STORAGE for k in ("swiglu_fwd", "swiglu_bwd"))
_FILE = "swiglu.cu"


def _checked(fn, first, arrays):
    xp = device_of(fn, first[0], first[1])
    check(fn, first[0], first[1], xp, STORAGE)
    for name, arr in arrays:
        check(fn, name, arr, xp, (first[1].dtype,), first[1].shape)
    return xp


def swiglu_fwd(a, u, out) -> None:
    xp = _checked("swiglu_fwd", ("a", a), (("u", u), ("out", out)))
    n = a.size
    if n:
        k = kernel(_FILE, name_expression("swiglu_fwd", a.dtype), NAME_EXPRESSIONS, xp)
        k((grid_for(n),), (BLOCK,), (a, u, out, np.int64(n)))


def swiglu_bwd(a, u, g, da, du) -> None:
    xp = _checked("swiglu_bwd", ("a", a), (("u", u), ("g", g), ("da", da), ("du", du)))
    n = a.size
    if n:
        k = kernel(_FILE, name_expression("swiglu_bwd", a.dtype), NAME_EXPRESSIONS, xp)
        k((grid_for(n),), (BLOCK,), (a, u, g, da, du, np.int64(n)))


def swiglu_fwd_reference(a, u):
    with np.errstate(over="ignore"):  # exp(-a) for a < -709 in float64: sigmoid 0, as the kernel's
        return ref_swiglu_fwd(np.asarray(a).astype(np.float64), np.asarray(u).astype(np.float64))


def swiglu_bwd_reference(a, u, g):
    """(da, du) in float64."""
    with np.errstate(over="ignore"):
        return ref_swiglu_bwd(np.asarray(a).astype(np.float64), np.asarray(u).astype(np.float64),
                              np.asarray(g).astype(np.float64))
