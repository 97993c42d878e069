"""Every exercise's check rejects plausible wrong solutions (mutation test of the check cells).

For each solution notebook with a `tests/mutants/<stem>.py`, the notebook's code cells run in
order in one namespace. At each exercise cell, every mutant listed for that exercise replaces
the solution region (in a copy of the namespace), the cells up to and including the exercise's
check cell run, and the check must print `❌ <id> ...: fail` naming the exercise. The stub the
learner starts from must print `⏳ not yet`, and the solution itself `✅ pass`. The check code
is the notebook's own: what the learner runs is what is tested.

A mutants file holds `MUTANTS = {"T05.1": {"what the mistake is": mutant, ...}, ...}` where a
mutant is the text that replaces the solution region (indentation is added), a function that
replaces the function the region sits in, or a pair (mutant, text the fail line must contain).
`AWAITING_CHECK_FIX = {"T12.2": ["mutant name"]}` lists mutants a check lets through while a
change to it is pending; the test asserts they still pass, so the entry goes once it is fixed.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MUTANTS_DIR = REPO / "tests" / "mutants"
_BEGIN = re.compile(r"^(?P<indent>[ \t]*)(?:#|//) BEGIN SOLUTION (?P<id>T\d\d\w*\.\d+)\s+(?P<name>.+?)\s*$")
_END = re.compile(r"^[ \t]*(?:#|//) END SOLUTION\s*$")
_DEF = re.compile(r"^[ \t]*def (\w+)\(")


def load_module(stem: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(f"mutants_{stem}", MUTANTS_DIR / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_mutants(stem: str) -> dict:
    return getattr(load_module(stem), "MUTANTS", {})


def awaiting_fix(stem: str) -> dict:
    """{exercise id: [mutant names]} a check does not catch yet (a change to it is pending)."""
    return getattr(load_module(stem), "AWAITING_CHECK_FIX", {})


def mutant_stems() -> list[str]:
    return sorted(p.stem for p in MUTANTS_DIR.glob("T*.py") if (REPO / "solutions" / f"{p.stem}.ipynb").exists())


def code_cells(stem: str) -> list[str]:
    nb = json.loads((REPO / "solutions" / f"{stem}.ipynb").read_text())
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


def regions(source: str) -> dict[str, tuple[int, int, str, str]]:
    """{exercise id: (BEGIN line, END line, indent, name)} for one cell."""
    found, lines = {}, source.split("\n")
    for i, line in enumerate(lines):
        m = _BEGIN.match(line)
        if m:
            end = next(j for j in range(i + 1, len(lines)) if _END.match(lines[j]))
            found[m["id"]] = (i, end, m["indent"], m["name"])
    return found


def substitute(source: str, ex_id: str, body: str) -> str:
    begin, end, indent, _ = regions(source)[ex_id]
    lines = source.split("\n")
    new = textwrap.indent(textwrap.dedent(body).strip("\n"), indent).split("\n")
    return "\n".join(lines[:begin + 1] + new + lines[end:])


def enclosing_function(source: str, ex_id: str) -> str:
    begin = regions(source)[ex_id][0]
    lines = source.split("\n")
    return next(_DEF.match(lines[i])[1] for i in range(begin, -1, -1) if _DEF.match(lines[i]))


def run_cell(source: str, ns: dict, where: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, where, "exec"), ns)
    return out.getvalue()


def check_cell(cells: list[str], start: int, ex_id: str) -> int:
    call = re.compile(r'check(?:_fn|_composed)?\(\s*"' + re.escape(ex_id) + r'\b')
    return next(j for j in range(start, len(cells)) if call.search(cells[j]))


def run_variant(cells, i, j, source, ns, stem, replace_fn=None) -> str:
    """Run cell i as `source` and the cells after it up to j in a copy of ns; return the output."""
    trial = dict(ns)
    before, after = source, ""
    if replace_fn is not None:  # the check may sit in the same cell, after the function
        end = next(n.end_lineno for n in ast.parse(source).body
                   if isinstance(n, ast.FunctionDef) and n.name == replace_fn[0])
        lines = source.split("\n")
        before, after = "\n".join(lines[:end]), "\n" * end + "\n".join(lines[end:])
    out = run_cell(before, trial, f"<{stem} cell {i}>")
    if replace_fn is not None:
        name, fn = replace_fn
        # the notebook's names first, then the mutant module's own helpers
        scope = {**{k: v for k, v in fn.__globals__.items() if not k.startswith("__")}, **trial}
        trial[name] = types.FunctionType(fn.__code__, scope, name, fn.__defaults__, fn.__closure__)
        out += run_cell(after, trial, f"<{stem} cell {i}>")
    for k in range(i + 1, j + 1):
        out += run_cell(cells[k], trial, f"<{stem} cell {k}>")
    return out


def verdicts(output: str, ex_id: str) -> list[str]:
    return [ln for ln in output.splitlines() if re.match(r"^\S+ " + re.escape(ex_id) + r"\b", ln)]


def _named(name: str, line: str) -> bool:
    return name.replace("_", " ") in line.replace("_", " ")


def mutate_notebook(stem: str) -> list[str]:
    """Run the notebook's mutants; return one line per problem (empty: all rejected)."""
    mutants, cells, problems = load_mutants(stem), code_cells(stem), []
    pending = {(ex, what) for ex, names in awaiting_fix(stem).items() for what in names}
    ns = {"__name__": "__main__"}
    last = max((i for i, c in enumerate(cells) for e in regions(c) if e in mutants), default=-1)
    for i, cell in enumerate(cells[:last + 1]):
        for ex_id, (_, _, _, name) in regions(cell).items():
            j = check_cell(cells, i, ex_id)
            variants = {"(the solution)": None, "(the learner's stub)": "raise NotImplementedError('stub')"}
            if "//" in cell.split("BEGIN SOLUTION " + ex_id)[0].rsplit("\n", 1)[-1]:
                variants["(the learner's stub)"] = f"/* EXERCISE {ex_id} {name}: your code here */"
            variants.update(mutants.get(ex_id, {}))
            for what, mutant in variants.items():
                mutant, must_say = mutant if isinstance(mutant, tuple) else (mutant, "")
                if callable(mutant):
                    source, replace = cell, (enclosing_function(cell, ex_id), mutant)
                else:
                    source, replace = (cell if mutant is None else substitute(cell, ex_id, mutant)), None
                try:  # mutants' kernels run sanitized: a guardless one is reported, not a segfault
                    os.environ["XTRAIN_SANITIZE"] = "1"
                    lines = verdicts(run_variant(cells, i, j, source, ns, stem, replace), ex_id)
                except Exception as exc:  # a check cell must never crash
                    problems.append(f"{ex_id} {what}: the check cell raised {type(exc).__name__}: {exc}")
                    continue
                finally:
                    os.environ.pop("XTRAIN_SANITIZE", None)
                if os.environ.get("MUTANTS_VERBOSE"):
                    print(f"{ex_id} {what}: {lines}")
                want = {"(the solution)": "✅", "(the learner's stub)": "⏳"}.get(what, "❌")
                if (ex_id, what) in pending:  # expected to slip through until its check is fixed
                    want = "✅"
                if not lines or not any(ln.startswith(want) for ln in lines):
                    problems.append(f"{ex_id} {what}: expected {want}, the check said {lines}")
                elif want == "❌" and not any(_named(name, ln) and must_say in ln for ln in lines if ln.startswith("❌")):
                    problems.append(f"{ex_id} {what}: the fail line does not name {name!r} / {must_say!r}: {lines}")
        run_cell(cell, ns, f"<{stem} cell {i}>")
    return problems


