"""bf16 and fp16 mixed precision (phase T12): float32 master weights, bfloat16/float16 compute copies.

bfloat16 is the top half of a float32: 1 sign bit, the same 8 exponent bits (same range,
~1e-38 .. 3.4e38), 7 mantissa bits (relative precision 2^-8 = 0.4%). Converting float32 ->
bf16 rounds to nearest, ties to even (`ml_dtypes.bfloat16`, torch's `.to(torch.bfloat16)`,
CUDA's `__float2bfloat16`: bit-identical on every non-NaN input; a NaN stays a NaN, whose bit
pattern differs between libraries).

What is emulated, exactly. NumPy has no fast bf16 matmul, so "bf16 compute" here means what
a GPU's tensor cores do, reproduced value for value with float32 arithmetic:
  * matmul operands are bf16 values (weights cast once per forward, activations stored as
    bf16); the product is computed in float32 (tensor cores accumulate in fp32) and the
    result rounded to bf16;
  * every activation an op keeps for its backward is stored as a real `ml_dtypes.bfloat16`
    array (2 bytes per value): that is where the memory is saved;
  * float32 is kept where precision matters: the residual stream (the embedding output and
    the residual adds), normalisation statistics (RMSNorm's mean of squares and 1/rms),
    attention scores and the softmax, the loss (log-sum-exp and the mean), every reduction
    inside a backward (weight gradients are float32 sums), and the optimizer: master weights,
    AdamW moments and the update are float32 (`optim.AdamW` on `model.parameters()`).
Gradients of bf16 activations are bf16 (the engine casts a gradient to its tensor's dtype,
as torch does); a weight's gradient arrives in bf16 at its bf16 copy and is cast to float32
into the master's `.grad`.
Not emulated: speed (the CPU path is slower than float32: every op converts) and fp32
accumulation order inside a GPU GEMM.

fp16 ("fp16", `forward_lowp(model, ids, "fp16")`): the same ops and policy with NumPy/CuPy
float16 storage (10 mantissa bits, range 6e-8 .. 65504): an activation above 65504 becomes
inf, a gradient below 2^-25 becomes 0, hence loss scaling (training/grad_scaler.py).

On a GPU (CuPy, or the tests' stand-in) the arrays are real bfloat16 (`ml_dtypes.bfloat16`, CuPy
14) or float16, and the ops are the float32 model's own (`forward_lowp` passes them): the fused
kernels of runtime/fused.py read and write the low-precision storage with float32 arithmetic
inside, and the products accumulate in float32, rounded once: every float16 or bfloat16 product,
attention's stacked ones too, is one cuBLAS GEMM on the tensor cores (runtime/gpu_blas.py). Two
roundings differ from the CPU's emulation, as they do under torch.autocast:
the attention scores come out of cuBLAS in bf16 (the softmax then runs in float32 in its kernel),
and a weight's gradient is a bf16 product widened to the float32 master. The activation memory is
saved as on the CPU. Weight copies are cast by kernels/bf16.cu (round to nearest even, bit-
identical to ml_dtypes) or CuPy's float16 cast.

    from xtrain_lessons.model import precision
    model.compute_dtype = "bf16"      # Model.__call__ / Model.loss now run forward_bf16
    loss = model.loss(x, y); loss.backward()   # grads land in the float32 masters
    opt.step(lr)                               # float32 update

Public API
----------
BF16                      the numpy dtype ml_dtypes.bfloat16
to_bf16(a) / to_f32(a)    array casts (round to nearest even / exact)
bf16_bits(a)              float32 array -> uint16 bit patterns (round to nearest even)
cast(t) -> Tensor         bf16 copy of a float32 Tensor; backward casts the gradient to f32
cast_params(params, names=None) -> dict   bf16 copies of the matmul weights (2-D, except
                          the embedding, which is a lookup and stays float32)
linear, rmsnorm, rope, causal_attention, swiglu, dropout, cross_entropy   the bf16 ops
forward_bf16(model, ids) -> logits Tensor (bf16)   the model's forward under this policy
forward_lowp(model, ids, dtype) / loss_lowp(...)   the same for dtype "bf16" or "fp16"
FP16, LOW_DTYPES, to_low(a, low)   the float16 dtype, {"bf16": BF16, "fp16": FP16}, the cast
loss_bf16(model, ids, targets, ignore_index=-100) -> float32 scalar Tensor
POLICY                    op -> (compute dtype, output dtype, what it keeps for backward)
"""

from __future__ import annotations

