"""Flash-attention's compiled kernels: which of them take these arrays (phases T14 and T12, issue 39).

    kernels = flash_kernels(q, k, v)     # (name, forward, backward), or None: no compiled kernel
    out, lse = kernels[1](q, k, v, causal)
    dq, dk, dv = kernels[2](q, k, v, out, lse, g, causal)

On a GPU: bfloat16 q, k, v (head dim <= 128) on the tensor cores (kernels/flash_attention_tc.cu:
mma.sync, float32 softmax statistics); float32 on the CUDA cores (kernels/flash_attention.cu, one
thread per row). Elsewhere (the CPU, float16, larger heads) there is none: model/flash_attention.py
runs its NumPy tiles (the T14 algorithm) and the bf16 forward composed attention.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.runtime.kernels import flash_attention as cuda_core
from xtrain_lessons.runtime.kernels import flash_attention_tc as tensor_core
from xtrain_lessons.runtime.opset import dispatch
from xtrain_lessons.runtime.opset.table import op

__all__ = ["flash_kernels", "flash_kernels_for"]


def _tc_fwd(q, k, v, causal):
    return tensor_core.flash_attention_tc_fwd(q, k, v, causal=causal)


def _tc_bwd(q, k, v, out, lse, g, causal):
    g = g if g.dtype == tensor_core.BF16 else g.astype(tensor_core.BF16)
    return tensor_core.flash_attention_tc_bwd(q, k, v, out, lse, g, causal=causal)


def _cc_fwd(q, k, v, causal):
    return cuda_core.flash_attention_fwd_cuda(q, k, v, causal)


def _cc_bwd(q, k, v, out, lse, g, causal):
    return cuda_core.flash_attention_bwd_cuda(q, k, v, out, lse, g, causal)


_KERNELS = {"tensor_cores": ("flash_attention_tc", _tc_fwd, _tc_bwd),
            "cuda_cores": ("flash_attention", _cc_fwd, _cc_bwd)}


def flash_kernels_for(dtype, head_dim: int, like):
    """The flash kernels (name, forward, backward) for arrays of `dtype` and `head_dim` on the device
    of `like` (an array), or None where none is compiled for them (see the module doc)."""
    if not dispatch.on_gpu(like):
        return None
    dtype = np.dtype(dtype)
    if dtype == tensor_core.BF16 and head_dim <= tensor_core.MAX_D:
        return _KERNELS["tensor_cores"]
    if dtype == np.float32 and head_dim <= cuda_core.MAX_D:
        return _KERNELS["cuda_cores"]
    return None


@op("attention", cpu="none: model/flash_attention.py's NumPy tiles",
    gpu="kernels/flash_attention_tc.cu: flash_tc_fwd, flash_tc_bwd_dq, flash_tc_bwd_dkdv (bf16) + "
        "kernels/flash_attention.cu: flash_attention_fwd, flash_attention_bwd_dq (float32)",
    reference="kernels/flash_attention_tc.py: flash_attention_tc_reference + "
              "kernels/flash_attention.py: flash_attention_fwd_reference",
    test="test_flash_attention.py, test_flash_attention_tc.py")
def flash_kernels(q, k, v):
    """The flash kernels (name, forward, backward) that take q, k, v (one dtype, one device), or None."""
    if not all(dispatch.on_gpu(a) for a in (q, k, v)) or not q.dtype == k.dtype == v.dtype:
        return None  # (a layout the kernels do not take is copied by them)
    return flash_kernels_for(q.dtype, q.shape[-1], like=q)
