"""Broadcasting elementwise ops: the launcher for kernels/elementwise.cu and its NumPy reference.

    from xtrain_lessons.runtime.kernels.elementwise import binary_op, broadcast_shape
    out = binary_op(a, b, "add")          # a (3, 1, 5) + b (4, 1) -> (3, 4, 5), like a + b

The kernel gets, for each input, its strides *in elements* over the output's axes, with 0 on
every axis it is broadcast along (see `broadcast_strides`). NumPy arrays run on the CPU
emulator, CuPy arrays on the GPU.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.cuda import load_kernel
from xtrain_lessons.runtime.device import array_module, kernel_backend

BLOCK = 256
OPS = {"add": 0, "subtract": 1, "multiply": 2, "divide": 3, "maximum": 4, "minimum": 5}
_NUMPY_OPS = {"add": np.add, "subtract": np.subtract, "multiply": np.multiply, "divide": np.divide,
              "maximum": np.maximum, "minimum": np.minimum}


def broadcast_shape(a: tuple, b: tuple) -> tuple:
    """The shape of `x op y` for x of shape a and y of shape b (NumPy's rules).

    Align the shapes on the right; each pair of sizes must be equal or contain a 1 (which
    stretches); a missing leading axis counts as 1."""
    a, b = tuple(a), tuple(b)
    n = max(len(a), len(b))
    a, b = (1,) * (n - len(a)) + a, (1,) * (n - len(b)) + b
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y and x != 1 and y != 1:
            raise ValueError(f"shapes {a} and {b} cannot be broadcast: axis {i} has sizes {x} and {y}")
        out.append(y if x == 1 else x)
    return tuple(out)


def contiguous_strides(shape: tuple) -> tuple:
    """Row-major strides in elements: the last axis has stride 1."""
    strides, step = [], 1
    for size in reversed(tuple(shape)):
        strides.append(step)
        step *= size
    return tuple(reversed(strides))


def broadcast_strides(shape: tuple, out_shape: tuple) -> tuple:
    """Element strides of a C-contiguous array of `shape` read as an array of `out_shape`:
    0 on the axes it is broadcast along (missing or of size 1)."""
    shape, out_shape = tuple(shape), tuple(out_shape)
    pad = len(out_shape) - len(shape)
    full = contiguous_strides(shape)
    return tuple(0 if d < pad or shape[d - pad] == 1 else full[d - pad] for d in range(len(out_shape)))


def _check_float32(x, what: str) -> None:
    if x.dtype != np.float32:
        raise TypeError(f"{what}: expected a float32 array, got {x.dtype} (convert with .astype(np.float32))")
    if not x.flags.c_contiguous:
        raise ValueError(f"{what}: the array is not C-contiguous (use ascontiguousarray)")


def binary_op(a, b, op: str = "add", block: int = BLOCK):
    """op(a, b) with broadcasting, computed by the CUDA kernel: float32 arrays of any rank."""
    if op not in OPS:
        raise ValueError(f"unknown op {op!r}: choose one of {', '.join(OPS)}")
    xp = array_module(a)
    if array_module(b) is not xp:
        raise TypeError("a and b live on different devices (one NumPy, one CuPy array)")
    _check_float32(a, "a")
    _check_float32(b, "b")
    out_shape = broadcast_shape(a.shape, b.shape)
    out = xp.empty(out_shape, dtype=xp.float32)
    n = out.size
    if n == 0:
        return out
    if n >= 2**31:
        raise ValueError(f"binary_op: {n} elements do not fit the kernel's 32-bit indices")
    ndim = max(len(out_shape), 1)
    shape = out_shape or (1,)
    meta = np.array([*shape, *(broadcast_strides(a.shape, out_shape) or (0,)),
                     *(broadcast_strides(b.shape, out_shape) or (0,))], dtype=np.int32)
    meta = xp.asarray(meta)
    kernel = load_kernel("elementwise.cu", "binary_broadcast", backend=kernel_backend(xp))
    kernel(((n + block - 1) // block,), (block,),
           (a, b, out, meta, np.int32(ndim), np.int32(n), np.int32(OPS[op])))
    return out


def binary_op_reference(a, b, op: str = "add"):
    """The NumPy reference: float32 arithmetic with NumPy's broadcasting."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return _NUMPY_OPS[op](np.asarray(a, dtype=np.float32), np.asarray(b, dtype=np.float32))
