"""Run CUDA C kernels — on an NVIDIA GPU through CuPy, or on the CPU through an emulator.

The same `.cu` source runs on both. On a GPU, `Kernel` wraps `cupy.RawKernel`; without one it
compiles the source with g++ against a small compatibility header and runs the CUDA threads
as fibers on the CPU (see `xtrain_lessons.runtime.cuda.emulator` for how, and for where it differs
from a GPU).

    import numpy as np
    from xtrain_lessons.runtime.cuda import Kernel

    src = r'''
    extern "C" __global__ void scale(const float* x, float* y, float a, int n) {
        int i = blockIdx.x * blockDim.x + threadIdx.x;
        if (i < n) y[i] = a * x[i];
    }
    '''
    k = Kernel(src, "scale")                 # source text, or a path to a .cu file
    x = np.arange(1000, dtype=np.float32); y = np.empty_like(x)
    k(((1000 + 255) // 256,), (256,), (x, y, np.float32(2), np.int32(1000)))   # y = 2 x

Public API
----------
Kernel(source, name, options=(), backend="auto", sanitize=None)
    `source`: CUDA C text or a path to a `.cu` file; `name`: the `extern "C" __global__`
    function, or a template's name expression ("block_sum<float, 128>"). `backend`: "gpu"
    (CuPy), "cpu" (emulator) or "auto" (gpu when `xtrain_lessons.runtime.device.get_device() ==
    "cuda"`). `options` go to NVRTC; on the CPU only -D/-U/-I options are passed on to g++.
    `sanitize` (CPU; default $XTRAIN_SANITIZE): check every access, see below.
kernel(grid, block, args, shared_mem=0)
    The `cupy.RawKernel` calling convention. grid and block are ints or tuples of up to 3 ints;
    args a tuple of arrays (C-contiguous; NumPy on the CPU, where the kernel writes into them in
    place) and NumPy scalars of the parameter's exact type (np.int32 for `int`, np.float32 for
    `float`). A Python int or float is refused with a TypeError: CuPy would pass it as a
    64-bit value, which a GPU kernel silently misreads. shared_mem is the bytes of
    `extern __shared__` memory per block.
kernel.signature (CPU) — the parameter list, e.g. "const float*, float*, float, int".
kernel.array_module — numpy (the emulator reads NumPy arrays) or cupy (a GPU kernel reads CuPy ones):
    put a kernel's arguments where it runs with `kernel.array_module.asarray(a)`.
Module(code, options=(), name_expressions=(), backend="auto", sanitize=None), alias RawModule —
    `cupy.RawModule`'s API: get_function(name or name expression) -> Kernel; get_global(name)
    (a `__constant__`/`__device__` variable's memory, with copy_from_host / copy_to_host);
    set_global(name, numpy_array).
load_kernel("vector_add.cu", "vector_add") — a kernel of the package (xtrain_lessons/runtime/kernels/),
    compiled once per process and backend.
KernelError — a run-time failure: deadlock, barrier divergence, __trap(), a sanitizer report.
    CompileError(KernelError) —
    the compiler's message, with the line numbers of the .cu file.
selftest() -> (ok, message) — compile and run vector add; used by `xtrain doctor`.

What the CPU emulator checks (and a GPU would not tell you): shared memory starts as NaN
(0xFF bytes) in every block, so a read before a write shows; a `__syncthreads()` that not
every thread reaches, or that threads reach at different lines, raises KernelError naming the
threads and the lines, instead of hanging; arguments must match the parameter types. Threads
that return early count as arrived at later barriers. What it cannot see (warp lockstep, most
races) is listed in `xtrain_lessons.runtime.cuda.emulator`'s docstring.

The sanitizer (`sanitize=True` or XTRAIN_SANITIZE=1; CPU only, on a GPU use NVIDIA's
compute-sanitizer) stops the kernel at the first out-of-bounds read or write of an array
argument or of shared memory, read of shared memory no thread has written, or shared-memory
race (two threads, one writing, touch an element between the same two barriers), with a
KernelError naming the kernel, block, thread, array (parameter) name, index and size. It runs
the blocks one at a time, so the report is the first bug in block order. SANITIZER_HINT is the
line a check prints on a kernel's wrong output.

Tensor cores: a kernel may use `mma.sync.aligned.m16n8k16` (bf16 or f16 in, float32 out) as inline
PTX, as NVRTC takes it; the emulator runs it as a warp-wide operation with the PTX ISA's fragment
layout (`emulator.mma_fragment_layout`), kernels/flash_attention_tc.cu and T14 show it.

Writing a kernel that runs on both: declare it `extern "C" __global__ void name(...)` (CuPy
finds it by that name) or launch a template through Module's name expressions, one
`__shared__` variable per declaration, and pass scalars as NumPy scalars of the parameter's
type. NVRTC (CuPy's compiler) does not include math.h: define INFINITY yourself.

Environment: XTRAIN_CACHE_DIR (compiled kernels, default ~/.cache/xtrain-lessons/kernels),
XTRAIN_EMULATOR_MODE=fibers|ucontext|threads (how a block's threads run; fibers is fastest),
XTRAIN_EMULATOR_WORKERS (OS threads running blocks; default: one per core), CXX (default g++),
XTRAIN_SANITIZE=1 (the sanitizer for every kernel compiled afterwards).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

from xtrain_lessons.runtime.cuda.emulator import (
    CompileError,
    CpuKernel,
    CpuModule,
    KernelError,
    check_launch,
    sanitize_default,
)
from xtrain_lessons.runtime.device import get_device, import_cupy

__all__ = ["Kernel", "Module", "RawModule", "KernelError", "CompileError", "load_kernel", "selftest", "KERNELS_DIR",
           "SANITIZER_HINT"]

# What a check says when a kernel's output is NaN or wrong.
SANITIZER_HINT = ("to find where, run the kernel again with Kernel(..., sanitize=True) (or XTRAIN_SANITIZE=1): "
                  "it reports out-of-bounds accesses, reads of unwritten shared memory and races, "
                  "with the block, thread and array")

KERNELS_DIR = Path(__file__).resolve().parent.parent / "kernels"


def _read_source(source: str | os.PathLike) -> tuple[str, str | None]:
    """(text, file name): `source` is a path if it is a PathLike or a one-line str ending in .cu."""
    if isinstance(source, os.PathLike) or ("\n" not in source and source.strip().endswith((".cu", ".cuh"))):
        path = Path(source)
        if not path.is_file():
            raise FileNotFoundError(f"no CUDA source file {str(path)!r}")
        return path.read_text(), str(path)
    return str(source), None


def _resolve_backend(backend: str) -> str:
    if backend not in ("auto", "cpu", "gpu"):
        raise ValueError(f"backend must be 'auto', 'cpu' or 'gpu', got {backend!r}")
    if backend == "auto":
        return "gpu" if get_device() == "cuda" else "cpu"
    return backend


def gpu_options(options, filename: str | None) -> tuple[str, ...]:
    """The NVRTC options `Kernel` gives CuPy: the user's, and the .cu file's folder for
    `#include "helper.cuh"` (tests/test_nvrtc_compile.py compiles every kernel with these)."""
    if filename and Path(filename).is_file():
        return (*options, f"-I{Path(filename).resolve().parent}")
    return tuple(options)


def _cupy():
    try:
        return import_cupy()
    except ImportError as e:
        raise RuntimeError("backend='gpu' needs CuPy (pip install cupy-cuda12x) and an NVIDIA GPU") from e


class GpuKernel:
    """`cupy.RawKernel` with the argument checks that need no type information."""
    backend = "gpu"

    def __init__(self, source: str, name: str, options=(), filename: str | None = None, kernel=None):
        self.name, self.source, self.filename = name, source, filename or f"{name.split('<')[0].strip()}.cu"
        if kernel is None:  # a template kernel goes through a module, which knows name expressions
            self._kernel = _cupy().RawKernel(source, name, options=gpu_options(options, filename)) \
                if "<" not in name else _cupy().RawModule(code=source, options=gpu_options(options, filename),
                                                         name_expressions=[name]).get_function(name)
        else:
            self._kernel = kernel

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        g, b, shmem = check_launch(grid, block, shared_mem)
        for i, a in enumerate(args):
            if isinstance(a, (bool, int, float)) and not isinstance(a, np.generic):
                raise TypeError(f"argument {i}: got a Python {type(a).__name__}; pass a NumPy scalar of the "
                                "parameter's type (np.int32(n), np.float32(x))")
            if isinstance(a, np.ndarray):
                raise TypeError(f"argument {i}: a NumPy array cannot be read by the GPU; use to_device(a)")
            if hasattr(a, "flags") and not a.flags.c_contiguous:
                raise ValueError(f"argument {i}: the array is not C-contiguous")
        self._kernel(g, b, tuple(args), shared_mem=shmem)

    def __repr__(self) -> str:
        return f"GpuKernel({self.name}, {self.filename})"


class Kernel:
    """A CUDA C kernel, runnable on the GPU (CuPy) or the CPU (emulator); see the module doc."""
    def __init__(self, source: str | os.PathLike, name: str, options=(), backend: str = "auto",
                 sanitize: bool | None = None, *, _impl=None):
        if _impl is None:
            text, filename = _read_source(source)
            backend = _resolve_backend(backend)
            if backend == "gpu":  # on a GPU, run the script under NVIDIA's compute-sanitizer instead
                _impl = GpuKernel(text, name, tuple(options), filename)
            else:
                _impl = CpuKernel(text, name, tuple(options), filename, sanitize=sanitize)
        self._impl, self.backend = _impl, _impl.backend
        self.sanitize = getattr(_impl, "sanitize", False)
        self.name, self.source, self.filename = name, _impl.source, _impl.filename

    def __call__(self, grid, block, args, shared_mem: int = 0) -> None:
        self._impl(grid, block, args, shared_mem=shared_mem)

    @property
    def signature(self) -> str | None:
        return getattr(self._impl, "signature", None)

    @property
    def array_module(self):
        """The arrays this kernel reads: numpy for the emulator, cupy on a GPU
        (`xk = kernel.array_module; kernel(grid, block, (xk.asarray(a), ...))`)."""
        return import_cupy() if self.backend == "gpu" else np

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, file={self.filename!r}, backend={self.backend!r})"


class Module:
    """Several kernels, template kernels and `__constant__` memory in one source, with the API of
    `cupy.RawModule`; `RawModule(code=..., name_expressions=[...])` is the same class.

        mod = Module(code=src, name_expressions=["scale<float, 128>"])
        k = mod.get_function("scale<float, 128>")     # a Kernel
        mod.set_global("coeffs", np.arange(8, dtype=np.float32))   # __constant__ float coeffs[8];
    """

    def __init__(self, code: str | os.PathLike, options=(), name_expressions=(), backend: str = "auto",
                 sanitize: bool | None = None):
        text, filename = _read_source(code)
        self.backend, self.source = _resolve_backend(backend), text
        self.filename = filename or "module.cu"
        if self.backend == "gpu":
            self._impl = _cupy().RawModule(code=text, options=gpu_options(options, filename),
                                           name_expressions=list(name_expressions) or None)
        else:
            self._impl = CpuModule(text, tuple(options), filename, sanitize, tuple(name_expressions))

    def get_function(self, name: str) -> Kernel:
        if self.backend == "gpu":
            impl = GpuKernel(self.source, name, filename=self.filename, kernel=self._impl.get_function(name))
        else:
            impl = self._impl.get_function(name)
        return Kernel(None, name, _impl=impl)

    def get_global(self, name: str):
        """The variable's device memory: a cupy MemoryPointer on a GPU, a GlobalMemory on the CPU
        (both have .ptr, copy_from_host(ptr, nbytes), copy_to_host(ptr, nbytes))."""
        return self._impl.get_global(name)

    def set_global(self, name: str, values: np.ndarray) -> None:
        """Copy a NumPy array's bytes into the variable (how a launcher sets __constant__ memory)."""
        values = np.ascontiguousarray(values)
        self.get_global(name).copy_from_host(values.ctypes.data, values.nbytes)


