"""Check this machine for the course: prints OK / MISSING / FAIL per component, with a fix.

Exit code 0 when everything the CPU course needs is present (Python, NumPy, the runtime
libraries, a C++20 compiler and the CUDA emulator). nvcc, a GPU with CuPy, torch,
transformers and Jupyter are reported too; they are optional for running the package, and
torch, transformers and Jupyter come with the dev extras the notebooks and tests use.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from dataclasses import dataclass
from importlib import metadata, util
from pathlib import Path

OK, MISSING, FAIL = "OK", "MISSING", "FAIL"
DEV_FIX = "pip install -e '.[dev]'  (after: pip install torch==2.13.0 for the small CPU build)"


@dataclass
class Finding:
    component: str
    status: str
    detail: str
    required: bool
    fix: str = ""


def _run(cmd: list[str], timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def check_python() -> Finding:
    v = sys.version_info
    ok = v >= (3, 10)
    return Finding("Python", OK if ok else FAIL, f"{v.major}.{v.minor}.{v.micro}", True,
                   "" if ok else "install Python 3.10 or newer")


def _blas_name(np) -> str:
    try:
        cfg = np.show_config(mode="dicts")
        blas = cfg.get("Build Dependencies", {}).get("blas", {})
        return f"{blas.get('name', '?')} {blas.get('version', '')}".strip()
    except Exception:
        return "unknown BLAS"


def check_numpy() -> Finding:
    try:
        import numpy as np
    except ImportError:
        return Finding("NumPy", MISSING, "not installed", True, "pip install numpy")
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    ok = float((a @ a.T)[1, 2]) == float(sum(a[1] * a[2]))
    return Finding("NumPy", OK if ok else FAIL, f"{np.__version__}, BLAS: {_blas_name(np)}", True,
                   "" if ok else "reinstall numpy: pip install --force-reinstall numpy")


def check_module(label: str, module: str, required: bool, fix: str, import_it: bool = True) -> Finding:
    if not import_it:  # large packages: ask the installed metadata, do not pay for the import

        if util.find_spec(module) is None:
            return Finding(label, MISSING, "not installed", required, fix)
        try:
            return Finding(label, OK, metadata.version(module), required)
        except metadata.PackageNotFoundError:
            return Finding(label, OK, "installed", required)
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return Finding(label, MISSING, "not installed", required, fix)
    except Exception as exc:  # installed but broken
        return Finding(label, FAIL, f"import failed: {exc}", required, fix)
    return Finding(label, OK, str(getattr(mod, "__version__", "installed")), required)


CXX20_PROBE = "#include <barrier>\n#include <span>\nint main(){ std::barrier b(1); b.arrive_and_wait(); return 0; }\n"


def find_cxx() -> str | None:

    for name in (os.environ.get("CXX"), "g++", "clang++", "c++"):
        if name and shutil.which(name):
            return name
    return None


def check_cxx() -> Finding:
    cxx = find_cxx()
    fix = "install a C++20 compiler: apt-get install g++  (or: conda install gxx)"
    if cxx is None:
        return Finding("C++20 compiler", MISSING, "no g++ / clang++ on PATH", True, fix)
    version = _run([cxx, "--version"]).stdout.splitlines()[0]
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp, "probe.cpp")
        src.write_text(CXX20_PROBE)
        res = _run([cxx, "-std=c++20", "-pthread", str(src), "-o", str(Path(tmp, "probe"))])
    if res.returncode != 0:
        return Finding("C++20 compiler", FAIL, f"{version}: cannot compile C++20 "
                       f"({res.stderr.strip().splitlines()[-1] if res.stderr.strip() else 'error'})",
                       True, "install g++ 11 or newer")
    return Finding("C++20 compiler", OK, version, True)


def check_emulator() -> Finding:
    fix = "see the error above; `xtrain doctor` needs a working C++20 compiler first"
    try:
        from xtrain_lessons.runtime import cuda
    except ImportError as exc:
        return Finding("CUDA emulator (CPU)", MISSING, f"not available: {exc}", True, fix)
    try:
        ok, message = cuda.selftest()
    except Exception as exc:
        return Finding("CUDA emulator (CPU)", FAIL, f"{type(exc).__name__}: {exc}", True, fix)
    return Finding("CUDA emulator (CPU)", OK if ok else FAIL, message, True, "" if ok else fix)


def check_fused_kernels() -> Finding:
    """runtime/host's fused C++ row kernels: the fast float32 CPU path (optional: without them
    the engine runs its NumPy path)."""
    from xtrain_lessons.runtime.host import fused_rows

    name = "fused CPU kernels"
    if not fused_rows.enabled():
        return Finding(name, MISSING, "turned off by XTRAIN_FUSED=0: the engine runs its NumPy path", False,
                       "unset XTRAIN_FUSED")
    if not fused_rows.available():
        return Finding(name, MISSING, "cannot be built: the engine runs its NumPy path (slower)", False,
                       "install g++ (or set $CXX)")
    return Finding(name, OK, f"built from runtime/host/{fused_rows.SOURCE.name} (g++ -O3 -march=native): "
                   "the engine's float32 CPU path", False)


def check_engine_blas() -> Finding:
    """Which sgemm the engine's CPU matmuls call (runtime/blas.py): MKL's when installed."""
    import platform

    from xtrain_lessons.runtime import blas

    name = blas.name()
    if blas.mkl_loaded():
        return Finding("engine matmuls", OK, name, False)
    on_x86 = platform.machine().lower() in ("x86_64", "amd64")
    return Finding("engine matmuls", MISSING if on_x86 else OK, f"{name} (no MKL: slower matmuls on x86-64; T07 §2 times both)"
                   if on_x86 else name, False, "optional: pip install -e '.[fast]'" if on_x86 else "")


def check_nvcc() -> Finding:
    nvcc = shutil.which("nvcc")
    fix = "optional: install the CUDA toolkit to compile-check kernels as real CUDA"
    if not nvcc:
        return Finding("nvcc", MISSING, "not on PATH", False, fix)
    lines = _run([nvcc, "--version"]).stdout.strip().splitlines()
    return Finding("nvcc", OK, lines[-1] if lines else nvcc, False)


def check_gpu() -> Finding:
    fix = "optional: on a machine with an NVIDIA GPU, pip install -e '.[gpu]'"
    try:
        import cupy
    except ImportError:
        return Finding("GPU (CuPy)", MISSING, "CuPy not installed; the course runs on the CPU", False, fix)
    except Exception as exc:
        return Finding("GPU (CuPy)", FAIL, f"CuPy import failed: {exc}", False, fix)
    try:
        n = cupy.cuda.runtime.getDeviceCount()
        name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
        return Finding("GPU (CuPy)", OK, f"CuPy {cupy.__version__}, {n} device(s): {name}", False)
    except Exception as exc:  # the driver's own words go in the fix, the detail stays one clean line
        return Finding("GPU (CuPy)", MISSING, f"CuPy {cupy.__version__} but no usable GPU: the course runs on the CPU",
                       False, f"check the NVIDIA driver: nvidia-smi (CuPy said: {exc})")


def check_precisions() -> Finding:
    """Which compute dtypes train on the current device: a forward and backward of a tiny model
    in each (finite loss, float32 gradients), and how each is carried out there."""
    import numpy as np  # noqa: PLC0415

    from xtrain_lessons.model.qwen3 import PRESETS, Model  # noqa: PLC0415
    from xtrain_lessons.runtime.device import get_device, import_cupy, to_device  # noqa: PLC0415

    how = {"float32": "native", "bf16": "emulated: bf16 storage, float32 arithmetic",
           "fp16": "emulated: float16 storage, float32 arithmetic, loss scaling"}
    try:
        dev = get_device()
        if dev == "cuda":
            cupy = import_cupy()
            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
            cc = (int(props["major"]), int(props["minor"]))
            how = {"float32": "native",
                   "bf16": "native bfloat16 arrays, cuBLAS with float32 accumulation, weights cast by kernels/bf16.cu"
                           + (", tensor cores" if cc >= (8, 0) else "; no bf16 tensor cores before sm_80"),
                   "fp16": "native float16, loss scaling" + (", tensor cores" if cc >= (7, 0) else "")}
        ok = []
        for dtype in ("float32", "bf16", "fp16"):
            m = Model(PRESETS["test"], seed=0)
            for p in m.parameters():
                p.data = to_device(p.data)
            m.compute_dtype = dtype
            ids = np.arange(16).reshape(2, 8) % PRESETS["test"].vocab_size
            loss = m.loss(ids, ids)
            loss.backward()
            if np.isfinite(float(loss.item())) and all(p.grad.dtype == np.float32 for p in m.parameters()):
                ok.append(f"{dtype} ({how[dtype]})")
        status = OK if len(ok) == 3 else FAIL
        return Finding(f"precisions ({dev})", status, "; ".join(ok) or "none", False,
                       "" if status == OK else "a compute dtype failed: run tests/test_amp.py")
    except Exception as exc:  # doctor reports, never crashes
        return Finding("precisions", FAIL, f"{type(exc).__name__}: {exc}", False, "run tests/test_amp.py")


def run_checks() -> list[Finding]:
    runtime_fix = "pip install -e ."
    findings = [check_python(), check_numpy()]
    for label, module in [("tokenizers", "tokenizers"), ("safetensors", "safetensors"),
                          ("ml_dtypes", "ml_dtypes"), ("matplotlib", "matplotlib"), ("tqdm", "tqdm")]:
        findings.append(check_module(label, module, True, runtime_fix))
    findings += [check_cxx(), check_emulator(), check_fused_kernels(), check_engine_blas(), check_nvcc(), check_gpu(), check_precisions()]
    findings.append(check_module("torch (test oracle)", "torch", False, DEV_FIX))
    for label, module in [("transformers (interop)", "transformers"),
                          ("Jupyter (JupyterLab)", "jupyterlab"), ("nbval (notebook tests)", "nbval")]:
        findings.append(check_module(label, module, False, DEV_FIX, import_it=False))
    return findings


def summary(findings: list[Finding]) -> list[str]:
    """A few lines for a notebook: the components that are OK on one line, one line per other
    finding (without its fix: `xtrain doctor` in a terminal prints those), and the verdict."""
    ok = [f.component for f in findings if f.status == OK]
    lines = textwrap.wrap(f"{len(ok)} components: " + ", ".join(ok), width=96,
                          initial_indent=f"  {OK:<8} ", subsequent_indent=" " * 11)
    lines += [f"  {f.status:<8} {f.component}: {f.detail}" for f in findings if f.status != OK]
    blocking = [f for f in findings if f.required and f.status != OK]
    gpu = next((f for f in findings if f.component == "GPU (CuPy)"), None)
    if blocking:
        lines.append(f"CPU course: NOT ready — {', '.join(f.component for f in blocking)} must be fixed "
                     "(run `xtrain doctor` for the fixes)")
    else:
        lines.append("CPU course: ready" + (" — GPU path: ready" if gpu is not None and gpu.status == OK else
                                           " (no GPU: kernels run on the CPU emulator)"))
    return lines


def report(findings: list[Finding]) -> int:
    print("xtrain doctor — what this machine has for the course")
    for f in findings:
        print(f"  {f.status:<8} {f.component}: {f.detail}")
        if f.status != OK and f.fix:
            print(f"  {'':<8}   fix: {f.fix}")
    blocking = [f for f in findings if f.required and f.status != OK]
    if blocking:
        print(f"CPU course: NOT ready — {', '.join(f.component for f in blocking)} must be fixed")
        return 1
    gpu = next(f for f in findings if f.component == "GPU (CuPy)")
    print("CPU course: ready" + (" — GPU path: ready" if gpu.status == OK else
                                 " (no GPU: kernels run on the CPU emulator)"))
    return 0
