"""bf16 and fp16 mixed precision (phases T12 and T12b): float32 master weights, bfloat16/float16 compute copies.

bfloat16 is the top half of a float32: 1 sign bit, the same 8 exponent bits (same range,
~1e-38 .. 3.4e38), 7 mantissa bits (relative precision 2^-8 = 0.4%). Converting float32 ->
bf16 rounds to nearest, ties to even (`ml_dtypes.bfloat16`, torch's `.to(torch.bfloat16)`,
CUDA's `__float2bfloat16`: bit-identical on every non-NaN input; a NaN stays a NaN, whose bit
pattern differs between libraries).

What is computed, exactly: what a GPU's tensor cores and kernels do, value for value.
  * matmul operands are bf16 values (weights cast once per forward, activations stored as
    bf16); the product is computed in float32 (tensor cores accumulate in fp32) and the
    result rounded to bf16;
  * every activation an op keeps for its backward is stored as a real `ml_dtypes.bfloat16`
    array (2 bytes per value): that is where the memory is saved;
  * float32 is kept where precision matters: the residual stream (the embedding output and
    the residual adds), normalisation statistics (RMSNorm's mean of squares and 1/rms),
    the softmax, the loss (log-sum-exp and the mean), every reduction inside a backward
    (weight gradients are float32 sums), and the optimizer: master weights, AdamW moments and
    the update are float32 (`optim.AdamW` on `model.parameters()`).
Gradients of bf16 activations are bf16 (the engine casts a gradient to its tensor's dtype,
as torch does); a weight's gradient arrives in bf16 at its bf16 copy and is cast to float32
into the master's `.grad`.

fp16 ("fp16", `forward_lowp(model, ids, "fp16")`): the same ops and policy with float16 storage
(10 mantissa bits, range 6e-8 .. 65504): an activation above 65504 becomes inf, a gradient below
2^-25 becomes 0, hence loss scaling (training/optim/grad_scaler.py).

The layers are the float32 model's own (layers.py, ops.rmsnorm with `out_dtype`), run on
low-precision arrays: the op set (runtime/opset) reads and writes the storage dtype with float32
arithmetic inside — a GPU's CUDA kernels and cuBLAS on the tensor cores, the CPU's NumPy
references of the same kernels (runtime/opset/lowp.py; not the speed: every op converts). Two
roundings differ between them, as they do under torch.autocast: the attention scores come out of
cuBLAS in bf16 (the softmax then runs in float32 in its kernel) where the CPU keeps them float32.
Weight copies are cast by kernels/bf16.cu on a GPU (round to nearest even, bit-identical to
ml_dtypes).

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

from functools import partial
from types import SimpleNamespace

import ml_dtypes as _ml
import numpy as np

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor, as_tensor, make_node
from xtrain_lessons.model import layers
from xtrain_lessons.model.dropout import dropout_scale
from xtrain_lessons.model.flash_attention import gpu_attention
from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.device import array_module

__all__ = ["BF16", "to_bf16", "to_f32", "bf16_bits", "cast", "cast_params", "linear", "rmsnorm",
           "rope", "causal_attention", "swiglu", "dropout", "cross_entropy", "forward_bf16",
           "loss_bf16", "POLICY", "COMPUTE_DTYPES", "FP16", "LOW_DTYPES", "to_low", "forward_lowp",
           "loss_lowp"]

BF16 = np.dtype(_ml.bfloat16)
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


def to_bf16(a) -> np.ndarray:
    """float array -> bfloat16 array, round to nearest even (no copy if already bf16)."""
    if not hasattr(a, "dtype"):  # lists, Python numbers
        a = np.asarray(a, dtype=np.float32)
    return opset.cast(a, BF16)


def to_f32(a) -> np.ndarray:
    """Exact widening to float32 (no copy if already float32)."""
    return opset.cast(a, np.float32)


def bf16_bits(a) -> np.ndarray:
    """uint16 bit patterns of float32 `a` rounded to bf16 (round to nearest even)."""
    return to_bf16(np.asarray(a, dtype=np.float32)).view(np.uint16)


def to_low(a, low=None):
    """`a` as `low` (bf16 unless given; no copy if it already is). fp16 overflows above 65504 to
    inf: that is what a GPU does, and what loss scaling detects."""
    return to_bf16(a) if low is None or low == BF16 else opset.cast(a, low)


# ----------------------------------------------------------------------------------------
# weights


def cast(t: Tensor, low=None) -> Tensor:
    """A bf16 copy of a float32 Tensor as a graph node: the gradient flows back, cast to
    the master's dtype, into the master's `.grad`."""
    t = as_tensor(t)
    return make_node(to_low(t.data, low), (t,), lambda g: (to_f32(g).astype(t.dtype, copy=False),),
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
# ops: float32 arithmetic on low-precision values, low-precision outputs and saved activations


def _low(t: Tensor, low) -> Tensor:
    """`t` in the storage dtype (a cast node when it is not already)."""
    low = low or BF16
    return t if t.dtype == low else cast(t, low)


def linear(x: Tensor, w: Tensor, low=None) -> Tensor:
    """y = x @ w.T with bf16 operands, float32 accumulation, output rounded to bf16."""
    return layers.linear(_low(x, low), _low(w, low))


def rmsnorm(x: Tensor, weight: Tensor, eps: float = 1e-6, low=None) -> Tensor:
    """RMSNorm with float32 statistics; output and saved x̂ in bf16, 1/rms in float32."""
    return ops.rmsnorm(x, weight, eps, out_dtype=low or BF16)


def rope(x: Tensor, cos, sin, low=None) -> Tensor:
    """Rotary embedding in float32 on bf16 input; output bf16."""
    return layers.rope(_low(x, low), cos, sin)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, low=None) -> Tensor:
    """Causal grouped-query attention: S = Q K^T (bf16 operands, float32 accumulate), the
    softmax in float32, P rounded to bf16 (stored, and the operand of P V), output bf16."""
    return layers.causal_attention(_low(q, low), _low(k, low), _low(v, low))


def swiglu(gate: Tensor, up: Tensor, low=None) -> Tensor:
    """silu(gate) * up in float32, output bf16. Like the float32 op it keeps nothing but
    its inputs: the backward recomputes sigmoid and silu from `gate`, rounded to bf16 as a
    stored copy would hold them."""
    return layers.swiglu(_low(gate, low), _low(up, low))


def dropout(x: Tensor, p: float, seed: int, offset: int, low=None) -> Tensor:
    """Inverted dropout with the float32 scale 1/(1-p) (a bf16 scale would bias it), the same
    Philox mask as the float32 model; output bf16."""
    scale = dropout_scale(x.shape, p, seed, offset, np.float32, array_module(x.data))
    out = to_low(to_f32(x.data) * scale, low)
    return make_node(out, (x,), lambda g: (to_f32(g) * scale,), "dropout_bf16")


def cross_entropy(logits: Tensor, targets, ignore_index: int = -100, low=None) -> Tensor:
    """Mean cross-entropy, computed in float32 from bf16 logits; returns a float32 scalar.
    exp(z - max) is kept in bf16 (as the float32 op keeps it in float32), the row sums in
    float32."""
    return ops.cross_entropy(_low(as_tensor(logits), low), targets, ignore_index)


# ----------------------------------------------------------------------------------------
# the model's forward under the bf16 policy


def _layers_for(low):
    """The layer functions of the low-precision forward: the float32 model's own, on
    low-precision arrays, with the norms writing `low` from the float32 residual stream; bf16's
    attention is flash-attention on the tensor cores where their kernels take the arrays (a GPU;
    issue 39), composed attention elsewhere."""
    return SimpleNamespace(rmsnorm=partial(ops.rmsnorm, out_dtype=low), linear=layers.linear, rope=layers.rope,
                           attention=gpu_attention if low == BF16 else layers.causal_attention,
                           swiglu=layers.swiglu, dropout=partial(dropout, low=low))


def _check_attention(model, dtype: str) -> None:
    """The flash path runs in float32, and in bf16 where the tensor-core kernels exist (a GPU, issue 39)."""
    w = model.params["lm_head.weight"].data
    if model.config.attention != "composed" and not (
            dtype == "bf16" and opset.flash_kernels_for(BF16, model.config.head_dim, like=w) is not None):
        raise ValueError(f"{dtype} compute supports attention='composed' only (the flash path runs in float32, "
                         "and in bf16 on a GPU)")


def forward_lowp(model, ids, dtype: str = "bf16") -> Tensor:
    """Logits (B, T, V), in `dtype` ("bf16" or "fp16"), of `model` (a model.Model) with
    low-precision compute (module doc).

    The model's own forward (`Model._forward`: QK-norm, GQA, T13 recompute, T18 dropout at
    the same Philox sites), run on low-precision copies of the weights, cast once per call.
    The residual stream stays float32.
    """
    _check_attention(model, dtype)
    low = LOW_DTYPES[dtype]
    return model._forward(ids, layers=_layers_for(low), params=cast_params(model.params, low=low))


def forward_bf16(model, ids) -> Tensor:
    """Logits (B, T, V), bf16, of `model` under the bf16 policy (`forward_lowp`)."""
    return forward_lowp(model, ids, "bf16")


def loss_lowp(model, ids, targets, ignore_index: int = -100, dtype: str = "bf16") -> Tensor:
    """Mean next-token cross-entropy (float32 scalar) of the low-precision forward: the lm_head and
    the loss are the fused classifier (layers.linear_cross_entropy) on the low-precision final
    hidden state and weight copy, so the (N, V) logits are never kept twice."""
    _check_attention(model, dtype)
    low = LOW_DTYPES[dtype]
    params = cast_params(model.params, low=low)
    h = model._forward(ids, layers=_layers_for(low), params=params, head=False)
    return layers.linear_cross_entropy(h, params["lm_head.weight"], targets, ignore_index)


def loss_bf16(model, ids, targets, ignore_index: int = -100) -> Tensor:
    """Mean next-token cross-entropy (float32 scalar) of the bf16 forward."""
    return loss_lowp(model, ids, targets, ignore_index, "bf16")
