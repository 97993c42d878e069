"""Devices: pick the array module — NumPy on the CPU, CuPy on an NVIDIA GPU.

This module is the package's one seam between NumPy and CuPy: every "which array module?"
question is answered here (`get_xp`, `array_module`, `on_gpu`), CuPy is imported only here
(`import_cupy`), and the paths that differ on a GPU are named choices made here:
`kernel_backend` (the CPU emulator or CuPy's RawKernel), `scatter_add` (np.add.at or CuPy's),
`move_to` (a parameter to "cpu" or "cuda"), `is_out_of_memory` (a GPU allocation that failed); the fused AdamW kernel, the Philox dropout kernel
and NCCL are chosen by the layers above from `on_gpu`/`get_device`.

Array code is written once against `xp = get_xp()`; the same lines run on either device.

    from xtrain_lessons.runtime.device import get_xp, to_device, to_host, Timer, describe
    print(describe())                 # "device: cpu (NumPy 2.1.0)"
    xp = get_xp()
    x = to_device(np.ones(1000, np.float32))
    with Timer() as t:
        y = (x * 2).sum()
    print(to_host(y), t.elapsed)

The device comes from $XTRAIN_DEVICE: "cpu", "cuda" or "auto" (the default: cuda when CuPy
imports and a GPU answers). `set_device()` overrides it for the process. CuPy is imported
only when a GPU is asked for or probed, never when this module is imported.

GPU work is asynchronous: a kernel launch returns before the kernel finishes. `Timer`
synchronises before reading the clock at both ends, so it measures the work, not the launch.
"""

from __future__ import annotations

import os
import sys
import time
from types import ModuleType

import numpy as np

DEVICES = ("cpu", "cuda", "auto")
_override: str | None = None
_gpu_ok: bool | None = None


def import_cupy() -> ModuleType:
    """The cupy module (ImportError with the install line when it is missing)."""
    try:
        import cupy
    except ImportError as e:
        raise ImportError("CuPy is not installed: pip install cupy-cuda12x (needs an NVIDIA GPU)") from e
    return cupy


def gpu_available() -> bool:
    """True when CuPy imports and at least one CUDA GPU is usable (checked once)."""
    global _gpu_ok
    if _gpu_ok is None:
        try:
            cupy = import_cupy()
            _gpu_ok = cupy.cuda.runtime.getDeviceCount() > 0
            if _gpu_ok:
                int(cupy.arange(2).sum())  # the driver really answers
        except Exception:
            _gpu_ok = False
    return _gpu_ok


def set_device(name: str | None) -> str:
    """Choose "cpu", "cuda" or "auto" for this process (None: back to $XTRAIN_DEVICE)."""
    global _override
    if name is not None and name not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {name!r}")
    _override = name
    return get_device()


def get_device() -> str:
    """The device in use: "cpu" or "cuda"."""
    want = _override or os.environ.get("XTRAIN_DEVICE", "auto") or "auto"
    if want not in DEVICES:
        raise ValueError(f"XTRAIN_DEVICE={want!r}: choose one of cpu, cuda, auto")
    if want == "cpu":
        return "cpu"
    if want == "cuda":
        if not gpu_available():
            raise RuntimeError("device 'cuda' was asked for but no GPU is usable: CuPy must be installed "
                               "(pip install cupy-cuda12x) and an NVIDIA GPU visible. "
                               "Use XTRAIN_DEVICE=cpu (or auto) to run on the CPU.")
        return "cuda"
    return "cuda" if gpu_available() else "cpu"


def get_xp() -> ModuleType:
    """The array module of the current device: numpy or cupy."""
    return import_cupy() if get_device() == "cuda" else np


xp = get_xp  # short alias: `xp()`


def on_gpu(a) -> bool:
    """True when `a` is a CuPy array or the cupy module (checked without importing CuPy: if
    nothing imported it, nothing is a CuPy array). Whatever `import cupy` gives counts, so the
    CPU stand-in for CuPy (cupy_standin) takes the GPU paths."""
    cupy = sys.modules.get("cupy")
    return cupy is not None and (a is cupy or isinstance(a, cupy.ndarray))


def array_module(a) -> ModuleType:
    """numpy or cupy, whichever `a` belongs to (without importing CuPy for NumPy arrays)."""
    return import_cupy() if on_gpu(a) else np


def kernel_backend(a) -> str:
    """Where a CUDA kernel on `a` (an array or an array module) runs: "gpu" (CuPy's
    RawKernel) for CuPy, "cpu" (the emulator) for NumPy."""
    return "gpu" if on_gpu(a) else "cpu"


