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


def pytest_configure(config):
    opt = config.option
    if getattr(opt, "nbval", False) and not getattr(opt, "nbval_sanitize_with", None):
        opt.nbval_sanitize_with = str(ROOT / "tests" / "nbval_sanitize.cfg")
    for phase in PHASES:
        config.addinivalue_line("markers", f"{phase.lower()}: the tests and notebooks of phase {phase}")


def pytest_collection_modifyitems(config, items):
    for item in items:
        path = Path(str(item.fspath))
        if path.suffix == ".ipynb":  # a notebook's cells belong to its phase
            phases = [p for p in PHASES if path.name.startswith(p + "_")]
        else:
            phases = phases_of_test(path.name)
        for phase in phases:
            item.add_marker(getattr(pytest.mark, phase.lower()))


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
