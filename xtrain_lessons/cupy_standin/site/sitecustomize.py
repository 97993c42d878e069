"""Run by Python at start-up when this folder is on PYTHONPATH: with XTRAIN_FAKE_CUPY=1, `import cupy`
gives the CPU stand-in for CuPy (xtrain_lessons/cupy_standin). This is how processes a test
or a notebook starts — the ranks of `xtrain launch`, a notebook's kernel, a command — take the GPU
path without a GPU (`cupy_standin.subprocess_env()` sets both)."""

import os

if os.environ.get("XTRAIN_FAKE_CUPY") == "1":
    from xtrain_lessons import cupy_standin

    cupy_standin.install()