import math

import ml_dtypes as _ml
import numpy as np

from xtrain_lessons.autograd.tensor import Tensor, as_tensor, make_node
from xtrain_lessons.model.dropout import dropout_scale
from xtrain_lessons.model.flash_attention import gpu_attention
from xtrain_lessons.model.layers import _from_heads, _rotate_half_T, _to_heads, rotate_half
from xtrain_lessons.runtime.device import array_module, on_gpu
from xtrain_lessons.runtime.kernels.bf16 import bf16_to_f32, f32_to_bf16

__all__ = ["BF16", "to_bf16", "to_f32", "bf16_bits", "cast", "cast_params", "linear", "rmsnorm",
           "rope", "causal_attention", "swiglu", "dropout", "cross_entropy", "forward_bf16",
           "loss_bf16", "POLICY", "COMPUTE_DTYPES", "FP16", "LOW_DTYPES", "to_low", "forward_lowp",
           "loss_lowp"]

try:  # ml_dtypes ships with jax/torch-less installs too; it is a dependency of this phase

    BF16 = np.dtype(_ml.bfloat16)
except ImportError:  # pragma: no cover
    BF16 = None

FP16 = np.dtype(np.float16)
COMPUTE_DTYPES = ("float32", "bf16", "fp16")
LOW_DTYPES = {"bf16": BF16, "fp16": FP16}

#: op -> (arithmetic, output stored as, kept for backward)
POLICY = {
    "embedding": ("lookup", "float32", "- (the residual stream stays float32)"),
    "to_bf16 (weights)": ("round", "bf16", "the bf16 weight copy, once per forward"),
    "rmsnorm": ("float32 statistics", "bf16", "x̂ (bf16), 1/rms (float32)"),
    "linear": ("bf16 x bf16, float32 accumulate", "bf16", "input (bf16), weight copy (bf16)"),
    "rope": ("float32", "bf16", "-"),
    "attention": ("scores, softmax in float32", "bf16", "probabilities P (bf16)"),
    "swiglu": ("float32", "bf16", "- (sigmoid recomputed in backward)"),
    "residual add": ("float32", "float32", "-"),
    "cross_entropy": ("float32 log-sum-exp and mean", "float32 loss", "exp(z - max) (bf16), sums (float32)"),
    "backward reductions": ("float32", "float32 weight grads", "-"),
    "AdamW": ("float32", "float32 masters + moments", "-"),
}


def _need_numpy(a):
    if BF16 is None:
        raise ImportError("bf16 needs the ml_dtypes package (pip install ml_dtypes)")


def to_bf16(a) -> np.ndarray:
    """float array -> ml_dtypes.bfloat16 array, round to nearest even (no copy if already bf16)."""
    _need_numpy(a)
    if on_gpu(a):  # a real bfloat16 device array (CuPy 14), rounded by kernels/bf16.cu
        return a if a.dtype == BF16 else _round(a.astype(np.float32, copy=False), BF16)
    if not hasattr(a, "dtype"):  # lists, Python numbers
        a = np.asarray(a, dtype=np.float32)
    if a.dtype == BF16:
        return a
    with np.errstate(invalid="ignore", over="ignore"):
        return np.asarray(a, dtype=np.float32).astype(BF16)


def to_f32(a) -> np.ndarray:
    """Exact widening to float32 (no copy if already float32)."""
    if a.dtype == np.float32:
        return a
    if on_gpu(a) and a.dtype == BF16:  # the project's kernel: exact
        return bf16_to_f32(a)
    return a.astype(np.float32)


def bf16_bits(a) -> np.ndarray:
    """uint16 bit patterns of float32 `a` rounded to bf16 (round to nearest even)."""
    return to_bf16(np.asarray(a, dtype=np.float32)).view(np.uint16)


def _round(a, low=None):
    """Round a float32 result to the low-precision storage dtype (bf16 unless `low`).
    fp16 overflows above 65504 to inf: that is what a GPU does, and what loss scaling detects."""
    low = low or BF16
    if on_gpu(a) and low == BF16:  # through the project's kernel (kernels/bf16.cu): a bf16 array
        return f32_to_bf16(a).view(BF16)
    with np.errstate(over="ignore", invalid="ignore"):
        return a.astype(low)


def _grad_in(g, low):
    """The gradient arriving at a low-precision output: the engine has already cast it to the
    output's dtype (on either device)."""
    return g


