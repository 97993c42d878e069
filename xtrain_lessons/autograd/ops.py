"""The ops of the tape autograd: a forward on arrays and a hand-written backward each.

Every op is ONE graph node made with `tensor.make_node`, including the fused ones
(`rmsnorm`, `softmax`, `log_softmax`, `logsumexp`, `cross_entropy`,
`scaled_dot_product_attention`), whose backward is derived by hand instead of being
composed from smaller ops: fewer nodes, fewer temporaries, one pass where it can be.
This module holds the elementwise ops, the reductions and matmul, and is the one namespace of
all of them: the shape ops live in autograd/shape.py, the fused ones in autograd/fused.py.

Array code is written against the array module of the data (`xp`: NumPy or CuPy), and
keeps the input dtype (float32 stays float32; float64 only if the input is float64).

Public API (all also reachable as Tensor methods/operators, see `autograd`)
---------------------------------------------------------------------------
Elementwise, broadcasting (`a`, `b`: Tensor, array or Python number):
    add(a, b)  sub(a, b)  mul(a, b)  div(a, b)  pow(a, p)  (p a number or a Tensor)
    neg(x)  exp(x)  log(x)  sqrt(x)  sigmoid(x)  silu(x)  relu(x)  tanh(x)
    where(cond, a, b)       cond: boolean array (no grad), broadcast with a and b
    masked_fill(x, mask, value)   = where(mask, value, x), e.g. a causal mask with -inf
Reductions:
    sum(x, axis=None, keepdims=False)   mean(x, axis=None, keepdims=False)
    max(x, axis=None, keepdims=False)   (gradient split evenly between tied maxima)
    logsumexp(x, axis=-1, keepdims=False)   (max subtracted, the max not differentiated)
Linear algebra:
    matmul(a, b)   batched (..., M, K) @ (..., K, N) with broadcast batch dims; 1-D ok
Shape:
    reshape(x, *shape)  transpose(x, *axes)  permute(x, *axes)  swapaxes(x, a1, a2)
    broadcast_to(x, shape)   getitem(x, idx)  (basic slices and integer/boolean arrays)
    cat(tensors, axis=0)  stack(tensors, axis=0)
    split(x, split_size_or_sections, axis=0) -> list   (torch meaning: an int is the
        size of each chunk, a list gives the sizes)
    astype(x, dtype)
Fused:
    softmax(x, axis=-1)  log_softmax(x, axis=-1)
    rmsnorm(x, weight=None, eps=1e-6)          over the last axis, y = x / rms(x) * weight
    embedding(weight, ids)                     weight (V, D), ids int (...) -> (..., D)
    cross_entropy(logits, targets, ignore_index=-100)   logits (..., V), targets int (...);
        mean over the non-ignored targets; returns a scalar Tensor
    scaled_dot_product_attention(q, k, v, causal=False, scale=None, mask=None)
        q (..., Tq, D), k (..., Tk, D), v (..., Tk, Dv) -> (..., Tq, Dv);
        mask: boolean, True = may attend (torch's meaning), broadcast to (..., Tq, Tk)

Shape errors raise ValueError naming the op and the shapes involved.
"""

from __future__ import annotations

import builtins
import math
import operator

import numpy as np

from xtrain_lessons.autograd.fused import (cross_entropy, embedding, log_softmax, rmsnorm,
                                           scaled_dot_product_attention, softmax)
from xtrain_lessons.autograd.shape import (broadcast_to, cat, concatenate, getitem, permute, reshape, split, stack,
                                           swapaxes, transpose)
from xtrain_lessons.autograd.tensor import Tensor, as_tensor, make_node
from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.device import array_module

__all__ = [
    "add", "sub", "mul", "div", "pow", "neg", "exp", "log", "sqrt", "sigmoid", "silu",
    "relu", "tanh", "where", "masked_fill", "sum", "mean", "max", "logsumexp", "matmul",
    "reshape", "transpose", "permute", "swapaxes", "broadcast_to", "getitem", "cat",
    "concatenate", "stack", "split", "astype", "softmax", "log_softmax", "rmsnorm",
    "embedding", "cross_entropy", "scaled_dot_product_attention",
]


# ----------------------------------------------------------------------------------------
# helpers


def _pair(a, b):
    """Both operands as Tensors; a Python number takes the dtype of the other operand."""
    if isinstance(a, Tensor):
        return a, as_tensor(b, like=a)
    b = as_tensor(b)
    return as_tensor(a, like=b), b


