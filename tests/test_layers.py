"""The package's layers: every import points down a layer (or within one), and none forms a cycle;
autograd/, model/ and training/ reach the runtime only through the op set, the device and the
allocator, and ask no question about the device.

The order is written once, in LAYERS. A module's layer is its top-level folder under
xtrain_lessons/. Imports are read with `ast`, from the module top and from inside functions.
"""

import ast
from pathlib import Path

import pytest

PACKAGE = "xtrain_lessons"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

# rank of each layer: a module may import from layers of a lower rank, and within its own
# layer; siblings of equal rank (interop, measure, course) may not import each other. The CPU
# stand-in for CuPy (cupy_standin) sits beside the runtime it imitates; only measure/, course/ and
# cli/ may import it (test_only_the_tools_import_the_cupy_stand_in), and tests.
LAYERS = {"runtime": 0, "cupy_standin": 1, "autograd": 2, "model": 3, "parallel": 4, "training": 5,
          "interop": 6, "measure": 6, "course": 6, "cli": 7}
STANDIN_USERS = ("measure", "course", "cli")


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


def test_only_the_tools_import_the_cupy_stand_in():
    graph = import_graph(ROOT)
    users = {mod for mod, deps in graph.items() if any(layer_of(d) == "cupy_standin" for d in deps)}
    assert {m for m in users if layer_of(m) not in (*STANDIN_USERS, "cupy_standin")} == set()


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


# ---- the op set: autograd/, model/ and training/ are device-free ----------------------------------
# What the layers above runtime/ may import from it: the op set (every operation, its kernel chosen
# beneath it from the arrays' device), the device (moves, the array module, settings) and the array
# helpers (the engine's allocator). parallel/ is not held to this: its gloo-or-NCCL choice is a
# device choice by nature.
DEVICE_FREE = ("autograd", "model", "training")
RUNTIME_ALLOWED = {"xtrain_lessons.runtime.opset", "xtrain_lessons.runtime.device", "xtrain_lessons.runtime.allocator"}
# calls and names that ask which device or array module runs: the op set answers those
DEVICE_PROBES = {"on_gpu", "usable", "on_device", "attention_usable", "kernel_backend", "mkl_loaded", "gpu_available",
                 "get_xp", "import_cupy"}
DEVICE_FLAGS = {"use_kernels", "fused_back"}
# modules (by last name) whose device conditional another piece of work removes: each must still hold
# one (so that the entry goes with the fix)
AWAITING_FIX: dict[str, str] = {}  # (post-training's `host` became device.to_host: training/posttrain, issue 40)


def runtime_imports(source: str, name: str, is_package: bool) -> set[str]:
    """The runtime modules `source` imports outside RUNTIME_ALLOWED (anything inside the op set, the
    device or the allocator is theirs: `from runtime.opset import matmul`)."""
    mods = {m for m in imported_modules(source, name, is_package) if m.startswith(f"{PACKAGE}.runtime.")}
    return {m for m in mods if not any(m == a or m.startswith(a + ".") for a in RUNTIME_ALLOWED)}


def device_conditionals(source: str) -> list[str]:
    """Each `if`, conditional expression, `while` or `assert` whose test asks which device or array
    module runs, as "line: test"."""
    def asks(node) -> bool:
        if isinstance(node, ast.Call):
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
            if called in DEVICE_PROBES:
                return True
            if called == "isinstance" and len(node.args) == 2 and "ndarray" in ast.unparse(node.args[1]):
                return True
            if called == "hasattr" and len(node.args) == 2 and getattr(node.args[1], "value", None) == "get":
                return True
        if isinstance(node, ast.Name) and node.id in DEVICE_FLAGS:
            return True
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(isinstance(op, (ast.Is, ast.IsNot)) for op in node.ops) and \
                    any(isinstance(s, ast.Name) and s.id in ("np", "numpy", "xp", "cupy") for s in sides):
                return True  # xp is np
            if any(isinstance(s, ast.Constant) and s.value in ("cuda", "cpu", "gpu") for s in sides):
                return True  # device == "cuda"
        return False

    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.If, ast.IfExp, ast.While, ast.Assert)) and any(asks(n) for n in ast.walk(node.test)):
            found.append((node.lineno, f"{node.lineno}: {ast.unparse(node.test)}"))
    return [text for _, text in sorted(found)]


def _device_free_modules(root: Path):
    for layer in DEVICE_FREE:
        for path in sorted((root / layer).rglob("*.py")):
            yield module_name(path, root), path


def test_the_upper_layers_import_only_the_op_set_device_and_array_helpers():
    bad = {name: sorted(runtime_imports(path.read_text(encoding="utf-8"), name, path.name == "__init__.py"))
           for name, path in _device_free_modules(ROOT)}
    assert {k: v for k, v in bad.items() if v} == {}, "import these through runtime/opset (or runtime/device)"


def test_the_upper_layers_hold_no_device_conditional():
    found = {name: device_conditionals(path.read_text(encoding="utf-8")) for name, path in _device_free_modules(ROOT)}
    pending = {k for k in found if k.rsplit(".", 1)[-1] in AWAITING_FIX}
    assert {k: v for k, v in found.items() if v and k not in pending} == {}, "move the choice beneath an op of runtime/opset"
    assert all(found[k] for k in pending), f"fixed: remove {sorted(pending)} from AWAITING_FIX"


def test_the_op_set_checks_catch_a_device_branch_and_an_internal_import(fake_package):
    root = fake_package({"__init__.py": "", "runtime/__init__.py": "", "model/__init__.py": "",
                         "runtime/fused.py": "", "runtime/opset.py": "", "runtime/device.py": "",
                         "model/layers.py": ("from xtrain_lessons.runtime import fused, opset\n"
                                             "from xtrain_lessons.runtime.device import on_gpu\n"
                                             "def f(x, xp):\n"
                                             "    y = fused.add(x) if on_gpu(x) else x\n"
                                             "    if xp is np or device == 'cuda':\n"
                                             "        return y\n")})
    text = (root / "model/layers.py").read_text()
    assert runtime_imports(text, "xtrain_lessons.model.layers", False) == {"xtrain_lessons.runtime.fused"}
    assert device_conditionals(text) == ["4: on_gpu(x)", "5: xp is np or device == 'cuda'"]
