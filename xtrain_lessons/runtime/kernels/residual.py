"""The residual add on the GPU: the launcher for kernels/residual.cu and its NumPy reference (T07b).

    add(a, b, out)       out = a + b elementwise; a, b, out one shape and one storage dtype
                         (float32, bfloat16, float16); out may be a or b (in place).

The CUDA twin of runtime/host/fused_rows' add: one float32 addition per element, rounded once
to the storage type (for 16-bit storage, the correctly rounded 16-bit sum). One launch, no host
synchronisation. Reference: add_reference(a, b), the float64 sum of the stored values.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.kernels._common import BLOCK, STORAGE, check, device_of, grid_for, kernel, \
    name_expression

__all__ = ["add", "add_reference", "NAME_EXPRESSIONS"]

NAME_EXPRESSIONS = tuple(name_expression("add", T) for T in STORAGE)


def add(a, b, out) -> None:
    fn = "add"
    xp = device_of(fn, "a", a)
    check(fn, "a", a, xp, STORAGE)
    check(fn, "b", b, xp, (a.dtype,), a.shape)
    check(fn, "out", out, xp, (a.dtype,), a.shape)
    n = a.size
    if n:
        k = kernel("residual.cu", name_expression("add", a.dtype), NAME_EXPRESSIONS, xp)
        k((grid_for(n),), (BLOCK,), (a, b, out, np.int64(n)))


def add_reference(a, b):
    return np.asarray(a).astype(np.float64) + np.asarray(b).astype(np.float64)