def _elementwise(op, fn, a, b):
    """Run fn(a_data, b_data), turning numpy's broadcast error into one naming the op."""
    try:
        return fn(a.data, b.data)
    except ValueError:
        raise ValueError(f"{op}: shapes {a.shape} and {b.shape} cannot be broadcast "
                         f"together") from None


def _axes(axis, ndim):
    """Normalize `axis` (None, int or tuple) to a sorted tuple of non-negative ints."""
    if axis is None:
        return tuple(range(ndim))
    if isinstance(axis, int):
        axis = (axis,)
    out = []
    for a in axis:
        if not -ndim <= a < builtins.max(ndim, 1):
            raise ValueError(f"axis {a} is out of range for a tensor with {ndim} dims")
        out.append(a % builtins.max(ndim, 1))
    return tuple(sorted(out))


# ----------------------------------------------------------------------------------------
# elementwise binary ops (the engine sums gradients back over broadcast axes)


def add(a, b) -> Tensor:
    a, b = _pair(a, b)
    out = _elementwise("add", opset.add, a, b)  # same-shaped: on the threads or one GPU launch (a residual add)
    return make_node(out, (a, b), lambda g: (g, g), "add", unbroadcast=True)


def sub(a, b) -> Tensor:
    a, b = _pair(a, b)
    out = _elementwise("sub", operator.sub, a, b)
    return make_node(out, (a, b), lambda g: (g, -g if b.requires_grad else None), "sub",
                     unbroadcast=True)


def mul(a, b) -> Tensor:
    a, b = _pair(a, b)
    out = _elementwise("mul", operator.mul, a, b)

    def backward(g):
        return (g * b.data if a.requires_grad else None,
                g * a.data if b.requires_grad else None)

    return make_node(out, (a, b), backward, "mul", unbroadcast=True)


def div(a, b) -> Tensor:
    a, b = _pair(a, b)
    out = _elementwise("div", operator.truediv, a, b)

    def backward(g):
        ga = g / b.data
        # d(a/b)/db = -a/b^2 = -(a/b)/b
        gb = -ga * out if b.requires_grad else None
        return (ga if a.requires_grad else None), gb

    return make_node(out, (a, b), backward, "div", unbroadcast=True)


def pow(a, p) -> Tensor:
    """a ** p for a number p (the common case) or a Tensor p (needs a > 0 for dp)."""
    if isinstance(p, (int, float, np.number)):  # tensor ** number: one input
        a = as_tensor(a)
        out = a.data ** p

        def backward(g):
            if p == 2:
                return (g * (2 * a.data),)
            return (g * (p * a.data ** (p - 1)),)

        return make_node(out, (a,), backward, "pow")
    a, p = _pair(a, p)
    out = _elementwise("pow", operator.pow, a, p)

    def backward_tt(g):
        ga = g * p.data * a.data ** (p.data - 1) if a.requires_grad else None
        gp = g * out * array_module(out).log(a.data) if p.requires_grad else None
        return ga, gp

    return make_node(out, (a, p), backward_tt, "pow", unbroadcast=True)


def where(cond, a, b) -> Tensor:
    """Elementwise `cond ? a : b`; `cond` is a boolean array (or Tensor), not differentiated."""
    cond = cond.data if isinstance(cond, Tensor) else cond
    a, b = _pair(a, b)
    xp = array_module(a.data)
    cond = xp.asarray(cond)  # a NumPy mask with CuPy data: move it to the device
    try:
        out = xp.where(cond, a.data, b.data)
    except ValueError:
        raise ValueError(f"where: shapes {np.shape(cond)}, {a.shape} and {b.shape} cannot be "
                         f"broadcast together") from None

    def backward(g):
        zero = xp.zeros((), dtype=g.dtype)
        return (xp.where(cond, g, zero) if a.requires_grad else None,
                xp.where(cond, zero, g) if b.requires_grad else None)

    return make_node(out, (a, b), backward, "where", unbroadcast=True)


def masked_fill(x, mask, value) -> Tensor:
    """x with `value` where `mask` is True (e.g. -inf above the diagonal for causal attention)."""
    return where(mask, value, x)


# ----------------------------------------------------------------------------------------
# elementwise unary ops


def neg(x) -> Tensor:
    x = as_tensor(x)
    return make_node(-x.data, (x,), lambda g: (-g,), "neg")


def exp(x) -> Tensor:
    x = as_tensor(x)
    out = array_module(x.data).exp(x.data)
    return make_node(out, (x,), lambda g: (g * out,), "exp")


