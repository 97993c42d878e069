"""What the course's text points to exists, and the figures it quotes are the ones its code holds.

- every phase named anywhere (README, CONTRIBUTING, the book, the notebooks, the package) is a row
  of the phase table (`course/phases.py`), every exercise named (T05.8) is one in that phase's
  notebook, and every section cited ("T07 §2", or "§3" inside a notebook) is a numbered heading
  ("### 2. ...") of that notebook;
- a figure a notebook's prose quotes with a unit (ms, µs, GB, %, x, device calls ...) is one its
  code writes or its stored outputs print, so a re-run that changes the number shows the prose is
  stale (approximations — "about", "~", "up to", ranges — and the Goal cell's facts of the
  reference engine are citations, not measurements);
- the README's GPU figures are the recorded run's (`course/gpu_runs.py`);
- nothing points outside the repository (the course map is `book/course_map.md`).
"""

import json
import re
from functools import lru_cache
from pathlib import Path

from xtrain_lessons.course import gpu_runs, phases

REPO = Path(__file__).resolve().parents[1]

PHASE = re.compile(r"(?<![\w/.\-])T\d\d[a-z]?(?![\w])")
EXERCISE = re.compile(r"(?<![\w/.\-])(T\d\d[a-z]?)\.(\d+)(?![\d])")
SECTION = re.compile(r"(?:(?<![\w/.\-])(T\d\d[a-z]?)(?:'s)?\s+)?§\s?(\d+)")
HEADING = re.compile(r"^#{2,4}\s+(\d+)\.\s", re.M)


def _notebook_texts(path: Path, with_code: bool = True) -> list[str]:
    nb = json.loads(path.read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if with_code or c["cell_type"] == "markdown"]


def course_texts() -> dict[str, str]:
    """{where: text} of everything a reader or a contributor reads."""
    out = {name: (REPO / name).read_text(encoding="utf-8") for name in ("README.md", "CONTRIBUTING.md", "pyproject.toml")}
    for p in sorted((REPO / "book").glob("*.md")):
        out[str(p.relative_to(REPO))] = p.read_text(encoding="utf-8")
    for folder in ("solutions", "notebooks"):
        for p in sorted((REPO / folder).glob("T*.ipynb")):
            out[f"{folder}/{p.name}"] = "\n".join(_notebook_texts(p))
    for p in sorted((REPO / "xtrain_lessons").rglob("*.py")):
        out[str(p.relative_to(REPO))] = p.read_text(encoding="utf-8")
    return out


@lru_cache(maxsize=None)
def _solution(phase: str) -> Path:
    return REPO / "solutions" / f"{phases.BY_ID[phase].notebook}.ipynb"


@lru_cache(maxsize=None)
def sections(phase: str) -> set[int]:
    """The numbered headings of a phase's notebook ("### 2. The matmuls on BLAS" is §2)."""
    return {int(n) for text in _notebook_texts(_solution(phase), with_code=False) for n in HEADING.findall(text)}


@lru_cache(maxsize=None)
def exercises(phase: str) -> set[int]:
    text = "\n".join(_notebook_texts(_solution(phase)))
    return {int(n) for n in re.findall(rf"(?:BEGIN SOLUTION|Exercise) {re.escape(phase)}\.(\d+)\b", text)}


