"""Optional dependencies of the notebooks: one line, not a traceback, when one is missing.

    torch = require("torch", "the parity cells below")

torch and transformers are oracles the notebooks compare against; a learner who installed
without the `course` extra gets one line saying what to install instead of a traceback.
"""

from __future__ import annotations

import importlib
from types import ModuleType

INSTALL = 'pip install -e ".[course]"'


class MissingDependency(ImportError):
    """An optional package a notebook needs; Jupyter shows only its one-line message."""

    def _render_traceback_(self) -> list[str]:  # IPython uses this instead of a traceback
        return [f"⛔ {self}"]


def require(module: str, why: str) -> ModuleType:
    """Import `module`, or raise MissingDependency naming what needs it and how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        top = module.split(".")[0]
        raise MissingDependency(f"{top} is not installed (needed by {why}): {INSTALL} "
                                f"installs it (or pip install {top})") from None