def count_mutants() -> dict[str, int]:
    return {f"{stem} {ex}": len(m) for stem in mutant_stems() for ex, m in load_mutants(stem).items()}


def test_every_exercise_has_three_mutants():
    counts = {ex: n for ex, n in count_mutants().items()}
    exercises = [f"{p.stem} {ex}" for p in sorted((REPO / "solutions").glob("T*.ipynb"))
                 for c in code_cells(p.stem) for ex in regions(c)]
    short = [f"{ex}: {counts.get(ex, 0)}" for ex in exercises if counts.get(ex, 0) < 3]
    assert not short, "exercises with fewer than 3 mutants in tests/mutants/: " + ", ".join(short)


@pytest.mark.slow
@pytest.mark.parametrize("stem", mutant_stems())
def test_checks_reject_every_mutant(stem):
    # one process per notebook: a kernel mutant without its bounds guard writes past a buffer,
    # which may bring down the process that ran it (as it would a learner's Jupyter kernel)
    res = subprocess.run([sys.executable, __file__, stem], capture_output=True, text=True, timeout=600,
                         cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]


def main(stems: list[str]) -> int:
    """python tests/test_mutants.py [STEM...]: each notebook in its own process; print the counts."""
    if len(stems) != 1:
        runs = [subprocess.run([sys.executable, __file__, s], cwd=REPO) for s in stems or mutant_stems()]
        return int(any(r.returncode for r in runs))
    os.environ.setdefault("MPLBACKEND", "Agg")  # this process only: nbval's kernels keep inline plots
    problems = mutate_notebook(stems[0])
    mutants = load_mutants(stems[0])
    print(f"{stems[0]}: {len(mutants)} exercises, {sum(map(len, mutants.values()))} mutants, "
          f"{len(problems)} problems", flush=True)
    for p in problems:
        print("   ", p)
    return int(bool(problems))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
