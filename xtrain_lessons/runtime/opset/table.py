"""The op table: every op of the op set with the kernel beneath it on each device (phase T07).

Each op of `runtime/opset` registers itself here with `@op(...)`: its family, the CPU kernel
(C++ on the engine's worker pool, or a BLAS call), the GPU kernel (CUDA C through CuPy, or a
cuBLAS call), the NumPy reference (what runs where no compiled kernel applies: float64, a
non-contiguous layout, no C++ compiler, XTRAIN_FUSED=0) and the test that holds the kernels to
the reference. `markdown()` prints the table CONTRIBUTING.md and T07 show (a test checks that
CONTRIBUTING's copy is this one, and that every file and kernel named here exists).

    from xtrain_lessons.runtime.opset import table
    table.OPS["rmsnorm_fwd"].gpu         # "kernels/rmsnorm.cu: rmsnorm_fwd" (a file under runtime/: a name in it)
    print(table.markdown())
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Op", "OPS", "FAMILIES", "op", "markdown"]


@dataclass(frozen=True)
class Op:
    name: str
    family: str
    cpu: str         # "file: kernel" under runtime/ (or a library call)
    gpu: str
    reference: str   # "file: function" under runtime/
    test: str        # the test file under tests/


OPS: dict[str, Op] = {}
FAMILIES = ("products", "rows", "attention", "classifier", "embedding", "optimizer", "casts", "dropout", "moves")


def op(family: str, cpu: str, gpu: str, reference: str, test: str):
    """Register the decorated function as op `fn.__name__` of the op set (it is returned as it is:
    the registration costs nothing per call)."""
    if family not in FAMILIES:
        raise ValueError(f"op family {family!r} is not one of {FAMILIES}")

    def register(fn):
        OPS[fn.__name__] = Op(fn.__name__, family, cpu, gpu, reference, test)
        return fn
    return register


def markdown() -> str:
    """The op table as a Markdown table, family by family (files under xtrain_lessons/runtime/)."""
    rows = ["| family | op | CPU kernel | GPU kernel | NumPy reference | tests (`tests/`) |", "|---|---|---|---|---|---|"]
    for o in sorted(OPS.values(), key=lambda o: FAMILIES.index(o.family)):  # stable: registration order within
        rows.append(f"| {o.family} | `{o.name}` | {o.cpu} | {o.gpu} | {o.reference} | {o.test} |")
    return "\n".join(rows)
