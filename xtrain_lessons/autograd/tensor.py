"""Tape autograd: a `Tensor` that records how it was computed, and `backward()`.

This is the engine of phase T04. Every op (in `xtrain_lessons.autograd.ops`) is one graph node
made with `make_node`; the model, the optimizer and the fused kernels of later phases
build on the same API.

    from xtrain_lessons.autograd.tensor import Tensor, no_grad
    x = Tensor(np.random.randn(4, 3), requires_grad=True, dtype=np.float32)
    w = Tensor([[1.0, 2.0], [0.5, -1.0], [0.0, 3.0]], requires_grad=True)  # float32
    loss = ((x @ w).tanh() ** 2).mean()
    loss.backward()                                          # x.grad, w.grad: arrays

Public API
----------
Tensor(data, requires_grad=False, dtype=None)
    Wraps an array (`.data`, NumPy or CuPy). Python lists/numbers become float32 unless
    they are integers (kept as int64, e.g. token ids). A float64 NumPy array stays float64.
    Attributes: `.data`, `.grad` (array of the same shape, or None), `.requires_grad`,
    `.shape`, `.dtype`, `.ndim`, `.size`, `.T`, `.is_leaf`, `.op` (name of the op that made it).
    Methods: `.backward(grad=None)`, `.item()`, `float(t)`, `.numpy()`, `.detach()`,
    `.zero_grad()`, `.retain_grad()`, `.requires_grad_()`, `.astype(dtype)`, plus the ops of
    `ops.py` as methods
    (`x.sum(axis=-1)`, `x.reshape(2, -1)`, `x.exp()`, ...).
    Operators: `+ - * / @ **`, unary `-`, the reflected forms (`2.0 * x`, `1 - x`,
    `np_array @ x`), and indexing `x[idx]`. Comparisons (`<`, `==`, ...) return plain
    arrays with no gradient. Python numbers and arrays are accepted as constants.

make_node(data, parents, backward, op, unbroadcast=False) -> Tensor
    The extension API. `data` is the output array (already computed), `parents` the
    tuple of input Tensors, `backward(grad_out) -> tuple` returns one gradient array per
    parent (or None where a parent needs none). Rules for `backward`:
      * `grad_out` has the shape of `data`; never modify it in place (it may be shared).
      * the returned arrays may be views, broadcast views or shared with `grad_out`: the
        engine never writes into them.
      * with `unbroadcast=False` (the default) each gradient must already have its
        parent's shape; with `unbroadcast=True` the engine sums a gradient that has the
        broadcast shape back to the parent's shape (what elementwise ops need).
      * a gradient with the wrong shape raises a ValueError naming the op and both shapes;
        a gradient of another float dtype is cast to the parent's dtype.
    If gradients are disabled (`no_grad`) or no parent requires grad, no graph is recorded
    and the output is a plain constant Tensor.

Tensor.backward(grad=None)
    Reverse-mode sweep over the recorded graph in reverse topological order (iterative:
    deep graphs do not hit Python's recursion limit). `grad` defaults to 1 for a scalar
    output; a non-scalar output needs an explicit `grad`. Gradients are summed where a
    value fans out. Only leaves with `requires_grad` (and tensors that called
    `retain_grad()`) keep `.grad`.
    Calling backward twice ACCUMULATES into `.grad` (as torch does); the graph is kept
    (never freed), so this is always allowed. Call `zero_grad()` between steps.
    `grad` is cast to the output's dtype. Each leaf's `.grad` is its own writable array
    (optimizers may update it in place).
    Memory: the graph (and the arrays the backward closures saved) lives as long as the
    output Tensor is referenced; there are no reference cycles, so rebinding `loss` each
    step frees the previous step's graph at once.
    Ops keep references to their inputs' arrays, and several ops return views: do not
    modify a `.data` in place between a forward and its backward.

no_grad()            context manager: ops inside record nothing (per thread, like torch).
enable_grad()        context manager: record again inside a no_grad() block.
is_grad_enabled()    True unless inside `no_grad()`.
unbroadcast(g, shape) sum a broadcast gradient back to `shape`.
topological_order(root)  the tensors `root` depends on (that require grad), parents first.
tensor(...)          alias of Tensor(...);  as_tensor(x, like=None) wraps a constant.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Callable, Sequence

import numpy as np

from xtrain_lessons.runtime.device import array_module, is_array, to_device_of, to_host
from xtrain_lessons.runtime import opset

__all__ = [
    "Tensor", "tensor", "as_tensor", "make_node", "no_grad", "enable_grad",
    "is_grad_enabled", "unbroadcast", "topological_order",
]

DEFAULT_DTYPE = np.float32


# ----------------------------------------------------------------------------------------
# small helpers


def unbroadcast(g, shape: tuple):
    """Sum the gradient `g` (of a broadcast shape) back to `shape`.

    Broadcasting prepends dimensions and stretches size-1 dimensions; the gradient of a
    stretched input is the sum over the stretched axes.
    """
    shape = tuple(shape)
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    if extra < 0:
        raise ValueError(f"unbroadcast: gradient shape {g.shape} has fewer dims than {shape}")
    if extra:  # leading dims added by broadcasting
        g = g.sum(axis=tuple(range(extra)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and g.shape[i] != 1)
    if axes:  # dims stretched from size 1
        g = g.sum(axis=axes, keepdims=True)
    if g.shape != shape:
        raise ValueError(f"unbroadcast: cannot reduce gradient of shape {g.shape} to {shape}")
    return g


# Grad mode is per thread, as in torch: a thread evaluating under no_grad() does not switch
# recording off for another thread that is training (T17 runs replicas as threads).
_grad_mode = threading.local()


def is_grad_enabled() -> bool:
    """Are ops currently being recorded (in this thread)?"""
    return getattr(_grad_mode, "enabled", True)


@contextlib.contextmanager
def _set_grad_enabled(mode: bool):
    previous = is_grad_enabled()
    _grad_mode.enabled = mode
    try:
        yield
    finally:
        _grad_mode.enabled = previous


def no_grad():
    """`with no_grad():` ops record no graph (evaluation, optimizer updates)."""
    return _set_grad_enabled(False)


def enable_grad():
    """`with enable_grad():` re-enable recording inside a `no_grad()` block."""
    return _set_grad_enabled(True)


def _is_float(dtype) -> bool:
    """Floating dtypes (including ml_dtypes' bfloat16, whose numpy kind is 'V')."""
    return dtype.kind == "f" or dtype.name == "bfloat16"


def _to_array(data, dtype=None):
    """Turn lists, Python numbers and arrays into an array; floats default to float32."""
    if isinstance(data, Tensor):
        data = data.data
    if dtype is not None:
        xp = array_module(data)
        return xp.asarray(data, dtype=dtype)
    if is_array(data):
        if isinstance(data, np.generic):  # numpy scalar: keep its dtype
            return np.asarray(data)
        return data
    arr = np.asarray(data)  # Python lists / numbers
    if arr.dtype.kind == "f":
        arr = arr.astype(DEFAULT_DTYPE)  # float64 by default in NumPy; the course uses float32
    elif arr.dtype.kind not in "iub":
        raise TypeError(f"Tensor: unsupported data of dtype {arr.dtype}")
    return arr


# ----------------------------------------------------------------------------------------
# the Tensor


class Tensor:
    """An array plus the recipe (parents, backward closure) that produced it."""

    __slots__ = ("data", "grad", "requires_grad", "_parents", "_backward", "_unbroadcast",
                 "op", "_retain", "grad_buffer", "__weakref__")  # grad_buffer: see _accumulate_into
    # make numpy defer to our reflected operators: `np_array * tensor` -> Tensor.__rmul__
    __array_ufunc__ = None
    __array_priority__ = 1000

    def __init__(self, data, requires_grad: bool = False, dtype=None):
        self.data = _to_array(data, dtype)
        if requires_grad and not _is_float(self.data.dtype):
            raise TypeError(f"Tensor: only floating tensors can require grad "
                            f"(got {self.data.dtype})")
        self.grad = None
        self.requires_grad = bool(requires_grad)
        self._parents: tuple = ()
        self._backward = None
        self._unbroadcast = False
        self.op = "leaf"
        self._retain = False

    # -- array-like attributes --
    shape = property(lambda self: self.data.shape)
    dtype = property(lambda self: self.data.dtype)
    ndim = property(lambda self: self.data.ndim)
    size = property(lambda self: self.data.size)
    is_leaf = property(lambda self: self._backward is None)
    xp = property(lambda self: array_module(self.data))

    def __len__(self):
        return len(self.data)

    def __repr__(self):
        grad = f", requires_grad=True" if self.requires_grad else ""
        op = f", op={self.op}" if self._backward is not None else ""
        body = np.array2string(self.numpy(), precision=4, threshold=20, edgeitems=2,
                               prefix="Tensor(")
        return f"Tensor({body}, dtype={self.dtype}{grad}{op})"

    def item(self):
        return self.data.item()

    def __float__(self):  # float(loss) for logging
        return float(self.data)

    def __bool__(self):  # NumPy's rule: only a one-element tensor has a truth value
        return bool(self.data)

    def numpy(self) -> np.ndarray:
        """The data as a NumPy array (copied from the GPU when it lives there)."""
        return to_host(self.data)

    def detach(self) -> "Tensor":
        """Same data (shared, no copy), cut from the graph, requires_grad=False."""
        return Tensor(self.data)

    def zero_grad(self):
        """Forget the accumulated gradient (`.grad = None`)."""
        self.grad = None

    def retain_grad(self):
        """Keep `.grad` on this intermediate tensor during backward."""
        self._retain = True
        return self

    def requires_grad_(self, flag: bool = True):
        if flag and not _is_float(self.data.dtype):
            raise TypeError(f"Tensor: only floating tensors can require grad "
                            f"(got {self.data.dtype})")
        self.requires_grad = bool(flag)
        return self

    __hash__ = object.__hash__  # __eq__ below returns an array, keep identity hashing

    # -- backward --
    def backward(self, grad=None):
        """Accumulate d(self)/d(leaf) * grad into every leaf's `.grad` (see module doc)."""
        if not self.requires_grad:
            raise RuntimeError("backward: this tensor does not require grad "
                               "(no input requires grad, or it was made under no_grad())")
        xp = array_module(self.data)
        if grad is None:
            if self.size != 1:
                raise RuntimeError(f"backward: grad can be omitted only for a scalar output, "
                                   f"got shape {self.shape}")
            grad = xp.ones(self.shape, dtype=self.dtype)
        else:
            grad = xp.asarray(grad.data if isinstance(grad, Tensor) else grad, dtype=self.dtype)
            if grad.shape != self.shape:
                raise ValueError(f"backward: grad shape {grad.shape} != tensor shape {self.shape}")

        order = topological_order(self)
        grads = {id(self): grad}  # id(tensor) -> gradient array, freed once consumed
        sums = set()  # ids whose gradient is a sum made here: ours to add into in place
        for t in reversed(order):
            g = grads.pop(id(t), None)
            if g is None:
                continue
            if t._backward is None or t._retain:
                _accumulate_into(t, g)
            if t._backward is None:
                continue
            parent_grads = t._backward(g)
            if not isinstance(parent_grads, (tuple, list)) or len(parent_grads) != len(t._parents):
                raise RuntimeError(f"{t.op}: backward must return a tuple of {len(t._parents)} "
                                   f"gradients (one per parent)")
            for p, gp in zip(t._parents, parent_grads):
                if gp is None or not p.requires_grad:
                    continue
                if t._unbroadcast:
                    gp = unbroadcast(gp, p.shape)
                if gp.shape != p.shape:
                    raise ValueError(f"{t.op}: backward returned a gradient of shape {gp.shape} "
                                     f"for a parent of shape {p.shape}")
                if gp.dtype != p.dtype:
                    gp = gp.astype(p.dtype)
                prev = grads.get(id(p))
                # fan-out: sum the contributions; the first sum out of place (`prev` may be
                # shared with another tensor), later ones into that sum
                if prev is None:
                    grads[id(p)] = gp
                elif id(p) in sums:
                    opset.add(prev, gp, out=prev)
                else:
                    grads[id(p)] = opset.add(prev, gp)  # large float32: on the threads (a GPU: one launch)
                    sums.add(id(p))

    # -- operators: defined in ops.py, attached at the bottom of this file --


def _accumulate_into(t: Tensor, g):
    if t.grad is None:
        buffer = getattr(t, "grad_buffer", None)  # where an optimizer wants it (AdamW's flat buffer)
        if buffer is not None and buffer.shape == g.shape and buffer.dtype == t.dtype:
            buffer[...] = g
            t.grad = buffer
            return
        # own a fresh contiguous copy: `g` may be a read-only broadcast view or shared
        # with another tensor's gradient, and optimizers update .grad in place
        xp = array_module(g)
        t.grad = xp.array(g, dtype=t.dtype, copy=True)
    else:
        t.grad += g


def topological_order(root: Tensor) -> list:
    """Tensors reachable from `root` that require grad, parents before children.

    Iterative depth-first search with an explicit stack (post-order), so a chain of
    100 000 ops does not overflow Python's recursion limit.
    """
    order, visited = [], {id(root)}
    stack = [(root, iter(root._parents))]
    while stack:
        node, parents = stack[-1]
        for p in parents:
            if p.requires_grad and id(p) not in visited:
                visited.add(id(p))
                stack.append((p, iter(p._parents)))
                break
        else:  # all parents done: emit the node
            stack.pop()
            order.append(node)
    return order


# ----------------------------------------------------------------------------------------
# the extension API


def make_node(data, parents: Sequence[Tensor],
              backward: Callable[[object], tuple], op: str,
              unbroadcast: bool = False) -> Tensor:
    """Wrap `data` as the output of op `op` applied to `parents` (see module docstring).

    `backward(grad_out)` returns one gradient per parent (None allowed). With
    `unbroadcast=True` the engine sums each gradient back to its parent's shape.
    """
    if isinstance(data, np.generic):  # NumPy reductions return scalars: keep a 0-d array
        data = np.asarray(data)
    parents = tuple(parents)
    for i, p in enumerate(parents):
        if not isinstance(p, Tensor):
            raise TypeError(f"{op}: make_node parents must be Tensors, got {type(p).__name__} "
                            f"at position {i} (wrap constants with as_tensor)")
    out = Tensor.__new__(Tensor)
    out.data = data
    out.grad = None
    out._retain = False
    out.op = op
    if any(p.requires_grad for p in parents) and is_grad_enabled():
        out.requires_grad = True
        out._parents = parents
        out._backward = backward
        out._unbroadcast = unbroadcast
    else:  # nothing to differentiate: do not keep the inputs alive
        out.requires_grad = False
        out._parents = ()
        out._backward = None
        out._unbroadcast = False
    return out


def tensor(data, requires_grad: bool = False, dtype=None) -> Tensor:
    """Same as `Tensor(data, requires_grad, dtype)`."""
    return Tensor(data, requires_grad=requires_grad, dtype=dtype)


def as_tensor(x, like: Tensor | None = None) -> Tensor:
    """`x` if it is a Tensor, else a constant Tensor. A Python number takes the dtype of
    `like` (so `0.5 * float32_tensor` stays float32). A NumPy scalar or 0-d array meeting a
    Tensor on the GPU moves to the GPU with its dtype (as torch lets a 0-d CPU tensor meet a
    CUDA one); CuPy refuses host arrays of any rank as operands."""
    if isinstance(x, Tensor):
        return x
    if like is not None and isinstance(x, (int, float, bool)):
        xp = array_module(like.data)
        dtype = like.dtype if like.dtype.kind == "f" else (
            DEFAULT_DTYPE if isinstance(x, float) else like.dtype)
        return Tensor(xp.asarray(x, dtype=dtype))
    if like is not None and getattr(x, "ndim", None) == 0:  # a scalar array goes where `like` lives
        return Tensor(to_device_of(x, like.data))
    return Tensor(x)


