"""NVIDIA's spec-sheet peak throughput of a few GPUs, dense, by dtype: what MFU is quoted against (T07b).

    spec = spec_peak("NVIDIA H100 80GB HBM3", "bf16")   # GpuSpec("H100 SXM", "bf16", 989.4e12, source)
    spec_peak("Tesla T4", "bf16")                        # None: not in the table (then MFU uses the measured peak)

MFU (model FLOPs utilisation) is the FLOPs a step must do over the time it took, divided by what
the card can do: the dense (no 2:4 sparsity) tensor-core peak of the dtype the products run in —
bf16 and fp16 with float32 accumulation, as cuBLAS runs ours (CUBLAS_COMPUTE_32F); "fp32" for a
float32 step, because the engine and torch multiply float32 without TF32 (CuPy's and torch's default),
on the CUDA cores; "tf32" is listed for reference. Data sheets quote tensor peaks with sparsity
(marked *) and dense; the dense figure is half the sparse one. Boost clocks; a card held below them
(power, heat) runs slower than its spec.

Sources, checked for this table (TFLOP/s):
- H100 SXM and PCIe: NVIDIA H100 Tensor Core GPU data sheet: FP32 67 / 51; TF32 989* / 756*;
  BF16 and FP16 1,979* / 1,513* (dense: half); the Hopper whitepaper's dense SXM figures 494.7 / 989.4.
- H200 (SXM): NVIDIA H200 data sheet: the H100 SXM's compute (FP32 67, TF32 989*, BF16 1,979*); only the
  memory differs.
- A100 (SXM and PCIe, 40 and 80 GB): NVIDIA A100 data sheet: FP32 19.5, TF32 156 (312*), BF16 and FP16 312 (624*).
- L40S: NVIDIA L40S data sheet: FP32 91.6, TF32 183 (366*), BF16 and FP16 362.05 (733*).
- L4: NVIDIA L4 data sheet: FP32 30.3, TF32 120*, BF16 and FP16 242*.
- A10: NVIDIA A10 data sheet: FP32 31.2, TF32 62.5 (125*), BF16 and FP16 125 (250*).
- GeForce RTX 4090: NVIDIA Ada Lovelace architecture whitepaper (appendix): FP32 82.6, TF32 82.6 (165.2*),
  FP16 / BF16 with FP32 accumulate 165.2 (330.4*) (GeForce cards run FP32-accumulate at half the
  FP16-accumulate rate).
"""

from __future__ import annotations

import re
from typing import NamedTuple

__all__ = ["GpuSpec", "spec_peak", "SPECS"]


class GpuSpec(NamedTuple):
    card: str  # the table's name for it
    dtype: str  # "fp32", "tf32", "bf16" or "fp16"
    flops: float  # dense peak, FLOP/s
    source: str


_H100_SXM = {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}
# (table name, pattern on CUDA's device name, dense TFLOP/s by dtype, source)
SPECS: list[tuple[str, str, dict, str]] = [
    ("H100 SXM", r"\bH100\b(?!.*(PCIe|NVL)).*(HBM3|SXM)", _H100_SXM, "NVIDIA H100 data sheet (SXM)"),
    ("H100 PCIe", r"\bH100\b.*PCIe", {"fp32": 51.0, "tf32": 378.0, "bf16": 756.5, "fp16": 756.5},
     "NVIDIA H100 data sheet (PCIe)"),
    ("H200", r"\bH200\b(?!.*NVL)", _H100_SXM, "NVIDIA H200 data sheet (SXM)"),
    ("A100", r"\bA100\b", {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0}, "NVIDIA A100 data sheet"),
    ("L40S", r"\bL40S\b", {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05}, "NVIDIA L40S data sheet"),
    ("L4", r"\bL4$", {"fp32": 30.3, "tf32": 60.0, "bf16": 121.0, "fp16": 121.0}, "NVIDIA L4 data sheet"),
    ("A10", r"\bA10$", {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0}, "NVIDIA A10 data sheet"),
    ("RTX 4090", r"RTX 4090$", {"fp32": 82.6, "tf32": 82.6, "bf16": 165.2, "fp16": 165.2},
     "NVIDIA Ada Lovelace whitepaper (GeForce RTX 4090)"),
]
_DTYPE = {"float32": "fp32", "fp32": "fp32", "tf32": "tf32", "bf16": "bf16", "bfloat16": "bf16",
          "fp16": "fp16", "float16": "fp16"}


def spec_peak(device_name: str, dtype: str) -> GpuSpec | None:
    """The dense spec peak of the card CUDA calls `device_name` for `dtype` (the engine's names:
    "float32", "bf16", "fp16"; or "tf32"), or None when the card is not in SPECS."""
    key = _DTYPE.get(dtype)
    if key is None:
        raise ValueError(f"spec_peak: unknown dtype {dtype!r}; choose from {sorted(_DTYPE)}")
    name = device_name.strip()
    for card, pattern, peaks, source in SPECS:
        if re.search(pattern, name):
            return GpuSpec(card, key, peaks[key] * 1e12, source)
    return None
