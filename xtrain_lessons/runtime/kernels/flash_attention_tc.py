"""Flash-attention on the tensor cores: the launchers for kernels/flash_attention_tc.cu and their
NumPy references (T14's algorithm as the GPU's attention in bf16; issue 39).

    o, lse = flash_attention_tc_fwd(q, k, v)                      # bf16 in, o bf16, lse float32
    dq, dk, dv = flash_attention_tc_bwd(q, k, v, o, lse, dout)    # bf16

Layout (the model's, `layers.causal_attention`'s): q, o, dout, dq (B, Tq, H, D); k, v, dk, dv
(B, Tk, Hkv, D) with Hkv dividing H (grouped-query attention: query head h reads kv head
h // (H / Hkv)) and Tk >= Tq (the queries are the last Tq positions); lse (B, H, Tq) float32.
`scale` multiplies q k^T (default 1 / sqrt(D)); causal=False attends to every key. Head dims up
to 128; the kernels are compiled for D rounded up to 16, 32, 48, 64, 96 or 128 (`head_bucket`).

bf16 (`ml_dtypes.bfloat16`) CuPy arrays run on the GPU (sm_80 or newer: the kernels use
mma.sync's bf16 tensor-core instruction), NumPy arrays on the CPU emulator (slow: a few
hundred rows). Nothing of size T x T is allocated: besides the outputs, the forward writes lse
(B*H*Tq floats) and the backward dsum = rowsum(dO * O) (the same size).

The references compute plain attention with the whole score matrix in float64 from the bf16
values: independent of the tiles, the online softmax and the roundings they check.
"""

from __future__ import annotations

import math
import sys
import threading

import ml_dtypes
import numpy as np

from xtrain_lessons.runtime.cuda import KERNELS_DIR, Module
from xtrain_lessons.runtime.cuda.emulator import sanitize_default
from xtrain_lessons.runtime.device import array_module, kernel_backend

__all__ = ["flash_attention_tc_fwd", "flash_attention_tc_bwd", "flash_attention_tc_reference",
           "flash_attention_tc_bwd_reference", "head_bucket", "BUCKETS", "NAME_EXPRESSIONS", "MAX_D", "BF16"]

BF16 = np.dtype(ml_dtypes.bfloat16)
MAX_D = 128
THREADS = 128      # 4 warps: the forward and dq kernels' blocks (64 query rows)
BLOCK_Q = 64       # query rows per block of the forward and dq kernels
_FILE = "flash_attention_tc.cu"
_TEMPLATES = ("flash_tc_fwd", "flash_tc_bwd_dq", "flash_tc_bwd_dkdv")
BUCKETS = (16, 32, 48, 64, 96, 128)  # the head dims the .cu file instantiates (multiples of 16)
NAME_EXPRESSIONS = tuple(f"{k}<{dp}>" for dp in BUCKETS for k in _TEMPLATES)


def head_bucket(D: int) -> int:
    """The head dim the kernels are compiled for: the smallest bucket >= D (a multiple of 16, the
    k of one tensor-core step; the columns past D are zeros)."""
    return next(dp for dp in BUCKETS if dp >= int(D))


def _dkdv_keys(DP: int) -> int:
    """Keys per block of flash_tc_bwd_dkdv (16 per warp): BK in the .cu file."""
    return 32 if DP > 64 else 64


_modules: dict = {}
_lock = threading.Lock()


def _kernel(name: str, DP: int, like):
    """Kernel `name` of the module compiled for head-dim bucket DP, where `like` lives (one
    compile per bucket and backend: the emulator instantiates only the bucket asked for)."""
    backend = kernel_backend(like)
    key = (DP, backend, sanitize_default(), sys.modules.get("cupy") if backend == "gpu" else None)
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            mod = _modules[key] = (Module(KERNELS_DIR / _FILE, name_expressions=[f"{k}<{DP}>" for k in _TEMPLATES],
                                          backend=backend), {})
        fns = mod[1]
        if name not in fns:
            fns[name] = mod[0].get_function(name if name == "flash_tc_bwd_prep" else f"{name}<{DP}>")
        return fns[name]


