"""Activation recompute (gradient checkpointing), phase T13.

A forward pass keeps, for every op, what its backward needs: a transformer block's
normalised inputs, projections, attention probabilities and MLP hidden activations. For a
deep model that is most of the memory of a training step. `checkpoint(fn, *inputs)` trades
compute for memory: the forward runs `fn` with recording switched off, so nothing inside
`fn` is kept — only the inputs (and `fn` itself). The backward runs `fn` again, this time
recording, and back-propagates the incoming gradient through that freshly built sub-graph.

    from xtrain_lessons.model.recompute import checkpoint
    y = checkpoint(block, x)          # same value as block(x); block's internals not kept
    loss = f(y); loss.backward()      # block runs a second time inside the backward

Public API
----------
checkpoint(fn, *inputs) -> Tensor
    `fn(*inputs)` must return one Tensor. Tensor inputs that require grad get their
    gradient through the checkpoint node (returned to the engine like any op's); other
    arguments (ints, arrays, constant Tensors) are passed through unchanged.
    Parameters that `fn` closes over (a model's weights) are leaves of the recomputed
    graph: the inner `backward()` accumulates into their `.grad` directly, exactly once per
    outer backward — they are not parents of the checkpoint node, so the outer sweep never
    sees them and cannot count them twice.
    The node is recorded whenever gradients are enabled, even when no input requires grad
    (a block whose only trainable tensors are closed-over parameters), so those parameters
    still receive gradients. Under `no_grad()` it is simply `fn(*inputs)`.
    Results are bit-identical to running `fn` directly on the CPU: the recomputed forward
    performs the same NumPy operations on the same arrays, and the backward the same ones
    in the same order. (One exception, inherent to floating point: a value that receives
    three or more gradient contributions, some inside `fn` and some outside, has them
    summed in another grouping, (a+b)+c instead of (a+c)+b, and agrees to rounding only.
    A transformer block has no such value.) Two conditions: `fn` must be deterministic (a dropout inside it must
    draw its mask from a counter-based RNG keyed by values fixed at forward time, see
    `xtrain_lessons.model.dropout`), and every non-leaf Tensor `fn` depends on must be passed as
    an input, not closed over (a closed-over intermediate would be back-propagated through
    twice: once from inside, once by the outer graph).
saved_bytes(root, exclude=()) -> int
    Bytes of the arrays the graph of `root` keeps alive for its backward: every op's output
    and every array its backward closure holds (walking nested closures, tuples, lists,
    dicts and Tensors), each underlying buffer counted once; buffers of leaf Tensors that
    require grad (the parameters) and of the Tensors in `exclude` are not counted.
saved_by_op(root) -> dict op name -> (count, bytes), the same walk split by op type (a
    buffer shared by several ops is attributed to the first one met).
"""

from __future__ import annotations

import types

import numpy as np

from xtrain_lessons.autograd.tensor import Tensor, enable_grad, is_grad_enabled, make_node, no_grad

__all__ = ["checkpoint", "saved_bytes", "saved_by_op", "graph_nodes"]

# A parent that requires grad, so a checkpoint node is recorded even when no input requires
# grad (only parameters closed over by fn do). It never receives a gradient (backward
# returns None for it) and is never written.
_ANCHOR = Tensor(np.zeros((), np.float32), requires_grad=True)


def checkpoint(fn, *inputs) -> Tensor:
    """fn(*inputs), keeping only the inputs; fn is re-run in the backward (see module doc)."""
    if not is_grad_enabled():
        return fn(*inputs)
    with no_grad():  # nothing inside fn is recorded, so nothing inside fn is kept
        out = fn(*inputs)
    if not isinstance(out, Tensor):
        raise TypeError(f"checkpoint: fn must return a Tensor, got {type(out).__name__}")
    tensor_pos = [i for i, a in enumerate(inputs) if isinstance(a, Tensor)]
    parents = tuple(inputs[i] for i in tensor_pos)

    def backward(g):
        # detached copies share the data (no copy) but start a fresh graph: the gradient of
        # each input comes back here instead of flowing on into the outer graph from inside
        args = list(inputs)
        fresh = {}
        for i in tensor_pos:
            t = inputs[i]
            if t.requires_grad:
                fresh[i] = args[i] = Tensor(t.data, requires_grad=True)
            else:
                args[i] = t.detach()
        with enable_grad():
            y = fn(*args)
            if y.requires_grad:
                # closed-over parameters are leaves of this graph: their .grad accumulates here
                y.backward(g)
        grads = tuple(fresh[i].grad if i in fresh else None for i in tensor_pos)
        return grads + (None,)

    return make_node(out.data, parents + (_ANCHOR,), backward, "checkpoint")


# ----------------------------------------------------------------------------------------
# measuring what a graph keeps


def graph_nodes(root: Tensor) -> list:
    """Every non-leaf Tensor of the graph of `root` (each once)."""
    seen, out, stack = set(), [], [root]
    while stack:
        t = stack.pop()
        if id(t) in seen or t._backward is None:
            continue
        seen.add(id(t))
        out.append(t)
        stack.extend(t._parents)
    return out


def _owner(a):
    """The array that owns the memory of `a` (follow the chain of views)."""
    while getattr(a, "base", None) is not None and hasattr(a.base, "nbytes") and hasattr(a.base, "shape"):
        a = a.base
    return a


def _arrays_in(obj, found: list, params: set, depth: int = 0):
    """Append every array reachable from obj through closures, containers and Tensors;
    the buffers of leaf Tensors that require grad (parameters) go to `params` instead."""
    if depth > 8 or obj is None:
        return
    if isinstance(obj, Tensor):
        if obj._backward is None and obj.requires_grad:
            params.add(id(_owner(obj.data)))
        else:
            found.append(obj.data)
    elif hasattr(obj, "nbytes") and hasattr(obj, "dtype") and hasattr(obj, "shape"):
        found.append(obj)
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            _arrays_in(o, found, params, depth + 1)
    elif isinstance(obj, dict):
        for o in obj.values():
            _arrays_in(o, found, params, depth + 1)
    elif isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                value = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            _arrays_in(value, found, params, depth + 1)
    elif isinstance(obj, types.MethodType):
        _arrays_in(obj.__func__, found, params, depth + 1)


def _excluded_buffers(root: Tensor, exclude) -> set:
    ids = set()
    stack, seen = [root], set()
    while stack:  # leaves of the graph: the parameters and inputs the caller owns
        t = stack.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if t._backward is None:
            ids.add(id(_owner(t.data)))
        stack.extend(t._parents)
    ids.update(id(_owner(t.data if isinstance(t, Tensor) else t)) for t in exclude)
    return ids


def saved_by_op(root: Tensor, exclude=()) -> dict:
    """op name -> (number of nodes, bytes of the buffers they keep); see saved_bytes."""
    skip = _excluded_buffers(root, exclude)
    per_node = []
    for t in graph_nodes(root):
        found = [t.data]
        _arrays_in(t._backward, found, skip)  # parameters met in closures join `skip`
        per_node.append((t.op, found))
    counted: set = set()
    result: dict = {}
    for op, found in per_node:
        nbytes = 0
        for a in found:
            o = _owner(a)
            if id(o) in skip or id(o) in counted:
                continue
            counted.add(id(o))
            nbytes += int(o.nbytes)
        n, b = result.get(op, (0, 0))
        result[op] = (n + 1, b + nbytes)
    return result


def saved_bytes(root: Tensor, exclude=()) -> int:
    """Bytes of activation memory the graph of `root` keeps (see module doc)."""
    return sum(b for _, b in saved_by_op(root, exclude).values())
