"""Run by Python at start-up when this folder is on PYTHONPATH: with XTRAIN_FAKE_CUPY=1, `import cupy`
gives the tests' CPU stand-in for CuPy (tests/fake_cupy). This is how processes the tests start —
the ranks of `xtrain launch`, a notebook's kernel, a command — take the GPU path without a GPU
(`fake_cupy.subprocess_env()` sets both)."""

import os
import sys
from pathlib import Path

if os.environ.get("XTRAIN_FAKE_CUPY") == "1":
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/
    import fake_cupy

    fake_cupy.install()
