"""The notebook pipeline (the command line is `xtrain notebooks`, cli/notebooks.py):
`learner_version` turns a solution notebook into its learner version (each marked solution
region becomes a one-line stub; the stub of a CUDA C region still compiles), `build` writes the
stale ones (and the book's course map, generated from the phase table in phases.py),
`stale_notebooks` lists them, `execute` runs a notebook in place and saves its outputs (and, for
a solution notebook, records its run time in the phase table's run_times.json).
`solutions/TNN_<topic>.ipynb` is the one source of truth.
"""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

from xtrain_lessons.course import phases

REPO = Path(__file__).resolve().parents[2]
SOLUTIONS = REPO / "solutions"
NOTEBOOKS = REPO / "notebooks"

_BEGIN = re.compile(r"^(?P<indent>[ \t]*)(?P<comment>#|//) BEGIN SOLUTION (?P<id>T\d\d[a-z]?\.\d+)\s+(?P<name>.+?)\s*$")
_END = re.compile(r"^[ \t]*(?P<comment>#|//) END SOLUTION\s*$")


class NotebookError(ValueError):
    """A solution notebook whose solution markers are malformed."""


def _stub(indent: str, comment: str, ex_id: str, name: str, n_lines: int) -> str:
    about = f"about {n_lines} line{'s' if n_lines != 1 else ''}"
    if comment == "//":
        return f"{indent}/* EXERCISE {ex_id} {name}: your code here ({about}) */"
    return f'{indent}raise NotImplementedError("{ex_id} {name}")  # your code here ({about})'


def strip_source(source: str, where: str = "cell") -> tuple[str, list[str]]:
    """Replace each solution region in one cell's source; return (new source, exercise ids)."""
    out: list[str] = []
    found: list[str] = []
    lines = source.split("\n")
    i = 0
    while i < len(lines):
        m = _BEGIN.match(lines[i])
        if _END.match(lines[i]):
            raise NotebookError(f"{where}, line {i + 1}: END SOLUTION without BEGIN SOLUTION")
        if not m:
            out.append(lines[i])
            i += 1
            continue
        start = i
        i += 1
        while i < len(lines) and not _END.match(lines[i]):
            if _BEGIN.match(lines[i]):
                raise NotebookError(f"{where}, line {i + 1}: nested BEGIN SOLUTION")
            i += 1
        if i == len(lines):
            raise NotebookError(f"{where}, line {start + 1}: BEGIN SOLUTION {m['id']} has no END SOLUTION")
        if m["comment"] == "#" and not m["indent"]:
            raise NotebookError(
                f"{where}, line {start + 1}: solution region {m['id']} is at the top level of a cell; "
                "put it inside a function so the learner's stub does not stop the notebook")
        body = [ln for ln in lines[start + 1:i] if ln.strip()]
        out.append(_stub(m["indent"], m["comment"], m["id"], m["name"], len(body)))
        found.append(m["id"])
        i += 1  # skip END
    return "\n".join(out), found


KERNELSPEC = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}


def _normalise(nb) -> None:
    """Every notebook runs in the plain python3 kernel; authoring-tool metadata is dropped."""
    nb.metadata["kernelspec"] = dict(KERNELSPEC)
    nb.metadata.pop("jupytext", None)


def learner_version(solution_path: Path):
    """The learner notebook (an nbformat node, outputs cleared) generated from a solution."""
    import nbformat

    nb = nbformat.read(solution_path, as_version=4)
    _normalise(nb)
    seen: list[str] = []
    for n, cell in enumerate(nb.cells, start=1):
        if cell.cell_type != "code":
            continue
        cell.source, ids = strip_source(cell.source, where=f"{solution_path.name}, cell {n}")
        seen += ids
        cell.outputs = []
        cell.execution_count = None
    dupes = {x for x in seen if seen.count(x) > 1}
    if dupes:
        raise NotebookError(f"{solution_path.name}: exercise ids used twice: {sorted(dupes)}")
    return nb


def _sources(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source) for c in nb.cells]


def _write_atomic(nb, path: Path) -> None:
    import nbformat

    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        nbformat.write(nb, f)
    os.chmod(tmp, 0o644)  # mkstemp creates 0600; a notebook is an ordinary readable file
    os.replace(tmp, path)


def solution_paths(names: list[str] | None = None) -> list[Path]:
    # TNN_ and, for a phase inserted later between two others, TNNx_ (T05b sorts after T05_).
    paths = sorted(p for p in SOLUTIONS.glob("T*.ipynb") if re.match(r"T\d\d[a-z]?_", p.name))
    if names:
        paths = [p for p in paths if any(p.stem.startswith(n) or p.name == n for n in names)]
    return paths


def stale_notebooks() -> list[str]:
    """Names of learner notebooks that are missing or differ from their generated version."""
    import nbformat

    stale = []
    for sol in solution_paths():
        target = NOTEBOOKS / sol.name
        if not target.exists() or \
                _sources(nbformat.read(target, as_version=4)) != _sources(learner_version(sol)):
            stale.append(sol.name)
    return stale


def build(names: list[str] | None = None) -> list[Path]:
    """Regenerate learner notebooks; keep existing outputs when the sources did not change.
    The book's course map (book/course_map.md) is regenerated from the phase table too."""
    import nbformat

    phases.write_course_map()
    written = []
    for sol in solution_paths(names):
        nb = learner_version(sol)
        target = NOTEBOOKS / sol.name
        if target.exists() and _sources(nbformat.read(target, as_version=4)) == _sources(nb):
            continue
        _write_atomic(nb, target)
        written.append(target)
    return written


def execute(path: Path, timeout: int = 600) -> float:
    """Execute a notebook in its own folder and save it with fresh outputs; return seconds."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    _normalise(nb)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    seconds = time.perf_counter() - start
    for cell in nb.cells:  # drop per-run timestamps so re-runs diff cleanly
        cell.metadata.pop("execution", None)
    _write_atomic(nb, path)
    if path.resolve().parent == SOLUTIONS.resolve():  # the roadmap's minutes: measured, not typed
        phases.record_run_time(path.stem, seconds)
        phases.write_course_map()
    return seconds
