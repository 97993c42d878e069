"""The op table: every op of the op set with the kernel beneath it on each device (phase T07).

Each op of `runtime/opset` registers itself here with `@op(...)`: its family, the CPU kernel
(C++ on the engine's worker pool, or a BLAS call), the GPU kernel (CUDA C through CuPy, or a
cuBLAS call), the NumPy reference (what runs where no compiled kernel applies: float64, a
non-contiguous layout, no C++ compiler, XTRAIN_FUSED=0) and the test that holds the kernels to
the reference. `markdown()` prints the table CONTRIBUTING.md and T07 show (a test checks that
CONTRIBUTING's copy is this one, and that every file and kernel named here exists).

    from xtrain_lessons.runtime.opset import table
    table.OPS["rmsnorm_fwd"].gpu         # "kernels/rmsnorm.cu: rmsnorm_fwd"
    print(table.markdown())
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Op", "OPS", "op", "markdown"]


@dataclass(frozen=True)
class Op:
    name: str
    family: str
    cpu: str         # "file: kernel" under runtime/ (or a library call)
    gpu: str
    reference: str   # "file: function" under runtime/
    test: str        # the test file under tests/


OPS: dict[str, Op] = {}


def op(family: str, cpu: str, gpu: str, reference: str, test: str):
    """Register the decorated function as op `fn.__name__` of the op set (it is returned as it is:
    the registration costs nothing per call)."""
    def register(fn):
        OPS[fn.__name__] = Op(fn.__name__, family, cpu, gpu, reference, test)
        return fn
    return register


def markdown() -> str:
    """The op table as a Markdown table, in registration order (family by family)."""
    rows = ["| op | CPU kernel | GPU kernel | reference | test |", "|---|---|---|---|---|"]
    rows += [f"| `{o.name}` | {o.cpu} | {o.gpu} | {o.reference} | `{o.test}` |" for o in OPS.values()]
    return "\n".join(rows)
