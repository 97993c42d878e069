"""The shape ops of the tape autograd (phase T04): views and copies that move values around; each
backward moves the gradient back to where the values came from.

    reshape(x, *shape)  transpose(x, *axes)  permute(x, *axes)  swapaxes(x, a1, a2)
    broadcast_to(x, shape)   getitem(x, idx)  (basic slices and integer/boolean arrays)
    cat(tensors, axis=0)  stack(tensors, axis=0)  split(x, split_size_or_sections, axis=0) -> list

All are reachable through `autograd.ops` and as Tensor methods.
"""

from __future__ import annotations

import builtins

import numpy as np

from xtrain_lessons.autograd.tensor import Tensor, as_tensor, make_node
from xtrain_lessons.runtime.device import array_module, scatter_add

__all__ = ["reshape", "transpose", "permute", "swapaxes", "broadcast_to", "getitem", "cat", "concatenate", "stack",
           "split"]


def _shape_arg(shape):
    """Accept reshape(x, 2, 3) and reshape(x, (2, 3))."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def reshape(x, *shape) -> Tensor:
    x = as_tensor(x)
    shape = _shape_arg(shape)
    try:
        out = x.data.reshape(shape)
    except ValueError:
        raise ValueError(f"reshape: cannot reshape {x.shape} (size {x.size}) "
                         f"into {shape}") from None
    return make_node(out, (x,), lambda g: (g.reshape(x.shape),), "reshape")


def transpose(x, *axes) -> Tensor:
    """Permute the axes (all reversed when none are given, like NumPy)."""
    x = as_tensor(x)
    axes = _shape_arg(axes) or tuple(reversed(range(x.ndim)))
    if sorted(a % builtins.max(x.ndim, 1) for a in axes) != list(range(x.ndim)):
        raise ValueError(f"transpose: axes {axes} are not a permutation for shape {x.shape}")
    out = x.data.transpose(axes)
    inverse = tuple(np.argsort([a % x.ndim for a in axes]))
    return make_node(out, (x,), lambda g: (g.transpose(inverse),), "transpose")


permute = transpose


def swapaxes(x, axis1, axis2) -> Tensor:
    x = as_tensor(x)
    out = x.data.swapaxes(axis1, axis2)
    return make_node(out, (x,), lambda g: (g.swapaxes(axis1, axis2),), "swapaxes")


def broadcast_to(x, shape) -> Tensor:
    """A broadcast (read-only) view; the gradient is summed back over the broadcast axes."""
    x = as_tensor(x)
    shape = tuple(shape)
    try:
        out = array_module(x.data).broadcast_to(x.data, shape)
    except ValueError:
        raise ValueError(f"broadcast_to: cannot broadcast {x.shape} to {shape}") from None
    return make_node(out, (x,), lambda g: (g,), "broadcast_to", unbroadcast=True)


def _unwrap_index(idx):
    if isinstance(idx, Tensor):
        return idx.data
    if isinstance(idx, tuple):
        return tuple(i.data if isinstance(i, Tensor) else i for i in idx)
    return idx


def _is_advanced(idx):
    """Does `idx` contain an array or list (NumPy advanced indexing: positions may repeat)?"""
    items = idx if isinstance(idx, tuple) else (idx,)
    return builtins.any(isinstance(i, list) or (hasattr(i, "ndim") and i.ndim > 0) for i in items)


def getitem(x, idx) -> Tensor:
    """x[idx]. Backward scatters into zeros: assignment for slices (positions are unique),
    `add.at` for integer arrays (the same row may be picked twice: contributions add)."""
    x = as_tensor(x)
    idx = _unwrap_index(idx)
    out = x.data[idx]
    advanced = _is_advanced(idx)

    def backward(g):
        xp = array_module(g)
        gx = xp.zeros(x.shape, dtype=g.dtype)
        if advanced:
            scatter_add(gx, idx, g)
        else:
            gx[idx] = g
        return (gx,)

    return make_node(out, (x,), backward, "getitem")


def cat(tensors, axis=0) -> Tensor:
    """Concatenate along `axis`; backward hands each input its slice of the gradient."""
    tensors = [as_tensor(t) for t in tensors]
    xp = array_module(tensors[0].data)
    try:
        out = xp.concatenate([t.data for t in tensors], axis=axis)
    except ValueError:
        raise ValueError(f"cat: shapes {[t.shape for t in tensors]} do not match "
                         f"outside axis {axis}") from None
    ax = axis % out.ndim
    bounds = np.cumsum([t.shape[ax] for t in tensors])[:-1].tolist()

    def backward(g):
        return tuple(xp.split(g, bounds, axis=ax))

    return make_node(out, tensors, backward, "cat")


concatenate = cat


def stack(tensors, axis=0) -> Tensor:
    tensors = [as_tensor(t) for t in tensors]
    xp = array_module(tensors[0].data)
    shapes = {t.shape for t in tensors}
    if len(shapes) != 1:
        raise ValueError(f"stack: all shapes must be equal, got {[t.shape for t in tensors]}")
    out = xp.stack([t.data for t in tensors], axis=axis)
    ax = axis % out.ndim

    def backward(g):
        return tuple(xp.moveaxis(g, ax, 0))

    return make_node(out, tensors, backward, "stack")


def split(x, split_size_or_sections, axis=0) -> list:
    """torch.split: an int is the size of each chunk (the last may be smaller), a list the
    sizes. Each chunk is a view node whose backward places its gradient in a zero array."""
    x = as_tensor(x)
    ax = axis % x.ndim
    n = x.shape[ax]
    if isinstance(split_size_or_sections, int):
        step = split_size_or_sections
        sizes = [builtins.min(step, n - i) for i in range(0, n, step)]
    else:
        sizes = list(split_size_or_sections)
        if builtins.sum(sizes) != n:
            raise ValueError(f"split: sizes {sizes} do not sum to {n} (axis {axis} of {x.shape})")
    outs, start = [], 0
    for size in sizes:
        idx = (slice(None),) * ax + (slice(start, start + size),)
        outs.append(getitem(x, idx))
        start += size
    return outs