def to_low(a, low=None):
    """`a` as `low` (bf16 unless given; no copy if it already is)."""
    if low is None or low == BF16:
        return to_bf16(a)
    return a if a.dtype == low else _round(a, low)


# ----------------------------------------------------------------------------------------
# weights


def cast(t: Tensor, low=None) -> Tensor:
    """A bf16 copy of a float32 Tensor as a graph node: the gradient flows back, cast to
    the master's dtype, into the master's `.grad`."""
    t = as_tensor(t)
    return make_node(to_low(t.data, low), (t,), lambda g: (to_f32(_grad_in(g, low)).astype(t.dtype, copy=False),),
                     "to_bf16" if low is None or low == BF16 else "to_fp16")


def cast_params(params: dict, names=None, low=None) -> dict:
    """name -> bf16 copy of every matmul weight (2-D, not the embedding table); other
    parameters (norm gains, the embedding) are returned as they are (float32)."""
    out = {}
    for name, p in params.items():
        matmul_weight = p.ndim == 2 and "embed_tokens" not in name
        if names is not None:
            matmul_weight = name in names
        out[name] = cast(p, low) if matmul_weight else p
    return out


# ----------------------------------------------------------------------------------------
# ops: float32 arithmetic on bf16 values, bf16 outputs and saved activations


def linear(x: Tensor, w: Tensor, out_dtype=None, low=None) -> Tensor:
    """y = x @ w.T with bf16 operands, float32 accumulation, output rounded to bf16."""
    n_in = x.shape[-1]
    if w.shape[1] != n_in:
        raise ValueError(f"linear: input has {n_in} features but weight is {w.shape} (out, in)")
    _need_numpy(x.data)
    x16 = to_low(x.data, low).reshape(-1, n_in)  # stored (a view of x.data if already low)
    w16 = to_low(w.data, low)
    y = to_f32(x16) @ to_f32(w16).T
    y = (y if out_dtype == np.float32 else _round(y, low)).reshape(*x.shape[:-1], w.shape[0])

    def backward(g):
        g = g if out_dtype == np.float32 else _grad_in(g, low)
        g2 = to_f32(g).reshape(-1, w.shape[0])
        gx = (g2 @ to_f32(w16)).reshape(x.shape) if x.requires_grad else None
        gw = g2.T @ to_f32(x16) if w.requires_grad else None  # float32 sum over N rows
        return gx, gw

    return make_node(y, (x, w), backward, "linear_bf16")


def rmsnorm(x: Tensor, weight: Tensor, eps: float = 1e-6, low=None) -> Tensor:
    """RMSNorm with float32 statistics; output and saved x̂ in bf16, 1/rms in float32."""
    xf = to_f32(x.data)
    D = x.shape[-1]
    r = (np.float32(1.0) / np.sqrt((xf * xf).mean(axis=-1, keepdims=True) + np.float32(eps)))
    xhat = xf * r
    out = _round(xhat * weight.data, low)
    xhat16 = _round(xhat, low)

    def backward(g):
        g = _grad_in(g, low)
        gf, xh = to_f32(g), to_f32(xhat16)
        gw = (gf * xh).reshape(-1, D).sum(axis=0) if weight.requires_grad else None
        gx = None
        if x.requires_grad:
            gh = gf * weight.data
            gx = gh - xh * (gh * xh).mean(axis=-1, keepdims=True)
            gx *= r
        return gx, gw

    return make_node(out, (x, as_tensor(weight)), backward, "rmsnorm_bf16")


def rope(x: Tensor, cos, sin, low=None) -> Tensor:
    """Rotary embedding in float32 on bf16 input; output bf16."""
    B, T, H, D = x.shape
    c, s = cos[None, :, None, :], sin[None, :, None, :]
    xf = to_f32(x.data)
    out = _round(xf * c + rotate_half(xf) * s, low)

    def backward(g):
        g = _grad_in(g, low)
        gf = to_f32(g)
        return (gf * c + _rotate_half_T(gf * s),)

    return make_node(out, (x,), backward, "rope_bf16")


