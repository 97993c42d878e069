"""Repository-wide pytest setup: nbval options that must not depend on the working directory,
a marker per phase (`pytest -m t05`) from tests/phase_map.py, and the other BLAS for the
learner notebooks.

The two copies of every notebook run under two BLAS libraries: `solutions/` with the engine's
default (MKL when the `fast` extra is installed), `notebooks/` with NumPy's own
(XTRAIN_BLAS=numpy, set in the environment the notebook's kernel starts with). Both are compared
with their stored outputs, so a printed figure or a claim that depends on the BLAS's last bits
fails here, on one machine, instead of on the next CI machine's CPU.
"""

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))
from phase_map import PHASES, phases_of_test  # noqa: E402

ROOT = Path(__file__).parent
LEARNER_ENV = {"XTRAIN_BLAS": "numpy"}  # what the kernels of notebooks/ start with
_saved_env = {k: os.environ.get(k) for k in LEARNER_ENV}


# Test modules that call no BLAS: the NumPy-BLAS pass of scripts/run_tests.py leaves them out
# (marker `blas_free`): compilers, the tokenizer, file formats, the repository's own consistency,
# and the CUDA kernels alone on the emulator (its threads are XTRAIN_EMULATOR_WORKERS, not
# XTRAIN_THREADS; their references use NumPy whatever XTRAIN_BLAS says).
BLAS_FREE = {"test_nvcc_compile.py", "test_nvrtc_compile.py", "test_bpe.py", "test_tokenizer.py", "test_doctor.py",
             "test_packaging.py", "test_layers.py", "test_phase_map.py", "test_notebook_pipeline.py",
             "test_notebook_outputs.py", "test_data_fetch.py", "test_corpus.py", "test_device_refusal.py",
             "test_gpu_lease.py", "test_cublas_direct.py", "test_cuda_emulator.py", "test_emulator_features.py",
             "test_emulator_sanitizer.py", "test_kernels_bf16.py", "test_kernels_t02.py",
             "test_standin_references.py",
             # the CUDA path on the stand-in: its products are NumPy's matmul whichever BLAS the CPU engine uses
             "test_cuda_graph.py", "test_gpu_engine.py"}
# The quick loop between edits (`python -m pytest -m quick`, about a minute): every layer of the
# package once, and one notebook. The full command in the README stays the gate.
QUICK = {"test_layers.py", "test_device.py", "test_cuda_emulator.py", "test_autograd.py", "test_model_parity.py",
         "test_accumulation.py", "test_train.py", "test_export_hf.py", "test_eval.py", "test_course.py",
         "test_cli.py", "test_phase_map.py", "T00_welcome.ipynb"}


def pytest_configure(config):
    opt = config.option
    if getattr(opt, "nbval", False) and not getattr(opt, "nbval_sanitize_with", None):
        opt.nbval_sanitize_with = str(ROOT / "tests" / "nbval_sanitize.cfg")
    for phase in PHASES:
        config.addinivalue_line("markers", f"{phase.lower()}: the tests and notebooks of phase {phase}")


def _kind_markers(path: Path, item) -> list[str]:
    """The markers scripts/run_tests.py cuts the suite by (see pyproject's list)."""
    name = path.name
    marks = ["blas_free"] if name in BLAS_FREE else []
    if name.startswith("test_book"):
        marks += ["book", "blas_free"]
    if name == "test_mutants.py" and item.name.startswith("test_checks_reject_every_mutant"):
        marks.append("mutants")
    if name in QUICK and path.parent.name in ("tests", "solutions"):
        marks.append("quick")
    return marks


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if path.suffix == ".ipynb":  # a notebook's cells belong to its phase
            phases = [p for p in PHASES if path.name.startswith(p + "_")]
        else:
            phases = phases_of_test(path.name)
        for mark in [p.lower() for p in phases] + _kind_markers(path, item):
            item.add_marker(getattr(pytest.mark, mark))


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before nbval starts a notebook's kernel (in the setup of its first cell): the learner
    notebooks get LEARNER_ENV, everything else the environment pytest started with."""
    path = Path(str(item.fspath))
    learner = path.suffix == ".ipynb" and path.parent.name == "notebooks"
    for key, value in LEARNER_ENV.items():
        original = _saved_env[key]
        if learner:
            os.environ[key] = value
        elif original is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = original
