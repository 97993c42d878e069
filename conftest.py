"""Repository-wide pytest setup: nbval options that must not depend on the working directory,
and a marker per phase (`pytest -m t05`) from tests/phase_map.py."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "tests"))
from phase_map import PHASES, phases_of_test  # noqa: E402


def pytest_configure(config):
    opt = config.option
    if getattr(opt, "nbval", False) and not getattr(opt, "nbval_sanitize_with", None):
        opt.nbval_sanitize_with = str(Path(__file__).parent / "tests" / "nbval_sanitize.cfg")
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
