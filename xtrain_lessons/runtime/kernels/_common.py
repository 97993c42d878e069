"""What the GPU training-step kernel families share: storage dtypes and their C names, argument
checks, launch shapes, and one compiled module per `.cu` file.

Storage dtypes: float32 (`float`), bfloat16 (`ml_dtypes.bfloat16`, C `__nv_bfloat16`) and float16
(`__half`). A kernel loads a stored value into float, computes in float32 and rounds once on
store; statistics, losses, weight gradients and optimizer state are float32 arrays.

    ctype(np.float16)                        -> "__half"
    name_expression("rmsnorm_fwd", x.dtype, out.dtype) -> "rmsnorm_fwd<float, __nv_bfloat16>"
    kernel("rmsnorm.cu", expr, NAME_EXPRESSIONS, xp)   -> a Kernel of the module compiled once
    check(fn, "x", x, xp, dtypes=STORAGE, shape=(N, D)) -> TypeError/ValueError naming "x"

`kernel` compiles the whole `.cu` file once per process and backend with every name expression
its launchers use (CuPy's RawModule on a GPU, the emulator's Module on the CPU), so a family's
template instantiations cost one NVRTC (or g++) compile, not one each.
"""

from __future__ import annotations

import sys
import threading

import ml_dtypes
import numpy as np

from xtrain_lessons.runtime.cuda import KERNELS_DIR, Module
from xtrain_lessons.runtime.cuda.emulator import sanitize_default
from xtrain_lessons.runtime.device import array_module, kernel_backend

__all__ = ["BF16", "F16", "F32", "STORAGE", "ctype", "name_expression", "kernel", "check", "device_of",
           "row_threads", "grid_for", "BLOCK", "MAX_GRID"]

F32, BF16, F16 = np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16), np.dtype(np.float16)
STORAGE = (F32, BF16, F16)  # the activation storage formats every templated kernel takes
_CTYPES = {F32: "float", BF16: "__nv_bfloat16", F16: "__half"}

BLOCK = 256        # threads per block of the elementwise (grid-stride) kernels
MAX_GRID = 4096    # blocks of an elementwise launch: enough to fill an H100/H200 (132 SMs x 16 x 256 threads)


def ctype(dtype) -> str:
    """The C type name of a storage dtype: "float", "__nv_bfloat16" or "__half"."""
    dt = np.dtype(dtype)
    if dt not in _CTYPES:
        raise TypeError(f"no kernel storage type for {dt}: use float32, bfloat16 or float16")
    return _CTYPES[dt]


def name_expression(kernel_name: str, *dtypes) -> str:
    """The template name expression of `kernel_name` for these storage dtypes,
    e.g. name_expression("add", np.float16) == "add<__half>"."""
    return f"{kernel_name}<{', '.join(ctype(d) for d in dtypes)}>"


_modules: dict = {}
_kernels: dict = {}
_lock = threading.Lock()


def kernel(filename: str, name: str, all_names, like):
    """Kernel `name` (a plain name or a name expression) of kernels/<filename>, for arrays like
    `like` (NumPy: the emulator, CuPy: the GPU). The file is compiled once per process and
    backend with `all_names` (every template name expression of the family)."""
    backend = kernel_backend(like)
    # the CuPy module itself is part of the key: the tests swap in a CPU stand-in for CuPy
    key = (filename, backend, sanitize_default(), sys.modules.get("cupy") if backend == "gpu" else None)
    with _lock:
        mod = _modules.get(key)
        if mod is None:
            exprs = tuple(n for n in all_names if "<" in n)
            mod = _modules[key] = Module(KERNELS_DIR / filename, name_expressions=exprs, backend=backend)
        k = _kernels.get((key, name))
        if k is None:
            k = _kernels[(key, name)] = mod.get_function(name)
        return k


def device_of(fn: str, first_name: str, first):
    """The array module of `first`, the argument that decides where the launch runs."""
    if not hasattr(first, "dtype") or not hasattr(first, "flags"):
        raise TypeError(f"{fn}: {first_name} must be a NumPy or CuPy array, got {type(first).__name__}")
    return array_module(first)


def check(fn: str, name: str, a, xp, dtypes=None, shape=None) -> None:
    """Raise TypeError (not an array of `xp`, wrong dtype) or ValueError (wrong shape, not
    C-contiguous), each naming the launcher `fn` and the argument `name`."""
    if not hasattr(a, "dtype") or not hasattr(a, "flags"):
        raise TypeError(f"{fn}: {name} must be an array, got {type(a).__name__}")
    if array_module(a) is not xp:
        where = "a CuPy (GPU)" if xp is not np else "a NumPy (CPU)"
        raise TypeError(f"{fn}: {name} must be {where} array like the other arguments, got {type(a).__module__}")
    if dtypes is not None and a.dtype not in [np.dtype(d) for d in dtypes]:
        want = " or ".join(str(np.dtype(d)) for d in dtypes)
        raise TypeError(f"{fn}: {name} must be a {want} array, got {a.dtype}")
    if shape is not None and tuple(a.shape) != tuple(shape):
        raise ValueError(f"{fn}: {name} must have shape {tuple(shape)}, got {tuple(a.shape)}")
    if not a.flags.c_contiguous:
        raise ValueError(f"{fn}: {name} is not C-contiguous (use ascontiguousarray)")


def row_threads(width: int, per_thread: int = 8) -> int:
    """Threads of a one-block-per-row kernel for rows of `width`: about `per_thread` elements
    each, a whole number of warps, 32 (one warp) to 1024. Fixed by the width alone, so a row's
    reduction order (and its bits) never depends on anything else."""
    warps = -(-max(int(width), 1) // (32 * per_thread))
    return 32 * min(max(warps, 1), 32)


def grid_for(n: int) -> int:
    """Blocks of BLOCK threads for a grid-stride loop over n elements."""
    return max(1, min(-(-int(n) // BLOCK), MAX_GRID))
