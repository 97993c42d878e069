"""The device a command was asked for, checked before it does any work: used, or refused in one line.

    device = require_device("train", dtype="bf16")   # "cpu" or "cuda"; UsageError (exit 2) otherwise

`--device cuda` (or XTRAIN_DEVICE=cuda) on a machine where no GPU answers is refused at once, saying
why (CuPy missing, or CuPy finding no GPU, with CUDA's own words), instead of failing later, half
done (a tokenizer trained, a run folder begun). `auto` (the default) takes a GPU when one answers.
bf16 on a GPU without bf16 tensor cores (below compute capability 8.0) is refused the same way.
"""

from __future__ import annotations

import os

from xtrain_lessons.cli.errors import UsageError
from xtrain_lessons.runtime import device
from xtrain_lessons.runtime.cublas_direct import bf16_refusal

__all__ = ["require_device", "why_no_gpu"]


def why_no_gpu() -> str:
    """Why CuPy gives no usable GPU here, in a few words."""
    try:
        cupy = device.import_cupy()
    except ImportError:
        return "CuPy is not installed (pip install -e \".[gpu]\" on a machine with an NVIDIA GPU)"
    try:
        n = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:  # noqa: BLE001 - CUDA's reason, whatever its type (no driver, no device)
        text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        return f"CuPy {cupy.__version__} finds no GPU ({text})"
    return f"CuPy {cupy.__version__} finds no usable GPU ({n} device(s) reported, none answers)"


def require_device(command: str, dtype: str | None = None) -> str:
    """The device `command` will run on ("cpu" or "cuda"); UsageError (one line) when the GPU was
    asked for by name and none is usable, or when `dtype` is bf16 on a GPU below sm_80."""
    want = os.environ.get("XTRAIN_DEVICE", "auto") or "auto"
    if want not in device.DEVICES:
        raise UsageError(f"XTRAIN_DEVICE={want!r}: choose one of cpu, cuda, auto")
    if want == "cuda" and not device.gpu_available():
        raise UsageError(f"--device cuda (or XTRAIN_DEVICE=cuda) asks for the GPU, but {why_no_gpu()}; nothing "
                         f"was done: run `xtrain {command}` with --device cpu, or --device auto for the GPU only "
                         f"where there is one")
    where = device.get_device()
    if where == "cuda" and dtype == "bf16":
        cupy = device.import_cupy()
        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
        why = bf16_refusal(name, int(props["major"]), int(props["minor"]))
        if why:
            raise UsageError(f"--dtype {why}")
    return where
