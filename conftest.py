"""Repository-wide pytest setup: nbval options that must not depend on the working directory."""

from pathlib import Path


def pytest_configure(config):
    opt = config.option
    if getattr(opt, "nbval", False) and not getattr(opt, "nbval_sanitize_with", None):
        opt.nbval_sanitize_with = str(Path(__file__).parent / "tests" / "nbval_sanitize.cfg")
