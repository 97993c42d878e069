"""Finite-difference gradient check for the tape autograd.

    gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, raise_exception=True, seed=0) -> bool

`fn(*tensors)` returns a Tensor (or a list/tuple of Tensors) built from the inputs with the
ops of `xtrain_lessons.autograd.ops`. `inputs` are Tensors or arrays. Every floating input is
checked unless it is a Tensor with `requires_grad=False`; integer inputs (token ids,
targets) are passed through unchanged.

How: the inputs are copied to float64; the output is reduced to a scalar
L = sum(out * R) with a fixed random R (so every output element matters); the analytical
dL/dx comes from one `backward()`, the numerical one from central differences
(L(x + eps) - L(x - eps)) / (2 eps) for every element of every checked input. They
agree if |analytical - numerical| <= atol + rtol * |numerical| everywhere.

On a mismatch it raises `GradcheckError` (an AssertionError) naming the input, the
element index, both values and the op that produced the output, or returns False
(printing the same message) when `raise_exception=False`.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.autograd.tensor import Tensor, no_grad
from xtrain_lessons.runtime.device import to_host

__all__ = ["gradcheck", "GradcheckError", "numerical_grad"]


class GradcheckError(AssertionError):
    """Analytical and numerical gradients disagree."""


def _as_list(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _project(outs, weights):
    """L = sum_i sum(out_i * R_i) as a Python float (float64)."""
    return float(sum(float((o.data * w).sum()) for o, w in zip(outs, weights)))


def numerical_grad(fn, tensors, weights, which: int, eps: float):
    """Central-difference dL/d(tensors[which]) in float64, element by element."""
    x = tensors[which].data  # float64 (perturbed in place, then restored)
    grad = np.zeros(x.shape, dtype=np.float64)
    with no_grad():
        for i in np.ndindex(*x.shape):
            orig = x[i]
            x[i] = orig + eps
            plus = _project(_as_list(fn(*tensors)), weights)
            x[i] = orig - eps
            minus = _project(_as_list(fn(*tensors)), weights)
            x[i] = orig
            grad[i] = (plus - minus) / (2 * eps)
    return grad


def gradcheck(fn, inputs, eps=1e-6, atol=1e-5, rtol=1e-4, raise_exception=True, seed=0) -> bool:
    """True if the gradients of `fn` agree with central differences (see module doc)."""
    tensors, checked = [], []
    for i, x in enumerate(inputs):
        data = x.data if isinstance(x, Tensor) else x
        data = to_host(data)
        wants = data.dtype.kind == "f" and (not isinstance(x, Tensor) or x.requires_grad)
        if data.dtype.kind == "f":
            data = np.array(data, dtype=np.float64, order="C")  # own copy: perturbed in place
        tensors.append(Tensor(data, requires_grad=wants))
        if wants:
            checked.append(i)
    if not checked:
        raise ValueError("gradcheck: no floating input requires grad")

    outs = _as_list(fn(*tensors))
    rng = np.random.default_rng(seed)
    weights = [rng.standard_normal(o.shape) for o in outs]
    op = ", ".join(o.op for o in outs)
    # analytical: one backward of L = sum(out * R)
    for o, w in zip(outs, weights):
        if o.requires_grad:
            o.backward(w.astype(o.dtype))

    for i in checked:
        t = tensors[i]
        analytical = t.grad if t.grad is not None else np.zeros(t.shape)
        numerical = numerical_grad(fn, tensors, weights, i, eps)
        bad = np.abs(analytical - numerical) > atol + rtol * np.abs(numerical)
        if bad.any():
            # report the worst element
            err = np.where(bad, np.abs(analytical - numerical), -1.0)
            idx = np.unravel_index(int(np.argmax(err)), t.shape)
            msg = (f"gradcheck failed for input {i} (shape {t.shape}) of op {op}: at index "
                   f"{tuple(int(j) for j in idx)} analytical {analytical[idx]:.8g} vs numerical "
                   f"{numerical[idx]:.8g} ({int(bad.sum())} of {bad.size} elements differ; "
                   f"atol={atol}, rtol={rtol})")
            if raise_exception:
                raise GradcheckError(msg)
            print(msg)
            return False
    return True
