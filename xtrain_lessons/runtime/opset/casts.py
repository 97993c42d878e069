"""Casts between float32 and the low-precision storage dtypes, bfloat16 and float16 (phases T12 and T12b).

    cast(a, dtype)        `a` as `dtype` (no copy when it already is)
    is_low(a)             `a` is stored as bfloat16 or float16

float32 -> bfloat16 rounds to nearest, ties to even (bit-identical to ml_dtypes and to CUDA's
__float2bfloat16 on every non-NaN input): on a GPU by kernels/bf16.cu, on the CPU by ml_dtypes.
bfloat16 -> float32 is exact (kernels/bf16.cu on a GPU). Anything else is the array's own astype;
float16 overflows above 65504 to inf, as a GPU's does (what fp16 loss scaling detects).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from xtrain_lessons.runtime.kernels.bf16 import bf16_to_f32, f32_to_bf16
from xtrain_lessons.runtime.opset.dispatch import on_gpu
from xtrain_lessons.runtime.opset.table import op

__all__ = ["BF16", "FP16", "F32", "LOW", "cast", "is_low"]

BF16, FP16, F32 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16), np.dtype(np.float32)
LOW = (BF16, FP16)


def is_low(a) -> bool:
    return a.dtype in LOW


@op("casts", cpu="ml_dtypes (astype)", gpu="kernels/bf16.cu: f32_to_bf16", reference="kernels/bf16.py: f32_to_bf16_reference",
    test="test_kernels_bf16.py")
def cast(a, dtype):
    """`a` as `dtype`; a float32 -> bfloat16 cast rounds to nearest even, other inputs go to float32 first."""
    dtype = np.dtype(dtype)
    if a.dtype == dtype:
        return a
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == BF16 and a.dtype != F32:
            a = a.astype(F32)
        if on_gpu(a) and dtype == BF16:
            return f32_to_bf16(a).view(BF16)
        if on_gpu(a) and a.dtype == BF16 and dtype == F32:
            return bf16_to_f32(a)
        return a.astype(dtype)
