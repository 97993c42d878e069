"""The float32 matrix multiply of the engine's CPU path: Intel MKL's when it is installed,
NumPy's otherwise (phase T07).

Every product of the engine's linear layers and of its lm_head goes through `gemm(a, b, out)`
on the row chunks `cpu_threads` cuts. NumPy's `np.matmul` calls the BLAS NumPy was built with:
OpenBLAS for the wheels on PyPI. On the small products of a CPU-sized model (K = 192 .. 1376)
Intel's MKL runs faster on the same core (T07 §2 times both on a linear layer's products;
torch calls MKL too). When
the `mkl` package is installed (`pip install -e ".[fast]"`, part of the dev extras, or conda's
`mkl`), `gemm` calls its `cblas_sgemm` through ctypes, one thread per call (the engine's threads
do the splitting, one chunk per call, as with OpenBLAS).

One thread per call, without touching anyone else's: torch links its own copy of MKL, and the
two share MKL's service functions once ours is loaded. MKL's sequential threading layer would
make torch's matmuls single-threaded too (measured: a 2-thread torch matmul 2x slower). So the
library runs on the GNU OpenMP layer, torch's own, and every call sets this thread's MKL thread
count to 1 and puts the previous value back (`MKL_Set_Num_Threads_Local`); without libgomp it
falls back to the sequential layer.

    from xtrain_lessons.runtime import blas
    blas.gemm(a, b, out)     # out = a @ b, float32, a and b may be transposed views
    blas.name()              # "MKL 2026.2 (one thread per call)" or "NumPy (scipy-openblas 0.3.31)"
    with blas.numpy_only():  # NumPy's matmul inside the block

Anything MKL cannot take as it is (other dtypes, CuPy arrays, strides with no unit step, an
output that is not C-contiguous) goes to np.matmul. XTRAIN_BLAS=numpy turns MKL off. The two
libraries round differently: the same run gives other last bits with and without MKL, and the
same bits for any thread count with either (the chunks, not the threads, decide each call).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import re
import sys
import threading
from pathlib import Path

import numpy as np

__all__ = ["gemm", "name", "mkl_loaded", "numpy_only", "mkl_path", "openblas_libraries", "sgemm_address",
           "layout", "NO_TRANS", "TRANS"]

_ROW_MAJOR, NO_TRANS, TRANS = 101, 111, 112  # CBLAS's constants
_SEQUENTIAL, _GNU = 1, 3  # MKL_THREADING_SEQUENTIAL, MKL_THREADING_GNU
_state = {"lib": None, "tried": False, "off": os.environ.get("XTRAIN_BLAS", "").lower() == "numpy"}
_lock = threading.Lock()


def mkl_path() -> Path | None:
    """libmkl_rt of this environment (the `mkl` wheel or conda put it under sys.prefix), or None."""
    roots = [Path(sys.prefix) / "lib", Path(sys.prefix) / "Library" / "bin"]
    patterns = {"Linux": "libmkl_rt.so*", "Darwin": "libmkl_rt*.dylib", "Windows": "mkl_rt*.dll"}
    pattern = patterns.get(platform.system(), "libmkl_rt.so*")
    found = sorted(p for root in roots if root.is_dir() for p in root.glob(pattern))
    return found[-1] if found else None


def _load():
    path = mkl_path()
    if path is None:
        return None
    try:
        lib = ctypes.CDLL(str(path))
        lib.MKL_Set_Threading_Layer(_GNU if _libgomp() else _SEQUENTIAL)  # before any other call
        fn = lib.cblas_sgemm
        lib.MKL_Set_Num_Threads_Local.argtypes, lib.MKL_Set_Num_Threads_Local.restype = [ctypes.c_int], ctypes.c_int
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p,
                                        ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.c_int]
    fn.restype = None
    return lib


def _libgomp() -> bool:
    """GNU OpenMP's runtime can be loaded (MKL's GNU threading layer needs it)."""
    try:
        ctypes.CDLL("libgomp.so.1")
        return True
    except OSError:
        return False


def _mkl():
    if _state["off"]:
        return None
    if not _state["tried"]:
        with _lock:
            if not _state["tried"]:
                _state["lib"] = _load()
                _state["tried"] = True
    return _state["lib"]


def mkl_loaded() -> bool:
    return _mkl() is not None


@contextlib.contextmanager
def numpy_only():
    """np.matmul for every product inside the block (process-wide)."""
    before = _state["off"]
    _state["off"] = True
    try:
        yield
    finally:
        _state["off"] = before


def name() -> str:
    lib = _mkl()
    if lib is not None:
        buf = ctypes.create_string_buffer(256)
        lib.MKL_Get_Version_String(buf, len(buf))
        version = buf.value.decode(errors="replace").split("Version ")[-1].split("-")[0].strip()
        return f"MKL {version} (one thread per call)"
    try:
        info = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
        return f"NumPy ({info.get('name', 'BLAS')} {info.get('version', '')})".replace(" )", ")")
    except Exception:  # noqa: BLE001 - only a label
        return "NumPy"


def openblas_libraries() -> list:
    """The OpenBLAS libraries loaded in this process (NumPy's first), as ctypes.CDLL."""
    try:
        maps = open("/proc/self/maps", encoding="utf-8").read()  # Linux: the loaded libraries
    except OSError:
        return []
    paths = sorted(set(re.findall(r"(/\S*openblas\S*\.so\S*)", maps)), key=lambda p: "numpy" not in p)
    libs = []
    for path in paths:
        try:
            libs.append(ctypes.CDLL(path))
        except OSError:
            continue
    return libs


_SGEMM_SYMBOLS = (("scipy_cblas_sgemm64_", True), ("cblas_sgemm64_", True), ("scipy_cblas_sgemm", False),
                  ("cblas_sgemm", False))


def sgemm_address() -> tuple[int, bool, int | None] | None:
    """(address, 64-bit integers?, address of MKL_Set_Num_Threads_Local or None) of the CBLAS
    sgemm the engine uses — MKL's when loaded, else NumPy's OpenBLAS's — for C++ that
    multiplies by itself (runtime/host's attention); None when there is none to be found
    (then the engine keeps NumPy's batched matmuls). Looked up once per library."""
    lib = _mkl()
    key = "mkl" if lib is not None else "numpy"
    if key not in _sgemm_found:
        _sgemm_found[key] = _find_sgemm(lib)
    return _sgemm_found[key]


_sgemm_found: dict = {}


def _find_sgemm(mkl):
    if mkl is not None:
        address = ctypes.cast(mkl.cblas_sgemm, ctypes.c_void_p).value
        return address, False, ctypes.cast(mkl.MKL_Set_Num_Threads_Local, ctypes.c_void_p).value
    for lib in openblas_libraries():
        for symbol, wide in _SGEMM_SYMBOLS:
            if hasattr(lib, symbol):
                return ctypes.cast(getattr(lib, symbol), ctypes.c_void_p).value, wide, None
    return None


def layout(x):
    """(CBLAS transpose flag, leading dimension) of a 2-D float32 array, or None."""
    s0, s1 = x.strides
    if s1 == 4 and s0 >= max(1, x.shape[1]) * 4 and s0 % 4 == 0:
        return NO_TRANS, s0 // 4
    if s0 == 4 and s1 >= max(1, x.shape[0]) * 4 and s1 % 4 == 0:
        return TRANS, s1 // 4
    return None


def gemm(a, b, out):
    """out = a @ b for 2-D arrays; MKL's sgemm when it is loaded and can take them as they are."""
    lib = _mkl()
    if lib is not None and type(a) is np.ndarray and type(b) is np.ndarray and type(out) is np.ndarray \
            and a.dtype == b.dtype == out.dtype == np.float32 and out.flags.c_contiguous \
            and a.ndim == b.ndim == 2 and min(a.shape) > 0 and b.shape[1] > 0:
        la, lb = layout(a), layout(b)
        if la is not None and lb is not None:
            (M, K), N = a.shape, b.shape[1]
            before = lib.MKL_Set_Num_Threads_Local(1)  # this thread, this call: see the docstring
            try:
                lib.cblas_sgemm(_ROW_MAJOR, la[0], lb[0], M, N, K, 1.0, a.ctypes.data, la[1], b.ctypes.data,
                                lb[1], 0.0, out.ctypes.data, max(N, 1))
            finally:
                lib.MKL_Set_Num_Threads_Local(before)
            return out
    return np.matmul(a, b, out=out)