def scatter_add(target, idx, values) -> None:
    """target[idx] += values, adding (not overwriting) where idx repeats a position."""
    xp = array_module(target)
    if xp is np or hasattr(xp.add, "at"):
        xp.add.at(target, idx, values)
    else:  # older CuPy
        import cupyx

        cupyx.scatter_add(target, idx, values)


def is_out_of_memory(exc: BaseException) -> bool:
    """The GPU ran out of memory: CuPy's OutOfMemoryError, or CUDA / cuBLAS saying so (checked
    by name, so that asking never imports CuPy)."""
    kind = type(exc)
    if kind.__name__ == "OutOfMemoryError" and kind.__module__.startswith("cupy"):
        return True
    text = str(exc)
    return kind.__module__.startswith("cupy") and ("cudaErrorMemoryAllocation" in text
                                                   or "CUBLAS_STATUS_ALLOC_FAILED" in text)


def move_to(a, device: str):
    """`a` as an array of `device` ("cpu": NumPy, "cuda": CuPy), copied only when it moves."""
    if device == "cpu":
        return a.get() if on_gpu(a) else a
    if device == "cuda":
        return import_cupy().asarray(a)
    raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")


def to_device_of(a, like):
    """`a` on the device `like` (an array) lives on; copied only when it has to move."""
    if on_gpu(a) == on_gpu(like):
        return a
    return move_to(a, "cuda" if on_gpu(like) else "cpu")


def to_device(a, dtype=None):
    """`a` as an array of the current device (a copy only when it has to move)."""
    return get_xp().asarray(a, dtype=dtype)


def is_array(a) -> bool:
    """`a` is an array of either device (NumPy, or CuPy: checked without importing it)."""
    return hasattr(a, "__array_interface__") or on_gpu(a)


def set_from_host(dst, src) -> None:
    """dst[...] = src for a host array `src`: one copy to the device of `dst` (CuPy's `set`)."""
    if on_gpu(dst):
        dst.set(np.ascontiguousarray(src, dtype=dst.dtype))
    else:
        dst[...] = src


def cublas_binding():
    """CuPy's own cuBLAS binding (cupy_backends), for the calls runtime/cublas_direct.py cannot make."""
    import_cupy()
    from cupy_backends.cuda.libs import cublas

    return cublas


def captures_graphs(device: str) -> bool:
    """Whether `device` ("cpu" or "cuda") records a step as a CUDA graph (capture_graph): a GPU does;
    the CPU has no launches to record."""
    return device == "cuda"


def capture_graph(fn, keep=None):
    """(fn(), the CUDA graph of the launches fn made, what keeps it alive): fn runs once on a stream
    of its own, and what it allocates comes from a memory pool of the graph's own, so that the
    addresses the graph replays stay the graph's. `keep`: what an earlier capture returned, to
    record on its stream and pool again (graphs that never run at the same time may share one).
    Nothing in fn may copy from the host or wait for the GPU: a capture cannot record either."""
    cupy = import_cupy()
    pool, stream = keep if keep is not None else (cupy.cuda.MemoryPool(), cupy.cuda.Stream(non_blocking=True))
    with cupy.cuda.using_allocator(pool.malloc), stream:
        stream.begin_capture()
        try:
            result = fn()
        finally:
            graph = stream.end_capture()
    return result, graph, (pool, stream)


def to_host(a) -> np.ndarray:
    """`a` as a NumPy array (copied from the GPU when it lives there)."""
    if on_gpu(a):
        return a.get()
    return np.asarray(a)


def default_log_every(device: str) -> int:
    """Training steps between reads of their values on the host (TrainConfig.log_every's default):
    1 on the CPU, where reading a value is free; 10 on a GPU, where each read waits for the device
    to finish its queue (a host synchronisation)."""
    return 10 if device == "cuda" else 1


def synchronize() -> None:
    """Wait until the GPU has finished all queued work (no-op on the CPU)."""
    if "cupy" in sys.modules and gpu_available():
        sys.modules["cupy"].cuda.get_current_stream().synchronize()


class Timer:
    """Wall-clock time of a block of code, synchronising the GPU at both ends.

        with Timer() as t:
            work()
        print(f"{t.elapsed * 1e3:.2f} ms")
    """

    def __init__(self):
        self.elapsed = 0.0

    def __enter__(self) -> "Timer":
        synchronize()
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        synchronize()
        self.elapsed = time.perf_counter() - self._t0

    @property
    def ms(self) -> float:
        return self.elapsed * 1e3


def describe() -> str:
    """One line naming the device, e.g. "device: cpu (NumPy 2.1.0)"."""
    if get_device() == "cuda":
        cupy = import_cupy()
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
        mem = props["totalGlobalMem"] / 2**30
        return f"device: cuda (CuPy {cupy.__version__}, {name}, {mem:.0f} GB)"
    return f"device: cpu (NumPy {np.__version__})"