def _address(a) -> int:
    return a.ctypes.data if isinstance(a, np.ndarray) else a.data.ptr


def _check(fn: str, q, k, v, scale):
    """(xp, B, Tq, Tk, H, Hkv, D, scale as float32); raises TypeError/ValueError naming the problem."""
    for name, a in (("q", q), ("k", k), ("v", v)):
        if not hasattr(a, "dtype") or a.ndim != 4:
            raise ValueError(f"{fn}: {name} must be a 4-d array (B, T, heads, D), got {getattr(a, 'shape', a)!r}")
        if a.dtype != BF16:
            raise TypeError(f"{fn}: {name} must be a bfloat16 array (ml_dtypes.bfloat16), got {a.dtype}")
    xp = array_module(q)
    if array_module(k) is not xp or array_module(v) is not xp:
        raise TypeError(f"{fn}: q, k and v must all be NumPy (emulator) or all CuPy (GPU) arrays")
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D:
        raise ValueError(f"{fn}: q {q.shape}, k {k.shape}, v {v.shape} do not fit (need k, v (B, Tk, Hkv, D))")
    if Hkv < 1 or H % Hkv:
        raise ValueError(f"{fn}: {H} query heads are not a multiple of {Hkv} kv heads")
    if Tq < 1 or Tk < Tq:
        raise ValueError(f"{fn}: need 1 <= Tq <= Tk, got Tq={Tq}, Tk={Tk}")
    if not 1 <= D <= MAX_D:
        raise ValueError(f"{fn}: head dim {D} is not in 1..{MAX_D}")
    if B * H > 65535:
        raise ValueError(f"{fn}: B * H = {B * H} blocks in the grid's y dimension (at most 65535)")
    scale = np.float32(1.0 / math.sqrt(D) if scale is None else scale)
    return xp, B, Tq, Tk, H, Hkv, D, scale


def _vec(D: int, *arrays) -> np.int32:
    """1 when the kernels may copy tiles 16 bytes at a time: D % 8 == 0 and aligned arrays."""
    return np.int32(D % 8 == 0 and all(_address(a) % 16 == 0 for a in arrays))