def log(x) -> Tensor:
    x = as_tensor(x)
    out = array_module(x.data).log(x.data)
    return make_node(out, (x,), lambda g: (g / x.data,), "log")


def sqrt(x) -> Tensor:
    x = as_tensor(x)
    out = array_module(x.data).sqrt(x.data)
    return make_node(out, (x,), lambda g: (g / (2 * out),), "sqrt")


def _sigmoid(xd):
    xp = array_module(xd)
    with np.errstate(over="ignore"):  # exp(-x) = inf for very negative x gives s = 0: fine
        s = xp.exp(-xd)
        s += 1
        return xp.reciprocal(s, out=s)


def sigmoid(x) -> Tensor:
    x = as_tensor(x)
    s = _sigmoid(x.data)
    return make_node(s, (x,), lambda g: (g * s * (1 - s),), "sigmoid")


def silu(x) -> Tensor:
    """x * sigmoid(x), one node: d/dx = s * (1 + x * (1 - s))."""
    x = as_tensor(x)
    s = _sigmoid(x.data)
    out = x.data * s
    return make_node(out, (x,), lambda g: (g * (s * (1 + x.data * (1 - s))),), "silu")


def relu(x) -> Tensor:
    x = as_tensor(x)
    xp = array_module(x.data)
    out = xp.maximum(x.data, 0)
    return make_node(out, (x,), lambda g: (g * (x.data > 0),), "relu")


def tanh(x) -> Tensor:
    x = as_tensor(x)
    out = array_module(x.data).tanh(x.data)
    return make_node(out, (x,), lambda g: (g * (1 - out * out),), "tanh")


def astype(x, dtype) -> Tensor:
    """Cast; the gradient is cast back to the input's dtype."""
    x = as_tensor(x)
    out = x.data.astype(dtype)
    return make_node(out, (x,), lambda g: (g.astype(x.dtype),), "astype")


# ----------------------------------------------------------------------------------------
# reductions


def _expand_back(g, x_shape, axes, keepdims):
    """Broadcast a reduced gradient back to the input shape (a read-only view, no copy)."""
    xp = array_module(g)
    if not keepdims:
        g = xp.expand_dims(g, axes)
    return xp.broadcast_to(g, x_shape)


def sum(x, axis=None, keepdims=False) -> Tensor:
    x = as_tensor(x)
    axes = _axes(axis, x.ndim)
    out = x.data.sum(axis=axes, keepdims=keepdims)
    return make_node(out, (x,), lambda g: (_expand_back(g, x.shape, axes, keepdims),), "sum")


def mean(x, axis=None, keepdims=False) -> Tensor:
    x = as_tensor(x)
    axes = _axes(axis, x.ndim)
    n = math.prod(x.shape[a] for a in axes)
    out = x.data.mean(axis=axes, keepdims=keepdims)
    return make_node(out, (x,), lambda g: (_expand_back(g * (1.0 / n), x.shape, axes, keepdims),),
                     "mean")


def max(x, axis=None, keepdims=False) -> Tensor:
    """Maximum along `axis`. The gradient goes to the maximal elements, split evenly between
    ties (as torch.amax does)."""
    x = as_tensor(x)
    axes = _axes(axis, x.ndim)
    out = x.data.max(axis=axes, keepdims=True)  # keepdims for the backward mask

    def backward(g):
        xp = array_module(g)
        hit = x.data == out  # (x.shape) True at the maxima
        count = hit.sum(axis=axes, keepdims=True)
        g = g if keepdims else xp.expand_dims(g, axes)
        return (xp.where(hit, g / count, xp.zeros((), dtype=g.dtype)).astype(x.dtype, copy=False),)

    return make_node(out if keepdims else out.squeeze(axes), (x,), backward, "max")


def logsumexp(x, axis=-1, keepdims=False) -> Tensor:
    """log(sum(exp(x))) along `axis`, stable: m + log(sum(exp(x - m))), m = max (a constant).

    The gradient is softmax(x) * g = exp(x - m) * (g / sum), from the saved exp(x - m).
    """
    x = as_tensor(x)
    xp = array_module(x.data)
    (ax,) = _axes(axis, x.ndim)
    m = x.data.max(axis=ax, keepdims=True)
    m = xp.where(xp.isfinite(m), m, 0)  # rows of -inf: avoid inf - inf = nan
    e = x.data - m
    xp.exp(e, out=e)  # exp(x - m), saved for backward
    s = e.sum(axis=ax, keepdims=True)
    out = xp.log(s) + m  # (..., 1, ...)
    if not keepdims:
        out = out.squeeze(ax)

    def backward(g):
        if not keepdims:
            g = xp.expand_dims(g, ax)
        return (e * (g / s),)  # softmax(x) * g

    return make_node(out, (x,), backward, "logsumexp")


