"""Flash-attention: the launchers for kernels/flash_attention.cu and their NumPy references.

    out, lse = flash_attention_fwd_cuda(q, k, v)                  # float32, causal
    dq, dk, dv = flash_attention_bwd_cuda(q, k, v, out, lse, dout)

NumPy arrays run on the CPU emulator (slow: keep sizes small, e.g. T = 37, D = 16), CuPy
arrays on the GPU. The references are the tiled NumPy version of
`xtrain_lessons.flash_attention` (same algorithm, same layout), computed in float32.
Layout: q, out (B, Tq, H, D); k, v (B, Tk, Hkv, D); lse (B, H, Tq).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.cuda import load_kernel
from xtrain_lessons.device import array_module
from xtrain_lessons.flash_attention import flash_attention_bwd, flash_attention_fwd

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
    return "cpu" if xp is np else "gpu"


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


def flash_attention_fwd_reference(q, k, v, causal: bool = True):
    """NumPy reference of the forward kernel: (out, lse) in float32."""
    f32 = lambda a: np.asarray(a, dtype=np.float32)  # noqa: E731
    return flash_attention_fwd(f32(q), f32(k), f32(v), causal)


def flash_attention_bwd_reference(q, k, v, out, lse, dout, causal: bool = True):
    """NumPy reference of the backward kernels: (dq, dk, dv) in float32."""
    f32 = lambda a: np.asarray(a, dtype=np.float32)  # noqa: E731
    return flash_attention_bwd(f32(q), f32(k), f32(v), f32(out), f32(lse), f32(dout), causal)