def flash_attention_tc_fwd(q, k, v, scale: float | None = None, causal: bool = True):
    """(o (B, Tq, H, D) bf16, lse (B, H, Tq) float32) of softmax(scale q k^T) v, by the kernel
    flash_tc_fwd: one block of 4 warps per (64 query rows, batch * head)."""
    xp, B, Tq, Tk, H, Hkv, D, scale = _check("flash_attention_tc_fwd", q, k, v, scale)
    q, k, v = (xp.ascontiguousarray(a) for a in (q, k, v))
    DP, i32 = head_bucket(D), np.int32
    o = xp.empty(q.shape, BF16)
    lse = xp.empty((B, H, Tq), np.float32)
    _kernel("flash_tc_fwd", DP, q)((-(-Tq // BLOCK_Q), B * H), (THREADS,),
                                   (q, k, v, o, lse, i32(B), i32(Tq), i32(Tk), i32(H), i32(Hkv), i32(D), scale,
                                    i32(bool(causal)), _vec(D, q, k, v)))
    return o, lse


def flash_attention_tc_bwd(q, k, v, o, lse, dout, scale: float | None = None, causal: bool = True):
    """(dq, dk, dv), bf16, from the inputs, the forward's o and lse, and dout (bf16, o's shape):
    dsum = rowsum(dout * o) (flash_tc_bwd_prep), then flash_tc_bwd_dq (a block per 64 query rows)
    and flash_tc_bwd_dkdv (a block per 32 or 64 keys of a kv head, every query head of its group)."""
    fn = "flash_attention_tc_bwd"
    xp, B, Tq, Tk, H, Hkv, D, scale = _check(fn, q, k, v, scale)
    for name, a, dtype, shape in (("o", o, BF16, q.shape), ("dout", dout, BF16, q.shape),
                                  ("lse", lse, np.dtype(np.float32), (B, H, Tq))):
        if array_module(a) is not xp or a.dtype != dtype or tuple(a.shape) != tuple(shape):
            raise TypeError(f"{fn}: {name} must be a {dtype} array of shape {tuple(shape)} beside q, "
                            f"got {a.dtype} {tuple(a.shape)}")
    q, k, v, o, lse, dout = (xp.ascontiguousarray(a) for a in (q, k, v, o, lse, dout))
    DP, i32 = head_bucket(D), np.int32
    dsum = xp.empty((B, H, Tq), np.float32)
    rows = B * H * Tq
    _kernel("flash_tc_bwd_prep", DP, q)((-(-rows // (THREADS // 32)),), (THREADS,),
                                        (o, dout, dsum, i32(B), i32(Tq), i32(H), i32(D)))
    dq, dk, dv = xp.empty(q.shape, BF16), xp.empty(k.shape, BF16), xp.empty(v.shape, BF16)
    tail = (i32(B), i32(Tq), i32(Tk), i32(H), i32(Hkv), i32(D), scale, i32(bool(causal)), _vec(D, q, k, v, dout))
    _kernel("flash_tc_bwd_dq", DP, q)((-(-Tq // BLOCK_Q), B * H), (THREADS,), (q, k, v, lse, dsum, dout, dq, *tail))
    keys = _dkdv_keys(DP)
    _kernel("flash_tc_bwd_dkdv", DP, q)((-(-Tk // keys), B * Hkv), (2 * keys,),
                                        (q, k, v, lse, dsum, dout, dk, dv, *tail))
    return dq, dk, dv


# ----------------------------------------------------------------------------------- references
def _f64(a):
    xp = array_module(a)
    return (a.get() if xp is not np else np.asarray(a)).astype(np.float64)


def _probabilities(q, k, scale, causal):
    """P (B, H, Tq, Tk) and lse (B, H, Tq) in float64, kv heads repeated per query head."""
    q, k = _f64(q), _f64(k)
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(D) if scale is None else float(scale)
    s = np.einsum("bihd,bjhd->bhij", q, np.repeat(k, H // Hkv, axis=2)) * scale
    if causal:  # query i sees keys j <= i + Tk - Tq
        s = np.where(np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + Tk - Tq, s, -np.inf)
    m = s.max(axis=-1, keepdims=True)
    lse = np.log(np.exp(s - m).sum(axis=-1)) + m[..., 0]
    return np.exp(s - lse[..., None]), lse, scale


def flash_attention_tc_reference(q, k, v, scale: float | None = None, causal: bool = True):
    """NumPy reference of the forward: (o (B, Tq, H, D), lse (B, H, Tq)), float64, from the
    inputs' values (NumPy or CuPy arrays of any float dtype)."""
    p, lse, _ = _probabilities(q, k, scale, causal)
    G = q.shape[2] // k.shape[2]
    return np.einsum("bhij,bjhd->bihd", p, np.repeat(_f64(v), G, axis=2)), lse


def flash_attention_tc_bwd_reference(q, k, v, dout, scale: float | None = None, causal: bool = True):
    """NumPy reference of the backward: (dq, dk, dv) in float64; dk, dv sum over the query
    heads of each kv group."""
    p, _, scale = _probabilities(q, k, scale, causal)
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    G = H // Hkv
    qq, kk, vv, do = _f64(q), np.repeat(_f64(k), G, axis=2), np.repeat(_f64(v), G, axis=2), _f64(dout)
    dv = np.einsum("bhij,bihd->bjhd", p, do)
    dp = np.einsum("bihd,bjhd->bhij", do, vv)
    ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale
    dq = np.einsum("bhij,bjhd->bihd", ds, kk)
    dk = np.einsum("bhij,bihd->bjhd", ds, qq)
    group = (B, Tk, Hkv, G, D)
    return dq, dk.reshape(group).sum(axis=3), dv.reshape(group).sum(axis=3)
