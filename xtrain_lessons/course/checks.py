"""Exercise checks for the course notebooks.

Every exercise in a notebook is followed by a check cell. A check prints one line:

    ✅ T05.2 rmsnorm: pass (3 cases)
    ⏳ T05.2 rmsnorm: not yet — the exercise is not written yet
       using the reference version so the rest of the notebook can run
    ❌ T05.2 rmsnorm: fail — case 2: max |Δ| = 0.31 at index (1, 4) (got 0.52, expected 0.83)

`check_fn` compares a learner's function with a reference on a list of cases and returns
the function later cells should use: the learner's when it passes, the reference otherwise.
`check` runs any zero-argument test (plain asserts, `assert_close`, `require_solved`).
`check_composed` runs a test built from several exercises' functions and names the one that
differs; `widest_reduction` tells whether a function reduced more values at once than a chunk.

A notebook's own claims (what its Measure section computes) go through `claim`: it prints the
statement when it holds and raises `ClaimFailed` with the measured figures when it does not, so a
claim is never stored as a printed `False`:

    claim("accumulation as close to the float64 run as one big batch", d_acc <= 2 * d_one,
          f"{d_acc:.2e} vs {d_one:.2e}")
"""

from __future__ import annotations

import contextlib
import re
import warnings
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from xtrain_lessons.runtime import device
from xtrain_lessons.runtime.cuda import SANITIZER_HINT, KernelError

PASS, NOT_YET, FAIL = "pass", "not yet", "fail"
_ICONS = {PASS: "✅", NOT_YET: "⏳", FAIL: "❌"}

# The stub `xtrain notebooks build` writes into CUDA C source (see notebooks.py).
CUDA_STUB_PATTERN = re.compile(r"/\* EXERCISE (\S+) ([^:]*): your code here")


class NotYet(Exception):
    """Raised by a test when the exercise it checks has not been attempted."""


class Mismatch(AssertionError):
    """Raised by `assert_close` with a message that names the first mismatch."""


class ClaimFailed(AssertionError):
    """Raised by `claim` when a notebook's computed claim does not hold."""


# Kernel results that are NaN or garbage: the usual causes, most frequent first.
KERNEL_HINT = ("a kernel result that is wrong or NaN usually comes from, in order: a missing bounds "
               "guard (a thread past the end reads or writes out of range), a missing __syncthreads() "
               "barrier, a wrong index; " + SANITIZER_HINT)
_in_kernel_test = False  # set by require_solved while a check runs: the test launches a kernel
_checking = False  # True while `check` runs a test
# What a check prints when the emulator's sanitizer stopped a kernel (checks run kernels sanitized).
SANITIZER_REPORT_HINT = ("the sanitizer stopped your kernel at its first bad access (above): guard every "
                         "read and write with the bounds it must stay in (i < n, row < M, col < N, k < K) "
                         "and put a __syncthreads() between writing shared memory and reading it")


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
    if isinstance(x, np.ndarray):  # (hasattr(bf16_array, "data") raises: no buffer for dtype 'E')
        return x
    if hasattr(x, "data") and hasattr(x, "grad"):
        x = x.data  # an autograd Tensor
    if hasattr(x, "get") and not isinstance(x, np.ndarray):
        x = x.get()  # a CuPy array
    return np.asarray(x)


