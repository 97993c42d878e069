"""The op set's table (runtime/opset/table.py): CONTRIBUTING.md shows it as the code has it, every
kernel, reference and test it names exists, and every op it lists is an op of the set."""

import re
from pathlib import Path

from xtrain_lessons.runtime import opset
from xtrain_lessons.runtime.opset import table

REPO = Path(__file__).resolve().parents[1]
RUNTIME = REPO / "xtrain_lessons" / "runtime"


def named_kernels(cell: str):
    """(file under runtime/, name) for each "file: name[, name]" of a table cell ("a → b", "a + b")."""
    for part in re.split(r" → | \+ ", cell):
        if re.match(r"^[\w/]+\.(py|cu|cpp): ", part):
            path, names = part.split(": ", 1)
            for name in names.split(", "):
                yield path, name.split()[0]


def test_contributing_shows_the_op_table():
    assert table.markdown() in (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8"), \
        "CONTRIBUTING.md's op table is stale: paste `python -c 'from xtrain_lessons.runtime import opset; print(opset.markdown())'`"


def test_every_kernel_reference_and_test_named_exists():
    missing = []
    for o in table.OPS.values():
        for cell in (o.cpu, o.gpu, o.reference):
            for path, name in named_kernels(cell):
                source = RUNTIME / path
                if not source.is_file() or not re.search(rf"\b{re.escape(name)}\b", source.read_text(encoding="utf-8")):
                    missing.append(f"{o.name}: {path}: {name}")
        missing += [f"{o.name}: tests/{t}" for t in o.test.split(", ") if not (REPO / "tests" / t).is_file()]
    assert missing == []


def test_every_op_in_the_table_is_an_op_of_the_set():
    assert set(table.OPS) <= set(opset.__all__)
    assert all(getattr(opset, name) is not None for name in table.OPS)
    assert {o.family for o in table.OPS.values()} == set(table.FAMILIES)


def test_the_parser_finds_the_kernels_of_a_cell():
    assert list(named_kernels("cpu_threads.py: matmuls → blas.py: gemm")) == [("cpu_threads.py", "matmuls"),
                                                                           ("blas.py", "gemm")]
    assert list(named_kernels("kernels/cross_entropy.cu: cross_entropy_fwd, mean_loss + cuBLAS")) == [
        ("kernels/cross_entropy.cu", "cross_entropy_fwd"), ("kernels/cross_entropy.cu", "mean_loss")]
    assert list(named_kernels("np.matmul")) == []
