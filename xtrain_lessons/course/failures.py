"""What a failed exercise check says (used by course/checks.py): where the learner's code raised,
what a NumPy floating-point error means in the words of the exercise texts, the arguments of the
case that failed, and which input arrays a function changed in place.
"""

from __future__ import annotations

import inspect
import linecache
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np


def is_tensor(x: Any) -> bool:
    """An autograd Tensor (anything with .data and .grad that is not an array)."""
    return not isinstance(x, (np.ndarray, type)) and hasattr(x, "data") and hasattr(x, "grad")


PACKAGE = str(Path(__file__).resolve().parents[1])
LIBRARIES = tuple({sys.prefix, sys.base_prefix, sys.exec_prefix, "<frozen"})


def where(exc: BaseException) -> str:
    """Where the learner's code raised: the innermost frame outside the package and the libraries."""
    found, tb = None, exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not filename.startswith(LIBRARIES) and not filename.startswith(PACKAGE):
            found = tb
        tb = tb.tb_next
    if found is None:
        return ""
    code = found.tb_frame.f_code
    line = linecache.getline(code.co_filename, found.tb_lineno).strip()
    fn = f"in {code.co_name}(), " if not code.co_name.startswith("<") else ""
    return f" (raised {fn}line {found.tb_lineno} of its cell" + (f": `{line}`)" if line else ")")


def fp_advice(exc: BaseException) -> str:
    """What NumPy's floating-point error means, in the words of the exercise texts."""
    msg = str(exc)
    if "invalid value" in msg:
        return ("a 0/0, ∞ − ∞ or 0·∞ gave NaN: the text asks for a formula that stays finite "
                "(NumPy warnings are errors here)")
    if "divide by zero" in msg:
        return "a division by zero (or log 0): the text asks for a formula that stays finite " \
               "(NumPy warnings are errors here)"
    return "the text asks for a formula that cannot overflow (NumPy warnings are errors here)"


def describe(value: Any) -> str:
    """A short description of an argument: dtype and shape of an array, the value of a number."""
    try:
        return _describe(value)
    except Exception:  # an odd object: its type is enough
        return type(value).__name__


def _describe(value: Any) -> str:
    if isinstance(value, type):
        return value.__name__
    if is_tensor(value):
        return f"Tensor {describe(value.data)}"
    if hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, np.generic):
        return f"{value.dtype} {tuple(value.shape)}"
    if isinstance(value, (bool, int, float, complex, np.generic)) or value is None:
        return repr(value.item() if isinstance(value, np.generic) else value)
    if isinstance(value, str):
        return repr(value if len(value) <= 24 else value[:21] + "...")
    if isinstance(value, (list, tuple)):
        first = f" ({describe(value[0])}, ...)" if value else ""
        return f"{type(value).__name__} of {len(value)}{first}"
    return type(value).__name__


def bound(fn: Callable, args: tuple, kwargs: dict) -> list[tuple[str, Any]]:
    """(parameter name, value) of a call, by fn's signature (positions when it has none)."""
    try:
        return list(inspect.signature(fn).bind(*args, **kwargs).arguments.items())
    except (TypeError, ValueError):
        return [(f"argument {i}", a) for i, a in enumerate(args)] + list(kwargs.items())


def arguments(fn: Callable, args: tuple, kwargs: dict) -> str:
    text = ", ".join(f"{k}: {describe(v)}" for k, v in bound(fn, args, kwargs))
    return text if len(text) <= 240 else text[:237] + "..."


def arrays_in(value: Any, path: str, depth: int = 0):
    """(path, array) of every writable NumPy array in value: itself, a Tensor's data, the items
    of a list, tuple or dict (two levels deep)."""
    if isinstance(value, np.ndarray):
        if value.flags.writeable and value.dtype != object:
            yield path, value
    elif is_tensor(value):
        yield from arrays_in(value.data, f"{path}.data", depth)
    elif depth < 2 and isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            yield from arrays_in(v, f"{path}[{i}]", depth + 1)
    elif depth < 2 and isinstance(value, dict):
        for k, v in value.items():
            yield from arrays_in(v, f"{path}[{k!r}]", depth + 1)


def snapshot(fn: Callable, args: tuple, kwargs: dict) -> list[tuple[str, np.ndarray, np.ndarray]]:
    return [(path, a, a.copy()) for name, v in bound(fn, args, kwargs) for path, a in arrays_in(v, name)]


def restore(snapshot) -> list[str]:
    """Put every array of the snapshot back; return the paths of those that had changed."""
    changed = []
    for path, a, saved in snapshot:
        if a.tobytes() != saved.tobytes():
            changed.append(path)
            np.copyto(a, saved)
    return changed
