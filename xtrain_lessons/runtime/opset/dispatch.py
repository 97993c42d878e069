"""Which kernel takes these arrays: the one question every op of the op set asks (phase T07).

    gpu(*arrays)    every array (None skipped) is a C-contiguous GPU array of a kernel storage
                    dtype (float32, bfloat16, float16): the CUDA kernels of runtime/kernels/ take them
    host(*arrays)   every array is a float32 C-contiguous NumPy array and the C++ kernels are built
                    and not turned off (runtime/host/fused_rows.py)

An op tries the GPU's kernel for GPU arrays, the C++ kernel for host arrays, and otherwise runs its
NumPy reference (written against the array module: it serves CuPy arrays no kernel takes too).
"""

from __future__ import annotations

from xtrain_lessons.runtime.device import on_gpu
from xtrain_lessons.runtime.host import fused_rows
from xtrain_lessons.runtime.kernels._common import STORAGE

__all__ = ["gpu", "host", "on_gpu"]


def gpu(*arrays) -> bool:
    """Every array (None skipped) is a C-contiguous GPU array of a kernel storage dtype."""
    present = [a for a in arrays if a is not None]
    return bool(present) and all(on_gpu(a) and a.dtype in STORAGE and a.flags.c_contiguous for a in present)


host = fused_rows.usable
