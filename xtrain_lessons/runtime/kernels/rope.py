"""Rotary position embedding on the GPU: the launcher for kernels/rope.cu and its NumPy reference (T07b).

    rope(x, cos, sin, out, sign=1.0)
        x, out (B, T, H, D) of one storage dtype (float32, bfloat16, float16), D even;
        cos, sin (T, D) float32. out = x * cos + rotate_half(x) * sin * sign with
        rotate_half([x1, x2]) = [-x2, x1]; sign = -1 is the inverse rotation (the backward).
        out may be x (in place). One launch, no host synchronisation.

The CUDA twin of runtime/host/fused_rows' rope; the reference is its ref_rope (float64):
rope_reference(x, cos, sin, sign).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.host.fused_rows import ref_rope
from xtrain_lessons.runtime.kernels._common import BLOCK, F32, STORAGE, check, device_of, grid_for, kernel, \
    name_expression

__all__ = ["rope", "rope_reference", "NAME_EXPRESSIONS"]

NAME_EXPRESSIONS = tuple(name_expression("rope", T) for T in STORAGE)


def rope(x, cos, sin, out, sign: float = 1.0) -> None:
    fn = "rope"
    xp = device_of(fn, "x", x)
    check(fn, "x", x, xp, STORAGE)
    if x.ndim != 4 or x.shape[-1] % 2:
        raise ValueError(f"{fn}: x must have shape (B, T, H, D) with D even, got {tuple(x.shape)}")
    B, T, H, D = x.shape
    check(fn, "cos", cos, xp, (F32,), (T, D))
    check(fn, "sin", sin, xp, (F32,), (T, D))
    check(fn, "out", out, xp, (x.dtype,), x.shape)
    n_pairs = x.size // 2
    if n_pairs:
        k = kernel("rope.cu", name_expression("rope", x.dtype), NAME_EXPRESSIONS, xp)
        k((grid_for(n_pairs),), (BLOCK,), (x, cos, sin, out, np.int64(n_pairs), np.int32(T), np.int32(H),
                                           np.int32(D), np.float32(sign)))


def rope_reference(x, cos, sin, sign: float = 1.0):
    return ref_rope(np.asarray(x).astype(np.float64), np.asarray(cos, np.float64), np.asarray(sin, np.float64),
                    sign)