def _line(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def test_every_phase_and_exercise_named_exists():
    known = {p.id for p in phases.TABLE}
    bad = []
    for where, text in course_texts().items():
        for m in PHASE.finditer(text):
            if m.group(0) not in known:
                bad.append(f"{where}:{_line(text, m.start())}: {m.group(0)} is not a phase of course/phases.py")
        for m in EXERCISE.finditer(text):
            phase, n = m.group(1), int(m.group(2))
            if phase in known and n not in exercises(phase):
                bad.append(f"{where}:{_line(text, m.start())}: {m.group(0)}: {phase}'s notebook has no exercise {phase}.{n}")
    assert not bad, "\n".join(bad)


def test_every_section_cited_exists():
    known = {p.id for p in phases.TABLE}
    bad, cited = [], 0
    for where, text in course_texts().items():
        own = re.match(r"(?:solutions|notebooks)/(T\d\d[a-z]?)_", where)
        for m in SECTION.finditer(text):
            phase = m.group(1) or (own and own.group(1))
            if phase is None:
                bad.append(f"{where}:{_line(text, m.start())}: '{m.group(0)}' names no phase (write 'Txx §n')")
            elif phase not in known:
                continue  # reported by the test above
            elif int(m.group(2)) not in sections(phase):
                bad.append(f"{where}:{_line(text, m.start())}: '{m.group(0)}': {phase} has sections "
                           f"{sorted(sections(phase))}, no {m.group(2)}")
            cited += 1
    assert cited > 10, "no section reference found: is the pattern still right?"
    assert not bad, "\n".join(bad)


# ---- quoted figures -------------------------------------------------------------------------------

UNIT = r"(?:device calls|calls|ms|µs|tok/s|tokens/s|[GTM]FLOP/s|[GT]B/s|GB|MB|MiB|KiB|kB|%|x\b|×)"
FIGURE = re.compile(r"(?<![\w.$\\^_{/])(\d[\d,]*(?:\.\d+)?)\s?" + UNIT)
APPROXIMATE = re.compile(r"(?:~|≈|about|around|roughly|nearly|up to|under|over|at most|at least|[–-])\s*$")


def _holds(haystack: str, number: str) -> bool:
    forms = {number, number.replace(",", ""), number.replace(",", "_")}
    return any(re.search(rf"(?<![\d.]){re.escape(f)}(?!\d)", haystack) for f in forms)


def quoted_figures_not_computed(path: Path) -> list[str]:
    """The figures of a notebook's prose that neither its code nor its stored outputs hold."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    phase = path.name.split("_")[0]
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    haystack = "\n".join(["".join(c["source"]) for c in code]
                         + ["".join(o.get("text", "")) + "".join(o.get("data", {}).get("text/plain", ""))
                            + "".join(o.get("data", {}).get("text/markdown", "")) for c in code for o in c.get("outputs", [])]
                         + [phases.BY_ID[phase].reference])
    missing = []
    for i, cell in enumerate(nb["cells"]):
        if cell["cell_type"] != "markdown" or i == 0:  # cell 0: the Goal, citing the reference engine
            continue
        text = "".join(cell["source"])
        for m in FIGURE.finditer(text):
            if APPROXIMATE.search(text[max(0, m.start() - 12):m.start()]):
                continue
            if not _holds(haystack, m.group(1).rstrip(".")):
                missing.append(f"{path.name} cell {i}: '{m.group(0)}'")
    return missing


def test_quoted_figures_are_ones_the_notebook_computes():
    missing = [f for p in sorted((REPO / "solutions").glob("T*.ipynb")) for f in quoted_figures_not_computed(p)]
    assert not missing, ("prose quotes figures that no code or stored output of its notebook holds — stale, or "
                         "typed: print them from the cell that computes them\n" + "\n".join(missing))


def test_a_stale_figure_is_caught(tmp_path):
    """The check above on a notebook whose prose quotes the count the code printed, then another."""
    cells = [{"cell_type": "markdown", "source": "# goal", "metadata": {}},
             {"cell_type": "code", "source": "print(n)", "metadata": {}, "execution_count": 1,
              "outputs": [{"output_type": "stream", "name": "stdout", "text": "338 device calls\n"}]},
             {"cell_type": "markdown", "source": "The step makes 338 device calls, about 300 µs.", "metadata": {}}]
    nb = tmp_path / "T07_performance.ipynb"
    nb.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert quoted_figures_not_computed(nb) == []
    cells[2]["source"] = "The step makes 326 device calls."
    nb.write_text(json.dumps({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))
    assert quoted_figures_not_computed(nb) == ["T07_performance.ipynb cell 2: '326 device calls'"]


def test_the_readme_quotes_the_recorded_gpu_run():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    rows = {"tiny": "tiny 16 x 128", "20m": "20m 32 x 512", "GPT-2-small": "gpt2-small 8 x 1024"}
    for label, shape in rows.items():
        row = re.search(rf"^\s*\| {re.escape(label)}, .*$", readme, re.M)
        assert row, f"the README's GPU table has no {label} row"
        cells = [c for c in row.group(0).split("|") if c.strip()]
        for dtype, cell in zip(("float32", "bf16"), cells[1:3]):
            quoted = tuple(float(x) for x in re.findall(r"\d+\.\d+", cell.split("(")[0]))
            assert quoted == gpu_runs.GRAPH_RUN[f"{shape} {dtype}"], \
                f"README's {label} {dtype}: {quoted}, course/gpu_runs.py: {gpu_runs.GRAPH_RUN[f'{shape} {dtype}']}"
    graph32, graph16 = gpu_runs.speedups("float32", 1), gpu_runs.speedups("bf16", 1)
    sentence = (f"{graph32['tiny 16 x 128']:.2f}x torch eager at the tiny shape in float32, "
                f"{graph16['20m 32 x 512']:.2f}x / {graph16['gpt2-small 8 x 1024']:.2f}x torch autocast")
    assert sentence in " ".join(readme.split()), f"the README should say: {sentence}"


def test_the_readme_quotes_the_strong_baselines_run():
    flat = " ".join((REPO / "README.md").read_text(encoding="utf-8").replace("`", "").split())
    sentence = gpu_runs.strong_sentence()
    assert sentence in flat, f"the README should say: {sentence}"


def test_the_course_map_heads_the_gpu_column_with_the_recorded_run():
    assert phases.GPU_STATUS == gpu_runs.gpu_status()
    assert phases.GPU_STATUS in (REPO / "book" / "course_map.md").read_text(encoding="utf-8")
    tiny32 = gpu_runs.speedups("float32", 1)["tiny 16 x 128"]
    assert f"{tiny32:.2f}x" in phases.GPU_STATUS


def test_nothing_points_outside_the_repository():
    outside = re.compile(r"\.\./shared|shared/(?:COURSE|STYLE)\.md|shared/seeds")
    bad = [f"{where}:{_line(text, m.start())}: {m.group(0)}" for where, text in course_texts().items()
           for m in outside.finditer(text)]
    assert not bad, "the repository must stand alone (the course map is book/course_map.md):\n" + "\n".join(bad)