RawModule = Module

_loaded: dict[tuple, Kernel] = {}
_loaded_lock = threading.Lock()


def load_kernel(filename: str, name: str, backend: str = "auto", options=()) -> Kernel:
    """The kernel `name` of `xtrain_lessons/runtime/kernels/<filename>`, compiled once per process."""
    where = _resolve_backend(backend)
    # the CuPy module is part of the key on the GPU: a process may meet both a real CuPy and the
    # CPU stand-in for it (cupy_standin), and a kernel compiled for one is no use to the other
    key = (filename, name, where, tuple(options), sanitize_default(), sys.modules.get("cupy") if where == "gpu" else None)
    with _loaded_lock:
        if key not in _loaded:
            _loaded[key] = Kernel(KERNELS_DIR / filename, name, options=options, backend=where)
        return _loaded[key]


def selftest() -> tuple[bool, str]:
    """Compile and run the vector-add kernel on the CPU emulator; (ok, one-line message)."""
    try:
        t0 = time.perf_counter()
        k = Kernel(KERNELS_DIR / "vector_add.cu", "vector_add", backend="cpu")
        t1 = time.perf_counter()
        n = 1000
        a = np.arange(n, dtype=np.float32)
        b = np.full(n, 0.5, np.float32)
        c = np.zeros(n, np.float32)
        k(((n + 255) // 256,), (256,), (a, b, c, np.int32(n)))
        if not np.array_equal(c, a + b):
            return False, "CUDA emulator: vector add gave wrong results"
        return True, f"CUDA emulator: vector add ok (compile/load {1000 * (t1 - t0):.0f} ms)"
    except Exception as e:  # doctor reports, never crashes
        return False, f"CUDA emulator: {type(e).__name__}: {e}"
