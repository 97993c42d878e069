"""Every exercise's check rejects plausible wrong solutions (mutation test of the check cells).

For each solution notebook with a `tests/mutants/<stem>.py`, the notebook's code cells run in
order in one namespace. At each exercise cell, every mutant listed for that exercise replaces
the solution region (in a copy of the namespace), the cells up to and including the exercise's
check cell run, and the check must print `❌ <id> ...: fail` naming the exercise. The stub the
learner starts from must print `⏳ not yet`, and the solution itself `✅ pass`. The check code
is the notebook's own: what the learner runs is what is tested.

Only the cells the checks need run: the exercise and check cells, and, going back from them, every
cell that binds a name they read or (for a name bound to data: an array, a model, an RNG, a path)
reads one they read too, since it may change it (`needed_cells`). A measurement that launches
processes or trains a model for a figure is left to nbval. MUTANTS_ALL_CELLS=1 runs every cell.

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
import symtable
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
_UNLABELLED = re.compile(r"— case \d+:")  # check_fn names a Case "case 2 (its label)"
# notebooks whose owner is still labelling their cases: reported, not failed (issue 37's T20 items
# landed with T21_grpo, GRPO's phase since post-training's renumbering, labelled: none pending)
LABELS_PENDING: set[str] = set()


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


def _module_level(node: ast.AST):
    """The nodes of a statement that run in the module's scope (not inside a function, lambda or
    comprehension; their decorators, defaults and first iterables do)."""
    yield node
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        inner = [*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d)]
    elif isinstance(node, ast.Lambda):
        inner = [*node.args.defaults, *(d for d in node.args.kw_defaults if d)]
    elif isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
        inner = [node.generators[0].iter]
    else:
        inner = list(ast.iter_child_nodes(node))
    for child in inner:
        yield from _module_level(child)


def _global_reads(table: symtable.SymbolTable) -> set[str]:
    """Names the nested scopes of a cell (functions, lambdas, comprehensions) read from the module."""
    out = set()
    for child in table.get_children():
        out |= {s.get_name() for s in child.get_symbols() if s.is_global() and s.is_referenced()}
        out |= _global_reads(child)
    return out


def cell_names(source: str) -> tuple[set[str], set[str], set[str], dict[str, set[str]]]:
    """(names a cell binds at module level, those of them bound to data rather than by an import, a
    def or a class, names it reads from the module: at module level before binding them, and from
    inside its functions, lambdas and comprehensions; and for each function or class it defines,
    the module names its body reads, which a call reads too)."""
    binds, data, reads, functions = set(), set(), set(), {}

    def read(*nodes):
        for node in nodes:
            reads.update({n.id for n in _module_level(node) if isinstance(n, ast.Name)
                          and isinstance(n.ctx, ast.Load)} - binds)

    def bind(*nodes, is_data=True):
        names = {n.id for node in nodes for n in _module_level(node) if isinstance(n, ast.Name)}
        binds.update(names)
        data.update(names if is_data else ())

    def visit(stmts):  # in the order they run: a loop's target is bound before its body reads it
        for stmt in stmts:
            if isinstance(stmt, (ast.For, ast.AsyncFor)):
                read(stmt.iter)
                bind(stmt.target)
                visit(stmt.body + stmt.orelse)
            elif isinstance(stmt, (ast.If, ast.While)):
                read(stmt.test)
                visit(stmt.body + stmt.orelse)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                read(*(i.context_expr for i in stmt.items))
                bind(*(i.optional_vars for i in stmt.items if i.optional_vars))
                visit(stmt.body)
            elif isinstance(stmt, ast.Try):
                visit(stmt.body)
                for handler in stmt.handlers:
                    read(*([handler.type] if handler.type else []))
                    binds.update([handler.name] if handler.name else [])
                    visit(handler.body)
                visit(stmt.orelse + stmt.finalbody)
            elif isinstance(stmt, (ast.Import, ast.ImportFrom)):
                binds.update((a.asname or a.name).split(".")[0] for a in stmt.names)
            elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                read(stmt)
                binds.add(stmt.name)
                inner = symtable.symtable(ast.unparse(stmt), "<def>", "exec")
                functions[stmt.name] = _global_reads(inner)
            else:
                read(stmt)
                bind(*(n for n in _module_level(stmt) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)))

    visit(ast.parse(source).body)
    return binds, data, reads | _global_reads(symtable.symtable(source, "<cell>", "exec")), functions


def mutant_reads(cell: str, ex_id: str, mutant) -> set[str]:
    """The names a mutant (a region's text or a function) reads from the notebook's module."""
    mutant = mutant[0] if isinstance(mutant, tuple) else mutant
    if callable(mutant):
        codes, names = [mutant.__code__], set()
        while codes:
            code = codes.pop()
            names |= set(code.co_names)
            codes += [c for c in code.co_consts if isinstance(c, types.CodeType)]
        return names
    try:
        return cell_names(substitute(cell, ex_id, mutant))[2]
    except SyntaxError:  # a region of CUDA C in a string: no Python names
        return set()


def needed_cells(cells: list[str], forced: set[int], reads_of: dict[int, set[str]]) -> set[int]:
    """The cells a run of the forced cells needs, found going backwards: a cell is needed when it
    binds a name a needed cell after it reads, or reads a data name one of them reads (it may
    change it: draw from an RNG, train a model, write into a folder). A cell reads what the
    functions it names read (a helper that draws from the notebook's RNG draws for it)."""
    info, data_before, data, functions = [], [], set(), {}
    for cell in cells:
        binds, bound_data, reads, defined = cell_names(cell)
        data_before.append(set(data))
        data |= bound_data
        functions.update(defined)
        info.append((binds, _through_calls(reads, functions)))
    need, wanted = set(), set()
    for k in range(len(cells) - 1, -1, -1):
        binds, reads = info[k]
        if k in forced or binds & wanted or reads & wanted & data_before[k]:
            need.add(k)
            wanted |= reads | _through_calls(reads_of.get(k, set()), functions)
    return need


def _through_calls(reads: set[str], functions: dict[str, set[str]]) -> set[str]:
    """reads, with what the functions among them read, and so on."""
    out, todo = set(reads), list(reads)
    while todo:
        for name in functions.get(todo.pop(), ()):
            if name not in out:
                out.add(name)
                todo.append(name)
    return out


def mutate_notebook(stem: str) -> list[str]:
    """Run the notebook's mutants; return one line per problem (empty: all rejected)."""
    mutants, cells, problems = load_mutants(stem), code_cells(stem), []
    pending = {(ex, what) for ex, names in awaiting_fix(stem).items() for what in names}
    ns = {"__name__": "__main__"}
    last = max((i for i, c in enumerate(cells) for e in regions(c) if e in mutants), default=-1)
    spans = {(i, check_cell(cells, i, ex)) for i in range(last + 1) for ex in regions(cells[i])}
    reads_of = {i: set().union(*(mutant_reads(cells[i], ex, m) for m in mutants.get(ex, {}).values()))
                for i in range(last + 1) for ex in regions(cells[i])}
    end = max((j for _, j in spans), default=-1)
    needed = set(range(end + 1)) if os.environ.get("MUTANTS_ALL_CELLS") else \
        needed_cells(cells[:end + 1], {k for i, j in spans for k in range(i, j + 1)}, reads_of)
    for i, cell in enumerate(cells[:last + 1]):
        if i not in needed:
            continue
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
                elif want == "❌" and any(_UNLABELLED.search(ln) for ln in lines) and stem not in LABELS_PENDING:
                    problems.append(f"{ex_id} {what}: the failing case has no label (use checks.Case): {lines}")
        run_cell(cell, ns, f"<{stem} cell {i}>")
    return problems


def count_mutants() -> dict[str, int]:
    return {f"{stem} {ex}": len(m) for stem in mutant_stems() for ex, m in load_mutants(stem).items()}


def test_labels_pending_names_notebooks_with_mutants():
    assert LABELS_PENDING <= set(mutant_stems()), f"LABELS_PENDING names {sorted(LABELS_PENDING - set(mutant_stems()))}"


def test_every_exercise_has_three_mutants():
    counts = {ex: n for ex, n in count_mutants().items()}
    exercises = [f"{p.stem} {ex}" for p in sorted((REPO / "solutions").glob("T*.ipynb"))
                 for c in code_cells(p.stem) for ex in regions(c)]
    short = [f"{ex}: {counts.get(ex, 0)}" for ex in exercises if counts.get(ex, 0) < 3]
    assert not short, "exercises with fewer than 3 mutants in tests/mutants/: " + ", ".join(short)


def test_only_the_cells_the_checks_need_run():
    cells = ["import numpy as np\nrng = np.random.default_rng(0)",              # binds what the check reads
             "x = rng.standard_normal(3)",                                      # draws from the check's rng
             "WORK = 'runs'\nslow = sum(range(10))\nprint(slow)",              # a measurement: nobody reads it
             "def f(a):\n    return a * 2",                                    # the exercise
             "def test():\n    y = rng.standard_normal(3)\n    assert (f(y) == 2 * y).all()\ntest()"]  # its check
    assert needed_cells(cells, {3, 4}, {}) == {0, 1, 3, 4}
    assert needed_cells(cells, {3, 4}, {3: {"WORK"}}) == {0, 1, 2, 3, 4}  # a mutant reads WORK
    assert cell_names("for W in range(3):\n    print(W)\ndef g(v):\n    return v + eps") == \
        ({"W", "g"}, {"W"}, {"range", "print", "eps"}, {"g": {"eps"}})
    helper = ["import numpy as np\nrng = np.random.default_rng(0)\ndef randn(n):\n    return rng.standard_normal(n)",
              "x = randn(3)",                                                    # draws through the helper
              "def f(a):\n    return a",
              "y = randn(2)\nassert (f(y) == y).all()"]
    assert needed_cells(helper, {2, 3}, {}) == {0, 1, 2, 3}


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