# ----------------------------------------------------------------------------------------
# matmul


def matmul(a, b) -> Tensor:
    """(..., M, K) @ (..., K, N) -> (..., M, N), batch dims broadcast.

    dA = dC @ B^T and dB = A^T @ dC (summed over broadcast batch dims).
    """
    a, b = as_tensor(a), as_tensor(b)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape}: scalars are not allowed, use *")
    if a.ndim == 1:  # (K,) @ (..., K, N) -> (..., N)
        out = matmul(reshape(a, 1, a.shape[0]), b)
        return reshape(out, out.shape[:-2] + out.shape[-1:])
    if b.ndim == 1:  # (..., M, K) @ (K,) -> (..., M)
        out = matmul(a, reshape(b, b.shape[0], 1))
        return reshape(out, out.shape[:-1])
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not match: "
                         f"inner dimensions {a.shape[-1]} != {b.shape[-2]}")
    try:
        np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: shapes {a.shape} and {b.shape} do not match: batch dimensions "
                         f"{a.shape[:-2]} and {b.shape[:-2]} cannot be broadcast") from None
    out = opset.matmul(a.data, b.data)

    def backward(g):  # g: (..., M, N)
        ga = gb = None
        if a.requires_grad:
            ga = opset.matmul(g, b.data.swapaxes(-1, -2))  # (..., M, K)
        if b.requires_grad:
            if b.ndim == 2:
                # weight shared over the batch: one GEMM (K, B*M) @ (B*M, N) -> (K, N)
                # instead of a batch of small ones followed by a sum
                K, N = b.shape
                gb = opset.matmul(a.data.reshape(-1, K).T, g.reshape(-1, N))
            else:
                gb = opset.matmul(a.data.swapaxes(-1, -2), g)  # (..., K, N), unbroadcast by the engine
        return ga, gb

    return make_node(out, (a, b), backward, "matmul", unbroadcast=True)


# ----------------------------------------------------------------------------------------
# attach operators and methods to Tensor


def _attach():
    T = Tensor
    T.__add__ = lambda a, b: add(a, b)
    T.__radd__ = lambda a, b: add(b, a)
    T.__sub__ = lambda a, b: sub(a, b)
    T.__rsub__ = lambda a, b: sub(b, a)
    T.__mul__ = lambda a, b: mul(a, b)
    T.__rmul__ = lambda a, b: mul(b, a)
    T.__truediv__ = lambda a, b: div(a, b)
    T.__rtruediv__ = lambda a, b: div(b, a)
    T.__matmul__ = lambda a, b: matmul(a, b)
    T.__rmatmul__ = lambda a, b: matmul(b, a)
    T.__pow__ = lambda a, p: pow(a, p)
    T.__rpow__ = lambda a, b: pow(as_tensor(b, like=a), a)
    T.__neg__ = lambda a: neg(a)
    T.__getitem__ = lambda a, idx: getitem(a, idx)
    # comparisons: plain arrays, no gradient
    for name in ("lt", "le", "gt", "ge", "eq", "ne"):
        ufunc = {"lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal",
                 "eq": "equal", "ne": "not_equal"}[name]

        def cmp(a, b, _u=ufunc):
            b = b.data if isinstance(b, Tensor) else b
            return getattr(array_module(a.data), _u)(a.data, b)

        setattr(T, f"__{name}__", cmp)
    T.exp, T.log, T.sqrt, T.neg = exp, log, sqrt, neg
    T.sigmoid, T.silu, T.relu, T.tanh = sigmoid, silu, relu, tanh
    T.sum, T.mean, T.max, T.logsumexp = sum, mean, max, logsumexp
    T.softmax, T.log_softmax = softmax, log_softmax
    T.matmul, T.pow = matmul, pow
    T.reshape, T.view = reshape, reshape
    T.transpose, T.permute, T.swapaxes = transpose, permute, swapaxes
    T.broadcast_to, T.expand = broadcast_to, broadcast_to
    T.split, T.masked_fill, T.astype = split, masked_fill, astype
    T.T = property(lambda a: transpose(a))


_attach()