def assert_close(actual: Any, expected: Any, atol: float | None = None,
                 rtol: float | None = None, what: str = "output",
                 names: Sequence[str] | None = None) -> None:
    """Assert two arrays (or nested tuples of arrays) agree; the error names the first mismatch.

    `names` labels the items of a tuple result ("dq", "dk", "dv") instead of output[0], output[1].
    A floating-point result must have the expected floating dtype (float64 is not float32).
    """
    if isinstance(expected, (tuple, list)) and not np.isscalar(expected) and \
            not isinstance(expected, np.ndarray):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            got = type(actual).__name__ + (f" of {len(actual)}" if hasattr(actual, "__len__") else "")
            raise Mismatch(f"{what}: expected a sequence of {len(expected)}, got {got}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, atol, rtol, what=names[i] if names else f"{what}[{i}]")
        return
    if actual is None:
        raise Mismatch(f"{what}: got None (did the function return its result?)")
    a, e = _as_array(actual), _as_array(expected)
    if a.shape != e.shape:
        raise Mismatch(f"{what}: shape {a.shape} ≠ expected {e.shape}")
    d_atol, d_rtol = default_tolerance(e.dtype if e.dtype.kind == "f" else a.dtype)
    atol = d_atol if atol is None else atol
    rtol = d_rtol if rtol is None else rtol
    if (e.dtype.kind in "iub" and a.dtype.kind not in "iub") or \
            (e.dtype.kind == "f" and a.dtype.kind == "f" and a.dtype != e.dtype):  # token ids as floats, float64 for float32
        raise Mismatch(f"{what}: dtype {a.dtype} ≠ expected {e.dtype}")
    a64, e64 = a.astype(np.float64), e.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # inf - inf in a wrong result is reported, not warned
        _report_mismatch(a64, e64, atol, rtol, what)


def _report_mismatch(a64: np.ndarray, e64: np.ndarray, atol: float, rtol: float, what: str) -> None:
    bad = ~np.isclose(a64, e64, atol=atol, rtol=rtol, equal_nan=True)
    if bad.any():
        err = np.where(bad, np.abs(a64 - e64), -np.inf)
        err = np.where(np.isnan(err), np.inf, err)
        idx = np.unravel_index(int(np.argmax(err)), a64.shape) if a64.ndim else ()
        where = f" at index {tuple(int(i) for i in idx)}" if a64.ndim else ""
        raise Mismatch(
            f"{what}: {int(bad.sum())} of {bad.size} values differ; max |Δ| = "
            f"{float(err[idx]):.3g}{where} (got {a64[idx]:.6g}, expected {e64[idx]:.6g}; "
            f"atol {atol:.1g}, rtol {rtol:.1g})"
        )


def claim(statement: str, holds: Any, figures: str = "") -> None:
    """Print `✔ statement` when `holds` is true; raise ClaimFailed naming the statement and
    `figures` (the measured numbers it rests on) when it is not. `figures` are shown only on a
    failure: a claim's printed line must not depend on the last bits of the machine's arithmetic."""
    if not bool(holds):
        raise ClaimFailed(f"claim does not hold: {statement}" + (f" ({figures})" if figures else ""))
    print(f"✔ {statement}")


# Every poisoned buffer of the check running now: (name, view, raw bytes, padding in bytes).
_poisoned: list[tuple[str, Any, Any, int]] = []
POISON_PAD = 4096  # elements of poison on each side (at least the array's own size)


def poisoned(x: Any, name: str = "an array") -> Any:
    """A copy of `x` inside a larger buffer whose bytes before and after it are 0xFF (NaN for floats,
    -1 or the largest value for integers), on x's device (NumPy or CuPy).

    A kernel that reads past either end of the returned array reads the poison, so its result is
    NaN (or wrong) every time, not only when the memory there happens not to be zero; a kernel
    that writes past either end overwrites the poison, which `check` finds after the test
    ("the kernel wrote past the end of c"). Pass it to the kernel in place of x:

        c = poisoned(xp.zeros(n, xp.float32), "c")
        kernel(grid, block, (poisoned(a, "a"), poisoned(b, "b"), c, np.int32(n)))
    """
    xp = device.array_module(x)
    x = xp.ascontiguousarray(x)
    pad = max(POISON_PAD, x.size) * x.itemsize
    raw = xp.empty(2 * pad + x.nbytes, dtype=xp.uint8)
    raw.fill(0xFF)
    view = raw[pad:pad + x.nbytes].view(x.dtype).reshape(x.shape)
    view[...] = x
    if _checking:  # outside a check nobody looks at the poison afterwards: keep nothing
        _poisoned.append((name, view, raw, pad))
    return view


def _check_poison() -> None:
    """Raise Mismatch when a kernel wrote into the poison around a `poisoned` array."""
    try:
        for name, view, raw, pad in _poisoned:
            hit = np.flatnonzero(device.to_host(raw != 0xFF))
            before, after = hit[hit < pad], hit[hit >= pad + view.nbytes]
            for side, offsets in (("past the end", after[:1]), ("before the start", before[-1:])):
                if offsets.size:
                    index = (int(offsets[0]) - pad) // view.itemsize
                    raise Mismatch(f"the kernel wrote {side} of {name} ({name}[{index}]; it has {view.size} "
                                   "elements): a bounds guard is missing")
    finally:
        _poisoned.clear()


def require_solved(source: str) -> None:
    """Raise NotYet when CUDA C source still holds an exercise stub."""
    global _in_kernel_test
    _in_kernel_test = True
    m = CUDA_STUB_PATTERN.search(source)
    if m:
        raise NotYet(f"{m.group(1)} {m.group(2)} is still a stub")


def check(name: str, test: Callable[[], Any]) -> bool:
    """Run a zero-argument test and print pass / not yet / fail. Returns True on pass."""
    global _in_kernel_test, _checking
    _in_kernel_test, _checking = False, True
    _poisoned.clear()
    try:
        try:
            detail = test()
            _check_poison()
        finally:
            _checking = False
            _poisoned.clear()
    except (NotImplementedError, NotYet) as exc:
        hint = str(exc) if isinstance(exc, NotYet) else ""
        _report(name, NOT_YET, hint or "the exercise is not written yet")
        return False
    except AssertionError as exc:
        hint = f"\n   {KERNEL_HINT}" if _in_kernel_test else ""
        _report(name, FAIL, (str(exc) or "an assertion failed") + hint)
        return False
    except FloatingPointError as exc:
        _report(name, FAIL, f"{exc} — the text asks for a formula that cannot overflow")
        return False
    except KernelError as exc:  # the sanitizer's report (or a deadlock, a barrier divergence)
        _report(name, FAIL, f"{exc}\n   {SANITIZER_REPORT_HINT}")
        return False
    except Exception as exc:  # the learner's code crashed: say where, keep going
        _report(name, FAIL, f"{type(exc).__name__}: {exc}")
        return False
    _report(name, PASS, detail if isinstance(detail, str) else "")
    return True


@contextlib.contextmanager
def _floating_point_errors(strict: bool):
    """With strict, NumPy's overflow / invalid / divide warnings raise instead of printing."""
    if not strict:
        yield
        return
    with np.errstate(over="raise", invalid="raise", divide="raise", under="ignore"), \
            warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        yield


class Case:
    """A named case of `check_fn`: its arguments, a label saying what it probes, and the hint a
    failure on it prints. For the numerically careful exercises, one case per careless formula:

        Case(big_logits, label="logits ~1000", hint="subtract the row maximum before exp")
    """

    def __init__(self, *args: Any, label: str, hint: str = "", **kwargs: Any):
        self.args, self.kwargs, self.label, self.hint = args, kwargs, label, hint

    def __repr__(self) -> str:
        return f"Case({self.label!r})"


def _case_parts(case: Any, i: int) -> tuple[tuple, dict, str, str]:
    """(args, kwargs, how a message names the case, hint) of a tuple, dict or Case."""
    if isinstance(case, Case):
        return case.args, case.kwargs, f"case {i} ({case.label})", case.hint
    args, kwargs = (case, {}) if isinstance(case, tuple) else ((), case)
    return args, kwargs, f"case {i}", ""


def check_fn(name: str, fn: Callable, reference: Callable, cases: Iterable[Any],
             atol: float | None = None, rtol: float | None = None,
             names: Sequence[str] | None = None, strict: bool = False) -> Callable:
    """Compare `fn` with `reference` on each case; return the function later cells should use.

    A case is a tuple of positional arguments, a dict of keyword arguments, or a `Case` (named,
    with a hint printed when it fails). `names` labels the items of a tuple result; `strict`
    runs `fn` with NumPy's floating-point warnings as errors, for exercises whose text asks for
    a formula that never overflows.
    """
    cases = list(cases)

    def test() -> str:
        for i, case in enumerate(cases, start=1):
            args, kwargs, which, hint = _case_parts(case, i)
            hint = f" — {hint}" if hint else ""
            expected = reference(*args, **kwargs)
            try:
                with _floating_point_errors(strict):
                    got = fn(*args, **kwargs)
            except (NotImplementedError, NotYet):
                raise
            except (FloatingPointError, RuntimeWarning) as exc:
                raise AssertionError(f"{which}: {exc} — the text asks for a formula that "
                                     "cannot overflow (NumPy warnings are errors here)" + hint) from exc
            except Exception as exc:
                raise AssertionError(f"{which}: {type(exc).__name__}: {exc}{hint}") from exc
            try:
                assert_close(got, expected, atol, rtol, names=names)
            except Mismatch as exc:
                raise Mismatch(f"{which}: {exc}{hint}") from None
        return f"{len(cases)} case{'s' if len(cases) != 1 else ''}"

    if check(name, test):
        return fn
    print("   using the reference version so the rest of the notebook can run")
    return reference


def check_composed(name: str, test: Callable[[], Any], references: dict[str, Callable],
                   namespace: dict[str, Any]) -> bool:
    """Check a test built from several exercises' functions, found by name in `namespace`.

    `references` maps each piece's name to its reference. When every piece in use is the
    reference the result says "not yet"; on a failure each of your pieces is tried alone among
    the references, and the first that makes the test fail is named.
    """
    yours = [k for k, ref in references.items() if namespace.get(k) is not ref]
    if not yours:
        _report(name, NOT_YET, "built from the reference pieces (no exercise above is solved yet)")
        return False
    in_use = {k: namespace[k] for k in references}

    def with_pieces(pieces: dict[str, Callable]) -> Any:
        saved = {k: namespace[k] for k in pieces}
        namespace.update(pieces)
        try:
            return test()
        finally:
            namespace.update(saved)

    def composed() -> str:
        try:
            with_pieces(in_use)
        except AssertionError as exc:
            for k in yours:
                try:
                    with_pieces({**references, k: in_use[k]})
                except AssertionError as alone:
                    raise AssertionError(f"your {k} differs: {alone}") from None
            raise AssertionError(f"your pieces together differ: {exc}") from None
        ref_names = [k for k in references if k not in yours]
        return f"yours: {', '.join(yours)}" + (f"; reference: {', '.join(ref_names)}" if ref_names else "")

    return check(name, composed)


class _ReductionWatch(np.ndarray):
    """An array that records the widest reduction over its last axis (see widest_reduction)."""

    widest = [0]

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        plain = [np.asarray(x) if isinstance(x, _ReductionWatch) else x for x in inputs]
        if "out" in kwargs:
            kwargs["out"] = tuple(np.asarray(o) if isinstance(o, _ReductionWatch) else o
                                  for o in kwargs["out"])
        if method == "reduce":
            a, axis = plain[0], kwargs.get("axis", 0)
            axes = range(a.ndim) if axis is None else np.atleast_1d(axis)
            if a.ndim and any(int(ax) % a.ndim == a.ndim - 1 for ax in axes):
                self.widest[0] = max(self.widest[0], a.shape[-1])
        result = getattr(ufunc, method)(*plain, **kwargs)
        if isinstance(result, np.ndarray) and method != "reduce":
            return result.view(_ReductionWatch)
        return result


def widest_reduction(fn: Callable, x: np.ndarray, *args: Any) -> int:
    """Run fn(x, *args); return the most values of x's last axis any max / sum reduced at once.

    A streamed (online) computation over chunks of c values reduces at most c at a time.
    """
    _ReductionWatch.widest[0] = 0
    fn(np.asarray(x).view(_ReductionWatch), *args)
    return _ReductionWatch.widest[0]