def causal_attention(q: Tensor, k: Tensor, v: Tensor, low=None) -> Tensor:
    """Causal grouped-query attention: S = Q K^T (bf16 operands, float32 accumulate), the
    softmax in float32, P rounded to bf16 (stored, and the operand of P V), output bf16."""
    B, T, H, D = q.shape
    Hkv = k.shape[2]
    scale = np.float32(1.0 / math.sqrt(D))
    qh = _to_heads(to_f32(q.data), Hkv)
    kh = to_f32(k.data).transpose(0, 2, 1, 3)
    vh = to_f32(v.data).transpose(0, 2, 1, 3)
    s = (qh @ kh.swapaxes(-1, -2)) * scale
    s = s.reshape(B, Hkv, H // Hkv, T, T)
    xp = array_module(s)
    s += xp.where(xp.triu(xp.ones((T, T), bool), 1), -np.inf, 0.0).astype(np.float32)
    s -= s.max(axis=-1, keepdims=True)
    np.exp(s, out=s)
    s /= s.sum(axis=-1, keepdims=True)
    p16 = _round(s.reshape(B, Hkv, -1, T), low)  # (B, Hkv, G*T, T), kept for backward
    out = _round(_from_heads(to_f32(p16) @ vh, B, T, H, D), low)

    def backward(g):
        g = _grad_in(g, low)
        p = to_f32(p16)
        qh = _to_heads(to_f32(q.data), Hkv)
        kh = to_f32(k.data).transpose(0, 2, 1, 3)
        vh = to_f32(v.data).transpose(0, 2, 1, 3)
        gh = _to_heads(to_f32(g), Hkv)
        dv = p.swapaxes(-1, -2) @ gh
        ds = gh @ vh.swapaxes(-1, -2)
        ds -= (ds * p).sum(axis=-1, keepdims=True)
        ds *= p
        ds *= scale
        dq = _from_heads(ds @ kh, B, T, H, D)
        dk = ds.swapaxes(-1, -2) @ qh
        return (dq, xp.ascontiguousarray(dk.transpose(0, 2, 1, 3)),
                xp.ascontiguousarray(dv.transpose(0, 2, 1, 3)))

    return make_node(out, (q, k, v), backward, "attention_bf16")


def _sigmoid_f32(gf):
    return np.float32(0.5) * (np.tanh(gf * np.float32(0.5)) + np.float32(1.0))


def swiglu(gate: Tensor, up: Tensor, low=None) -> Tensor:
    """silu(gate) * up in float32, output bf16. Like the float32 op it keeps nothing but
    its inputs: the backward recomputes sigmoid and silu from `gate` and rounds them to bf16,
    the same values a stored bf16 copy would hold."""
    gf, uf = to_f32(gate.data), to_f32(up.data)
    out = _round(gf * _sigmoid_f32(gf) * uf, low)

    def backward(g):
        g = _grad_in(g, low)
        af = to_f32(gate.data)
        sig = _sigmoid_f32(af)
        sg, silu = to_f32(_round(sig, low)), to_f32(_round(af * sig, low))
        gf_, one = to_f32(g), np.float32(1.0)
        dgate = gf_ * to_f32(up.data) * sg * (one + af * (one - sg))
        return dgate, gf_ * silu

    return make_node(out, (gate, up), backward, "swiglu_bf16")


def dropout(x: Tensor, p: float, seed: int, offset: int, low=None) -> Tensor:
    """Inverted dropout with the float32 scale 1/(1-p) (a bf16 scale would bias it), the same
    Philox mask as the float32 model; output bf16."""

    scale = dropout_scale(x.shape, p, seed, offset, np.float32, array_module(x.data))
    out = _round(to_f32(x.data) * scale, low)
    return make_node(out, (x,), lambda g: (to_f32(_grad_in(g, low)) * scale,), "dropout_bf16")


def cross_entropy(logits: Tensor, targets, ignore_index: int = -100, low=None) -> Tensor:
    """Mean cross-entropy, computed in float32 from bf16 logits; returns a float32 scalar.
    exp(z - max) is kept in bf16 (as the float32 op keeps it in float32), the row sums in
    float32."""
    targets = targets.data if isinstance(targets, Tensor) else targets
    V = logits.shape[-1]
    xp = array_module(logits.data)
    host_t = targets if isinstance(targets, np.ndarray) else None  # checked there: no device sync
    t = xp.asarray(targets).reshape(-1)
    valid = t != ignore_index
    t_safe = xp.where(valid, t, 0)
    check = np.where(host_t != ignore_index, host_t, 0) if host_t is not None else t_safe
    if t.size and (int(check.min()) < 0 or int(check.max()) >= V):
        raise ValueError(f"cross_entropy: targets must lie in [0, {V}) or equal ignore_index")
    x = to_f32(logits.data).reshape(-1, V)
    rows = xp.arange(x.shape[0])
    n_valid = valid.sum().astype(np.float32)
    m = x.max(axis=1, keepdims=True)
    e = xp.exp(x - m)
    s = e.sum(axis=1, keepdims=True)  # float32 sums
    losses = (xp.log(s) + m)[:, 0] - x[rows, t_safe]
    with np.errstate(invalid="ignore", divide="ignore"):
        loss = ((losses * valid).sum() / n_valid).astype(np.float32)
    e16 = _round(e, low)
    del e, x

    def backward(g):
        with np.errstate(invalid="ignore", divide="ignore"):
            scale = valid.astype(np.float32) * (xp.asarray(g, dtype=np.float32) / n_valid)
        gx = to_f32(e16) * (scale / s[:, 0])[:, None]
        gx[rows, t_safe] -= scale
        return (gx.reshape(logits.shape),)

    return make_node(loss, (logits,), backward, "cross_entropy_bf16")


# ----------------------------------------------------------------------------------------
# the model's forward under the bf16 policy


def forward_lowp(model, ids, dtype: str = "bf16") -> Tensor:
    """Logits (B, T, V), in `dtype` ("bf16" or "fp16"), of `model` (a model.Model) with
    low-precision compute (module doc).

    The model's own forward (`Model._forward`: QK-norm, GQA, T13 recompute, T18 dropout at
    the same Philox sites), run with this module's layer functions and low-precision copies
    of the weights, cast once per call. The residual stream stays float32.
    """
    _check_attention(model, dtype)
    if dtype == "bf16":
        _need_numpy(model.params["lm_head.weight"].data)
    low = LOW_DTYPES[dtype]
    return model._forward(ids, layers=_layers_for(model, low), params=cast_params(model.params, low=low))


def _on_gpu(model) -> bool:
    return on_gpu(model.params["lm_head.weight"].data)


def _check_attention(model, dtype: str) -> None:
    """The flash path exists in bf16 on a GPU only (the tensor-core kernels, issue 39)."""
    if model.config.attention != "composed" and not (dtype == "bf16" and _on_gpu(model)):
        raise ValueError(f"{dtype} compute supports attention='composed' only (the flash path runs in float32, "
                         "and in bf16 on a GPU)")


def _layers_for(model, low):
    """The layer functions of the low-precision forward: on the CPU this module's emulation; on
    a GPU the float32 model's own ops, which run on low-precision arrays (module doc), with the
    norms writing `low` from the float32 residual stream."""
    from functools import partial  # noqa: PLC0415
    from types import SimpleNamespace  # noqa: PLC0415

    from xtrain_lessons.autograd import ops  # noqa: PLC0415
    from xtrain_lessons.model import layers  # noqa: PLC0415

    if _on_gpu(model):  # bf16 attention: flash-attention on the tensor cores (issue 39)
        return SimpleNamespace(rmsnorm=partial(ops.rmsnorm, out_dtype=low), linear=layers.linear, rope=layers.rope,
                               attention=gpu_attention if low == BF16 else layers.causal_attention,
                               swiglu=layers.swiglu, dropout=partial(dropout, low=low))
    return SimpleNamespace(**{f.__name__: partial(f, low=low) for f in (rmsnorm, linear, rope, swiglu, dropout)},
                           attention=partial(causal_attention, low=low))


def forward_bf16(model, ids) -> Tensor:
    """Logits (B, T, V), bf16, of `model` under the bf16 policy (`forward_lowp`)."""
    return forward_lowp(model, ids, "bf16")


def loss_lowp(model, ids, targets, ignore_index: int = -100, dtype: str = "bf16") -> Tensor:
    """Mean next-token cross-entropy (float32 scalar) of the low-precision forward. On a GPU the
    lm_head and the loss are the fused classifier (layers.linear_cross_entropy) on the
    low-precision final hidden state and weight copy: the (N, V) logits are never kept twice."""
    low = LOW_DTYPES[dtype]
    if not _on_gpu(model):
        return cross_entropy(forward_lowp(model, ids, dtype), targets, ignore_index=ignore_index, low=low)
    from xtrain_lessons.model.layers import linear_cross_entropy  # noqa: PLC0415

    _check_attention(model, dtype)
    params = cast_params(model.params, low=low)
    h = model._forward(ids, layers=_layers_for(model, low), params=params, head=False)
    return linear_cross_entropy(h, params["lm_head.weight"], targets, ignore_index)


def loss_bf16(model, ids, targets, ignore_index: int = -100) -> Tensor:
    """Mean next-token cross-entropy (float32 scalar) of the bf16 forward."""
    return loss_lowp(model, ids, targets, ignore_index, "bf16")
