"""Exercise checks for the course notebooks.

Every exercise in a notebook is followed by a check cell. A check prints one line:

    ✅ T05.2 rmsnorm: pass (3 cases)
    ⏳ T05.2 rmsnorm: not yet — the exercise is not written yet
       using the reference version so the rest of the notebook can run
    ❌ T05.2 rmsnorm: fail — case 2: max |Δ| = 0.31 at index (1, 4) (got 0.52, expected 0.83)

`check_fn` compares a learner's function with a reference on a list of cases and returns
the function later cells should use: the learner's when it passes, the reference otherwise.
`check` runs any zero-argument test (plain asserts, `assert_close`, `require_solved`).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Iterable

import numpy as np

PASS, NOT_YET, FAIL = "pass", "not yet", "fail"
_ICONS = {PASS: "✅", NOT_YET: "⏳", FAIL: "❌"}

# The stub `xtrain notebooks build` writes into CUDA C source (see notebooks.py).
CUDA_STUB_PATTERN = re.compile(r"/\* EXERCISE (\S+) ([^:]*): your code here")


class NotYet(Exception):
    """Raised by a test when the exercise it checks has not been attempted."""


class Mismatch(AssertionError):
    """Raised by `assert_close` with a message that names the first mismatch."""


def _report(name: str, status: str, detail: str = "") -> None:
    line = f"{_ICONS[status]} {name}: {status}"
    if detail:
        line += f" — {detail}" if status != PASS else f" ({detail})"
    print(line)


def default_tolerance(dtype: Any) -> tuple[float, float]:
    """(atol, rtol) for comparing results of a given dtype: a few ulps of the format."""
    dtype = np.dtype(dtype)
    if dtype.kind in "iub":
        return 0.0, 0.0
    eps = float(np.finfo(dtype).eps) if dtype.kind == "f" else 1e-7
    if dtype.itemsize <= 2:  # float16 / bfloat16-like
        return 1e-2, 1e-2
    return 10 * eps ** 0.75, 100 * eps  # float32: ~6e-6, 1.2e-5; float64: ~2e-12, 2e-14


def _as_array(x: Any) -> np.ndarray:
    if hasattr(x, "data") and not isinstance(x, np.ndarray) and hasattr(x, "grad"):
        x = x.data  # an autograd Tensor
    if hasattr(x, "get") and not isinstance(x, np.ndarray):
        x = x.get()  # a CuPy array
    return np.asarray(x)


def assert_close(actual: Any, expected: Any, atol: float | None = None,
                 rtol: float | None = None, what: str = "output") -> None:
    """Assert two arrays (or nested tuples of arrays) agree; the error names the first mismatch."""
    if isinstance(expected, (tuple, list)) and not np.isscalar(expected) and \
            not isinstance(expected, np.ndarray):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            got = type(actual).__name__ + (f" of {len(actual)}" if hasattr(actual, "__len__") else "")
            raise Mismatch(f"{what}: expected a sequence of {len(expected)}, got {got}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, atol, rtol, what=f"{what}[{i}]")
        return
    if actual is None:
        raise Mismatch(f"{what}: got None (did the function return its result?)")
    a, e = _as_array(actual), _as_array(expected)
    if a.shape != e.shape:
        raise Mismatch(f"{what}: shape {a.shape} ≠ expected {e.shape}")
    d_atol, d_rtol = default_tolerance(e.dtype if e.dtype.kind == "f" else a.dtype)
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    if e.dtype.kind in "iub" and a.dtype.kind not in "iub":  # e.g. token ids returned as floats
        raise Mismatch(f"{what}: dtype {a.dtype} ≠ expected {e.dtype}")
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    bad = ~np.isclose(a64, e64, atol=atol, rtol=rtol, equal_nan=True)
    if bad.any():
        err = np.where(bad, np.abs(a64 - e64), -np.inf)
        err = np.where(np.isnan(err), np.inf, err)
        idx = np.unravel_index(int(np.argmax(err)), a.shape) if a.ndim else ()
        where = f" at index {tuple(int(i) for i in idx)}" if a.ndim else ""
        raise Mismatch(
            f"{what}: {int(bad.sum())} of {bad.size} values differ; max |Δ| = "
            f"{float(err[idx]):.3g}{where} (got {a64[idx]:.6g}, expected {e64[idx]:.6g}; "
            f"atol {atol:.1g}, rtol {rtol:.1g})"
        )


def require_solved(source: str) -> None:
    """Raise NotYet when CUDA C source still holds an exercise stub."""
    m = CUDA_STUB_PATTERN.search(source)
    if m:
        raise NotYet(f"{m.group(1)} {m.group(2)} is still a stub")


def check(name: str, test: Callable[[], Any]) -> bool:
    """Run a zero-argument test and print pass / not yet / fail. Returns True on pass."""
    try:
        detail = test()
    except (NotImplementedError, NotYet) as exc:
        hint = str(exc) if isinstance(exc, NotYet) else ""
        _report(name, NOT_YET, hint or "the exercise is not written yet")
        return False
    except AssertionError as exc:
        _report(name, FAIL, str(exc) or "an assertion failed")
        return False
    except Exception as exc:  # the learner's code crashed: say where, keep going
        _report(name, FAIL, f"{type(exc).__name__}: {exc}")
        return False
    _report(name, PASS, detail if isinstance(detail, str) else "")
    return True


def check_fn(name: str, fn: Callable, reference: Callable, cases: Iterable[Any],
             atol: float | None = None, rtol: float | None = None) -> Callable:
    """Compare `fn` with `reference` on each case; return the function later cells should use.

    A case is a tuple of positional arguments or a dict of keyword arguments.
    """
    cases = list(cases)

    def test() -> str:
        for i, case in enumerate(cases, start=1):
            args, kwargs = (case, {}) if isinstance(case, tuple) else ((), case)
            expected = reference(*args, **kwargs)
            try:
                got = fn(*args, **kwargs)
            except (NotImplementedError, NotYet):
                raise
            except Exception as exc:
                raise AssertionError(f"case {i}: {type(exc).__name__}: {exc}") from exc
            try:
                assert_close(got, expected, atol, rtol)
            except Mismatch as exc:
                raise Mismatch(f"case {i}: {exc}") from None
        return f"{len(cases)} case{'s' if len(cases) != 1 else ''}"

    if check(name, test):
        return fn
    print("   using the reference version so the rest of the notebook can run")
    return reference
