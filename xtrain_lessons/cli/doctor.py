"""Check this machine for the course: prints OK / MISSING / FAIL per component, with a fix.

Exit code 0 when everything the CPU course needs is present (Python, NumPy, the runtime
libraries, a C++20 compiler and the CUDA emulator). nvcc, a GPU with CuPy, torch,
transformers and Jupyter are reported too; they are optional for running the package, and
torch, transformers and Jupyter come with the dev extras the notebooks and tests use.
"""

from __future__ import annotations

import argparse

from xtrain_lessons.course.doctor import report, run_checks


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """No options: `xtrain doctor` checks everything."""


def run(args: argparse.Namespace) -> int:
    return report(run_checks())
