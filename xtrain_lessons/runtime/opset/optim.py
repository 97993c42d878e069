"""The optimizer's ops: AdamW over flat buffers, the global gradient norm and the clip, the fp16
loss scale's update (phases T06, T07, T07b, T12b).

    segments = [Segment(lo, hi, lr, betas, eps, weight_decay, step), ...]   # slices of the flat buffers
    norm = grad_norm_and_clip(grads, flat_grad, factors, max_norm, scale_state=None)
    adamw(p, g, m, v, segments, factors=None, where=None, step_scalars=None)
    loss_scale_update(state, factors, growth_factor, backoff_factor, growth_interval, dynamic)
    norm = grad_norm(grads);  scale_arrays(arrays, coef)          # torch's clip_grad_norm_, in pieces

The parameters, their gradients and AdamW's two moments each live in ONE flat buffer
(training/optim/adamw.py lays them out), a parameter's arrays being views of it. `factors` is a
float32 (3,) array on the device: [the global norm, the factor the step multiplies the gradients by
(the clip, and 1 / loss scale with fp16), 1.0 when the step must be skipped (a gradient was not
finite)]; grad_norm_and_clip writes it, adamw reads it.

  * GPU: the norm and the factor in two launches over the flat gradient (kernels/grad_norm.cu:
    squares summed in double over a fixed grid), the update in one launch over the flat buffers
    (kernels/adamw.cu), the loss scale in one (kernels/grad_scaler.cu): nothing read on the host.
  * CPU: one C++ task per gradient for the sums of squares (float64, added in parameter order),
    the clip as a scale of the gradients in place, the update over the parameters' slices in one
    hand-over to the worker pool (runtime/host/fused_rows.cpp): each float32 constant rounded as
    NumPy rounds it, so NumPy's bits; the NumPy reference (`_adamw_update`) for anything else.
Every update follows torch.optim.AdamW's arithmetic (see `_adamw_update`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from xtrain_lessons.runtime.cpu_threads import map_items, map_rows
from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.runtime.host import fused_rows
from xtrain_lessons.runtime.kernels import adamw as _adamw
from xtrain_lessons.runtime.kernels import grad_scaler as _scaler
from xtrain_lessons.runtime.kernels.grad_norm import NORM_GRID, global_norm_and_clip
from xtrain_lessons.runtime.opset.dispatch import on_gpu
from xtrain_lessons.runtime.opset.table import op

__all__ = ["Segment", "adamw", "adamw_step_scalars", "grad_norm", "scale_arrays", "grad_norm_and_clip",
           "loss_scale_update", "NORM_GRID"]

adamw_step_scalars = _adamw.adamw_step_scalars  # [decay, bc2_sqrt, neg_step] of a step, for a graph's replay


@dataclass(frozen=True)
class Segment:
    """Elements lo..hi-1 of the flat buffers: one parameter, its hyperparameters and its step (1-based)."""
    lo: int
    hi: int
    lr: float
    betas: tuple
    eps: float
    weight_decay: float
    step: int


# ----- the gradient norm and the clip
@op("optimizer", cpu="host/fused_rows.cpp: sum_squares", gpu="(per-gradient reductions)",
    reference="opset/optim.py: grad_norm", test="test_optim.py")
def grad_norm(grads):
    """‖(g₁, g₂, …)‖₂ over the arrays `grads`, accumulated in float64 in their order: a 0-d float64
    array on their device (nothing read on the host)."""
    sums = fused_rows.sum_squares(grads)  # float32 on the CPU: C++, one task per gradient
    if sums is not None:
        total = 0.0
        for s in sums:  # in parameter order
            total += float(s)
        return np.sqrt(np.float64(total))
    xp = array_module(grads[0])

    def square_sums(i, j):  # whole gradients, one reduction each: the same bits on any split
        return [xp.sum(xp.square(g.astype(np.float64, copy=False))) for g in grads[i:j]]

    total = None  # summed on the device, in parameter order
    for group in map_items(square_sums, [g.size for g in grads], like=grads[0]):
        for s in group:
            total = s if total is None else total + s
    return xp.sqrt(total)


@op("optimizer", cpu="host/fused_rows.cpp: scale_arrays", gpu="(one multiply per array)",
    reference="opset/optim.py: scale_arrays", test="test_optim.py")
def scale_arrays(arrays, coef) -> None:
    """a *= coef in place for every array (a clip's scale), coef rounded to each array's dtype; coef
    a Python float or a 0-d array on the arrays' device."""
    as_dtype = coef.astype if hasattr(coef, "astype") else (lambda dtype: dtype.type(coef))
    if not arrays or fused_rows.scale_arrays(arrays, as_dtype(np.dtype(np.float32))):
        return

    def scale(i, j):
        for a in arrays[i:j]:
            a *= as_dtype(a.dtype)

    map_items(scale, [a.size for a in arrays], like=arrays[0])


@op("optimizer", cpu="host/fused_rows.cpp: sum_squares", gpu="kernels/grad_norm.cu: grad_norm_partials",
    reference="kernels/grad_norm.py: global_norm_and_clip_reference", test="test_kernels_step.py")
def grad_norm_and_clip(grads, flat_grad, factors, max_norm: float, eps: float = 1e-6, scale_state=None,
                       partials=None):
    """The global norm of the gradients and the step's factors (module doc), written into `factors`;
    returns the norm as a 0-d array on the device. `grads`: the gradients in parameter order (views
    of `flat_grad`); `scale_state`: fp16's [scale, ...] on the device: the gradients are unscaled by
    it and a non-finite norm skips the step. max_norm <= 0: no clipping."""
    if on_gpu(flat_grad) and flat_grad.dtype == np.float32:
        global_norm_and_clip(flat_grad, partials, factors, max_norm, eps, scale_state=scale_state)
        return factors[0]
    if scale_state is not None:  # the gradients unscaled in place, as GradScaler.unscale_ does
        inv = np.float32(1.0 / np.float64(scale_state[0]))
        for g in grads:
            g *= g.dtype.type(inv)
    norm = grad_norm(grads) if grads else np.zeros((), np.float64)
    finite = math.isfinite(float(norm))
    coef = float(max_norm) / (float(norm) + eps) if max_norm is not None and max_norm > 0 and finite else 1.0
    factors[0], factors[1], factors[2] = norm, min(coef, 1.0), 0.0 if finite else 1.0
    return norm


# ----- AdamW
def _uniform(segments, n: int):
    """(step, lr, betas, eps, weight_decay, n_decay) when one launch over the whole flat buffer can
    make every segment's update (the decayed segments first, all else shared), else None."""
    first = segments[0]
    decays = [s.weight_decay != 0.0 for s in segments]
    n_decay = max((s.hi for s in segments if s.weight_decay != 0.0), default=0)
    wd = {s.weight_decay for s in segments if s.weight_decay != 0.0}
    same = all((s.lr, tuple(s.betas), s.eps, s.step) == (first.lr, tuple(first.betas), first.eps, first.step)
               for s in segments)
    covers = segments[0].lo == 0 and segments[-1].hi == n and all(a.hi == b.lo for a, b in zip(segments, segments[1:]))
    if not (same and covers and len(wd) <= 1 and decays == sorted(decays, reverse=True)):
        return None
    return first.step, first.lr, tuple(first.betas), first.eps, (wd.pop() if wd else 0.0), n_decay


@op("optimizer", cpu="host/fused_rows.cpp: adamw_arrays", gpu="kernels/adamw.cu: adamw_step_scaled",
    reference="opset/optim.py: _adamw_update", test="test_kernels_adamw.py")
def adamw(p, g, m, v, segments, factors=None, where=None, step_scalars=None, kernel=None) -> bool:
    """One AdamW update, in place, of every segment of the flat buffers p (parameters), g
    (gradients), m, v (moments). `factors` (grad_norm_and_clip's): the gradients multiplied by
    factors[1], no update when factors[2] != 0. `where`: a 0-d boolean array: no update unless True
    (a skip decided on the device). `step_scalars`: [decay, bc2_sqrt, neg_step] read on the device
    (a step replayed from a CUDA graph; adamw_step_scalars). `kernel`: another compiled adamw_step
    (T07b's exercise). Returns True when the host knows that factors[2] skipped the update (the CPU:
    torch's GradScaler then does not count the step); on a GPU that is known on the device only."""
    if not segments:
        return False
    if (on_gpu(p) and p.dtype == np.float32) or kernel is not None:  # the CUDA kernel (T07b's: on the emulator too)
        _adamw_flat(p, g, m, v, segments, factors, where, step_scalars, kernel)
        return False
    if factors is not None:
        if factors[2] != 0:
            return True
        if factors[1] != 1.0:
            scale_arrays([g[s.lo:s.hi] for s in segments], float(factors[1]))
    if where is not None and not bool(where):
        return False
    updates = []
    for s in segments:
        (b1, b2), t = s.betas, s.step
        updates.append(((p[s.lo:s.hi], g[s.lo:s.hi], m[s.lo:s.hi], v[s.lo:s.hi]),
                        (s.lr, b1, b2, s.eps, s.weight_decay, 1.0 - b1 ** t, math.sqrt(1.0 - b2 ** t), None)))
    _adamw_updates(fused_rows.adamw_arrays(updates))  # the C++ pool first; NumPy for what it left
    return False


def _adamw_flat(p, g, m, v, segments, factors, where, step_scalars, kernel) -> None:
    xp = array_module(p)
    if where is not None:  # skip when `where` is False: factors[2] = max(factors[2], not where)
        factors = factors if factors is not None else xp.asarray(np.array([0.0, 1.0, 0.0], np.float32))
        skip = xp.logical_not(where).astype(np.float32)
        factors[2:3] = xp.maximum(factors[2:3], skip)
    shared = _uniform(segments, p.size)
    if shared is None:  # groups that differ: one launch per segment
        for s in segments:
            piece = slice(s.lo, s.hi)
            adamw(p[piece], g[piece], m[piece], v[piece], [Segment(0, s.hi - s.lo, *_hyper(s))], factors,
                  kernel=kernel)
        return
    step, lr, betas, eps, wd, n_decay = shared
    if step_scalars is not None:
        if factors is None:
            raise ValueError("adamw: step_scalars needs grad_norm_and_clip's factors (call it first)")
        _adamw.adamw_flat_graphed(p, g, m, v, factors, step_scalars, betas, eps, n_decay)
    elif factors is None:
        _adamw.adamw_flat(p, g, m, v, step, lr, betas, eps, wd, n_decay, kernel=kernel)
    else:
        _adamw.adamw_flat_scaled(p, g, m, v, factors, step, lr, betas, eps, wd, n_decay)


def _hyper(s: Segment):
    return s.lr, s.betas, s.eps, s.weight_decay, s.step


def _adamw_update(theta, grad, m, v, lr, b1, b2, eps, wd, bc1, bc2_sqrt, where=None):
    """One AdamW update of one parameter (or a slice of it), in place, torch.optim.AdamW's arithmetic:

        θ ← θ · (1 − lr·λ);  m ← m + (1 − β1)·(g − m);  v ← β2·v + (1 − β2)·g²
        θ ← θ − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + ε)

    With `where` (a 0-d boolean array) the new values are computed aside and copied in only where
    it is True: the same arithmetic, so the same bits as the in-place update when it is applied."""
    xp = array_module(theta)
    if where is not None:
        theta_new, m_new, v_new = theta.copy(), m.copy(), v.copy()
        _adamw_update(theta_new, grad, m_new, v_new, lr, b1, b2, eps, wd, bc1, bc2_sqrt)
        for dst, src in ((theta, theta_new), (m, m_new), (v, v_new)):
            xp.copyto(dst, src, where=where)
        return
    if wd != 0.0:
        theta *= 1.0 - lr * wd
    # m ← m + (1−β1)(g − m): torch's lerp, written the same way
    m += (1.0 - b1) * (grad - m)
    v *= b2
    v += (1.0 - b2) * (grad * grad)
    denom = xp.sqrt(v)
    denom /= bc2_sqrt
    denom += eps
    theta += (-(lr / bc1)) * (m / denom)


def _adamw_updates(updates) -> None:
    """The updates the C++ pool left (not float32, no kernels), spread over the engine's threads in
    ONE map_rows: the pieces laid end to end as one long row of numbers, each thread updating the
    pieces of its span. Elementwise, so the same bits on any split."""
    flat, spans, end = [], [], 0
    for arrays, hyper in updates:
        theta = arrays[0]
        if isinstance(theta, np.ndarray) and all(a.flags.c_contiguous for a in arrays):
            flat.append(([a.reshape(-1) for a in arrays], hyper))
            spans.append((end, end + theta.size))
            end += theta.size
        else:  # a layout whose flat view would be a copy: one whole update
            _adamw_update(*arrays, *hyper)
    if not flat:
        return
    starts = np.array([lo for lo, _ in spans])

    def run(lo, hi):
        i = int(np.searchsorted(starts, lo, side="right")) - 1
        while i < len(spans) and spans[i][0] < hi:
            a, b = spans[i]
            piece = slice(max(lo, a) - a, min(hi, b) - a)
            arrays, hyper = flat[i]
            _adamw_update(*(x[piece] for x in arrays), *hyper)
            i += 1

    map_rows(run, end, flat[0][0][0].itemsize)


# ----- the fp16 loss scale
@op("optimizer", cpu="kernels/grad_scaler.py: update_scale_reference", gpu="kernels/grad_scaler.cu: update_scale",
    reference="kernels/grad_scaler.py: update_scale_reference", test="test_grad_scaler.py")
def loss_scale_update(state, factors, growth_factor: float, backoff_factor: float, growth_interval: int,
                      dynamic: bool = True) -> None:
    """state [scale, growth tracker, skipped steps] (float32, on the device) updated in place by
    torch.amp.GradScaler's rule, from factors[2] (1.0: this step's gradients were not finite)."""
    if on_gpu(state):
        _scaler.update_scale(state, factors, growth_factor, backoff_factor, growth_interval, dynamic)
        return
    state[...] = _scaler.update_scale_reference(state, bool(factors[2]), growth_factor, backoff_factor,
                                                growth_interval, dynamic)
