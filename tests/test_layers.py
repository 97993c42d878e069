"""The package's layers: every import points down a layer (or within one), and none forms a cycle.

The order is written once, in LAYERS. A module's layer is its top-level folder under
xtrain_lessons/. Imports are read with `ast`, from the module top and from inside functions.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = "xtrain_lessons"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# rank of each layer: a module may import from layers of a lower rank, and within its own
# layer; siblings of equal rank (interop, measure, course) may not import each other
LAYERS = {"runtime": 0, "autograd": 1, "model": 2, "parallel": 3, "training": 4,
          "interop": 5, "measure": 5, "course": 5, "cli": 6}


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(source: str, name: str, is_package: bool) -> set[str]:
    """The package modules `source` (module `name`) imports, as dotted names."""
    found = set()
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == PACKAGE}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod.split(".")[0] != PACKAGE:
                continue
            found.add(mod)
            found |= {f"{mod}.{a.name}" for a in node.names}  # `from pkg import module`
    return found


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the package modules it imports (only names that are modules of the tree)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    graph = {}
    for name, path in files.items():
        deps = imported_modules(path.read_text(encoding="utf-8"), name, path.name == "__init__.py")
        deps = {d for d in deps if d in files and d != name}
        # `from pkg import module` also runs pkg/__init__; keep the module, the more specific edge
        graph[name] = {d for d in deps if not any(e.startswith(d + ".") for e in deps)}
    return graph


def layer_of(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for mod, deps in sorted(graph.items()):
        src = layer_of(mod)
        if src is None:
            continue
        for dep in sorted(deps):
            dst = layer_of(dep)
            if dst is None or dst == src:
                continue
            if dst not in LAYERS or src not in LAYERS:
                bad.append(f"{mod} -> {dep}: layer {dst if dst not in LAYERS else src!r} is not in LAYERS")
            elif LAYERS[dst] >= LAYERS[src]:
                bad.append(f"{mod} ({src}) imports {dep} ({dst}): not a layer below")
    return bad


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as [a, b, ..., a], or None (iterative depth-first search)."""
    state = {}
    for start in sorted(graph):
        if state.get(start):
            continue
        stack, path = [(start, iter(sorted(graph[start])))], [start]
        state[start] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
                path.pop()
            elif state.get(child) == 1:
                return path[path.index(child):] + [child]
            elif not state.get(child):
                state[child] = 1
                stack.append((child, iter(sorted(graph.get(child, ())))))
                path.append(child)
    return None


def test_every_import_points_down_a_layer():
    assert upward_imports(import_graph(ROOT)) == []


def test_no_import_cycle():
    cycle = find_cycle(import_graph(ROOT))
    assert cycle is None, " -> ".join(cycle)


def test_every_module_sits_in_a_layer_folder():
    loose = [p.name for p in ROOT.glob("*.py") if p.name != "__init__.py"]
    assert loose == [], f"modules outside the layer folders: {loose}"
    assert {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()} == set(LAYERS)


@pytest.fixture
def fake_package(tmp_path):
    """A throwaway tree named like the package, to show the checks fail when they should."""
    def make(files: dict[str, str]) -> Path:
        root = tmp_path / PACKAGE
        for rel, text in files.items():
            p = root / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(text)
        return root
    return make


def test_the_checks_catch_an_upward_import(fake_package):
    root = fake_package({"__init__.py": "", "runtime/__init__.py": "", "model/__init__.py": "",
                         "runtime/device.py": "from xtrain_lessons.model import qwen3\n",
                         "model/qwen3.py": "x = 1\n"})
    assert upward_imports(import_graph(root)) == [
        "xtrain_lessons.runtime.device (runtime) imports xtrain_lessons.model.qwen3 (model): not a layer below"]


def test_the_checks_catch_a_cycle_even_in_function_bodies(fake_package):
    root = fake_package({"__init__.py": "", "model/__init__.py": "",
                         "model/a.py": "from xtrain_lessons.model.b import f\n",
                         "model/b.py": "def f():\n    from .a import g  # a lazy import is still an edge\n"})
    assert find_cycle(import_graph(root)) == ["xtrain_lessons.model.a", "xtrain_lessons.model.b",
                                              "xtrain_lessons.model.a"]
    assert upward_imports(import_graph(root)) == []  # same layer: allowed, but the cycle is not


def test_the_checks_catch_siblings_importing_each_other(fake_package):
    root = fake_package({"__init__.py": "", "measure/__init__.py": "", "course/__init__.py": "",
                         "measure/bench.py": "from xtrain_lessons.course import checks\n",
                         "course/checks.py": ""})
    assert len(upward_imports(import_graph(root))) == 1
