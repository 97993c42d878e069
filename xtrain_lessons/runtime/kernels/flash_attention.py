"""Flash-attention: the launchers for kernels/flash_attention.cu and their NumPy references.

    out, lse = flash_attention_fwd_cuda(q, k, v)                  # float32, causal
    dq, dk, dv = flash_attention_bwd_cuda(q, k, v, out, lse, dout)

NumPy arrays run on the CPU emulator (slow: keep sizes small, e.g. T = 37, D = 16), CuPy
arrays on the GPU. The references are plain attention with the whole score matrix in NumPy
(float64, returned as float32): independent of the tiled algorithm they check.
Layout: q, out (B, Tq, H, D); k, v (B, Tk, Hkv, D); lse (B, H, Tq).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.cuda import load_kernel
from xtrain_lessons.runtime.device import array_module, kernel_backend

MAX_D = 128      # FA_MAX_D in the .cu file
MAX_BLOCK = 64   # FA_MAX_BLOCK
MAX_SHARED = 48 * 1024  # bytes of dynamic shared memory a block gets by default
BLOCK_Q = 32
BLOCK_K = 32


def _prep(xp, *arrays):
    return [xp.ascontiguousarray(a, dtype=xp.float32) for a in arrays]


def _dims(q, k, v, block_q, block_k):
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    if k.shape != v.shape or k.shape[0] != B or k.shape[3] != D or H % Hkv or Tk < Tq:
        raise ValueError(f"flash_attention: q {q.shape}, k {k.shape}, v {v.shape} do not fit")
    if D > MAX_D:
        raise ValueError(f"flash_attention kernel: head dim {D} > {MAX_D}")
    if not (1 <= block_q <= MAX_BLOCK and 1 <= block_k <= MAX_BLOCK):
        raise ValueError(f"flash_attention kernel: block sizes must be in 1..{MAX_BLOCK}")
    shared = max(2 * block_k * D, 2 * block_q * D + 2 * block_q) * 4
    if shared > MAX_SHARED:  # a GPU refuses more dynamic shared memory without an opt-in
        raise ValueError(f"flash_attention kernel: tiles need {shared} bytes of shared memory "
                         f"(> {MAX_SHARED}); use smaller block_q / block_k")
    return B, Tq, Tk, H, Hkv, D


def _backend(xp):
    return kernel_backend(xp)


def flash_attention_fwd_cuda(q, k, v, causal: bool = True, block_q: int = BLOCK_Q,
                             block_k: int = BLOCK_K):
    """(out, lse) computed by the kernel `flash_attention_fwd`: one block of block_q threads
    per (batch * head, query tile)."""
    xp = array_module(q)
    q, k, v = _prep(xp, q, k, v)
    B, Tq, Tk, H, Hkv, D = _dims(q, k, v, block_q, block_k)
    out = xp.zeros_like(q)
    lse = xp.zeros((B, H, Tq), dtype=xp.float32)
    i32 = np.int32
    kernel = load_kernel("flash_attention.cu", "flash_attention_fwd", backend=_backend(xp))
    kernel((B * H, (Tq + block_q - 1) // block_q), (block_q,),
           (q, k, v, out, lse, i32(B), i32(Tq), i32(Tk), i32(H), i32(Hkv), i32(D),
            i32(block_q), i32(block_k), i32(bool(causal))),
           shared_mem=2 * block_k * D * 4)
    return out, lse


def flash_attention_bwd_cuda(q, k, v, out, lse, dout, causal: bool = True,
                             block_q: int = BLOCK_Q, block_k: int = BLOCK_K):
    """(dq, dk, dv) from the kernels `flash_attention_bwd_dq` (a block per (batch * head,
    query tile)) and `flash_attention_bwd_dkdv` (a block per (batch * kv head, key tile))."""
    xp = array_module(q)
    q, k, v, out, lse, dout = _prep(xp, q, k, v, out, lse, dout)
    B, Tq, Tk, H, Hkv, D = _dims(q, k, v, block_q, block_k)
    dq, dk, dv = xp.zeros_like(q), xp.zeros_like(k), xp.zeros_like(v)
    i32 = np.int32
    dims = (i32(B), i32(Tq), i32(Tk), i32(H), i32(Hkv), i32(D), i32(block_q), i32(block_k),
            i32(bool(causal)))
    k_dq = load_kernel("flash_attention.cu", "flash_attention_bwd_dq", backend=_backend(xp))
    k_dq((B * H, (Tq + block_q - 1) // block_q), (block_q,),
         (q, k, v, out, lse, dout, dq, *dims), shared_mem=2 * block_k * D * 4)
    k_dkdv = load_kernel("flash_attention.cu", "flash_attention_bwd_dkdv", backend=_backend(xp))
    k_dkdv((B * Hkv, (Tk + block_k - 1) // block_k), (block_k,),
           (q, k, v, out, lse, dout, dk, dv, *dims), shared_mem=(2 * block_q * D + 2 * block_q) * 4)
    return dq, dk, dv


def _scores_reference(q, k, causal):
    """P (B, H, Tq, Tk) and lse (B, H, Tq) of softmax(q k^T / sqrt(D)), float64, grouped heads."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    B, Tq, H, D = q.shape
    Tk, Hkv = k.shape[1], k.shape[2]
    kh = np.repeat(k, H // Hkv, axis=2)  # query head h reads kv head h // (H // Hkv)
    s = np.einsum("bihd,bjhd->bhij", q, kh) / np.sqrt(D)
    if causal:  # query i sees keys j <= i + Tk - Tq (the last query sees every key)
        s = np.where(np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + Tk - Tq, s, -np.inf)
    lse = np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1)) + s.max(-1)
    return np.exp(s - lse[..., None]), lse


def _sum_groups(dkh, Hkv):
    B, Tk, H, D = dkh.shape
    return dkh.reshape(B, Tk, Hkv, H // Hkv, D).sum(axis=3)


def flash_attention_fwd_reference(q, k, v, causal: bool = True):
    """NumPy reference of the forward kernel: (out (B, Tq, H, D), lse (B, H, Tq)) in float32."""
    p, lse = _scores_reference(q, k, causal)
    H, Hkv = q.shape[2], k.shape[2]
    vh = np.repeat(np.asarray(v, np.float64), H // Hkv, axis=2)
    out = np.einsum("bhij,bjhd->bihd", p, vh)
    return out.astype(np.float32), lse.astype(np.float32)


def flash_attention_bwd_reference(q, k, v, out, lse, dout, causal: bool = True):
    """NumPy reference of the backward kernels: (dq, dk, dv) in float32 (out, lse unused:
    the reference recomputes them in float64)."""
    p, _ = _scores_reference(q, k, causal)
    H, Hkv, D = q.shape[2], k.shape[2], q.shape[3]
    f64 = lambda a: np.asarray(a, np.float64)  # noqa: E731
    q, k, v, dout = f64(q), f64(k), f64(v), f64(dout)
    kh, vh = np.repeat(k, H // Hkv, axis=2), np.repeat(v, H // Hkv, axis=2)
    dvh = np.einsum("bhij,bihd->bjhd", p, dout)
    dp = np.einsum("bihd,bjhd->bhij", dout, vh)
    ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(D)
    dq = np.einsum("bhij,bjhd->bihd", ds, kh)
    dkh = np.einsum("bhij,bihd->bjhd", ds, q)
    return (dq.astype(np.float32), _sum_groups(dkh, Hkv).astype(np.float32),
            _sum_groups(dvh, Hkv).astype(np.float32))
