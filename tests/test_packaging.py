"""The project's own files: dependency lists agree, README commands and links are real."""

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# conda-forge names that differ from the PyPI ones; conda-only build tools are not compared.
CONDA_TO_PIP = {"pytorch": "torch"}
CONDA_ONLY = {"python", "pip", "cxx-compiler"}


def _name_and_bound(requirement: str) -> tuple[str, str]:
    """(name, version bound) of a requirement; an environment marker (`; platform_...`) is dropped."""
    m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", requirement.split(";")[0].strip())
    name = m.group(1).lower().replace("_", "-")
    return name, m.group(2).replace(" ", "")


def pip_requirements() -> dict[str, str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    reqs = project["dependencies"] + project["optional-dependencies"]["dev"]
    return dict(_name_and_bound(r) for r in reqs)


def conda_requirements() -> dict[str, str]:
    out = {}
    for line in (REPO / "environment.yml").read_text().splitlines():
        m = re.match(r"^\s+-\s+([^#\s][^#]*?)\s*$", line)
        if not m or ":" in m.group(1) or m.group(1) == "conda-forge":
            continue
        name, bound = _name_and_bound(m.group(1))
        if name in CONDA_ONLY:
            continue
        out[CONDA_TO_PIP.get(name, name)] = bound
    return out


def test_environment_yml_matches_pyproject():
    pip, conda = pip_requirements(), conda_requirements()
    assert set(pip) == set(conda), (
        f"only in pyproject: {sorted(set(pip) - set(conda))}; "
        f"only in environment.yml: {sorted(set(conda) - set(pip))}")
    for name in pip:
        assert pip[name] == conda[name], f"{name}: pyproject says {pip[name]!r}, environment.yml {conda[name]!r}"


def test_only_lower_bounds_in_runtime_dependencies():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for req in project["dependencies"]:
        assert "==" not in req and "<" not in req, f"runtime dependency pinned or capped: {req}"


def _readme_command(which):
    spec = importlib.util.spec_from_file_location("readme_command", REPO / ".ci" / "readme_command.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.readme_command(which)


def test_readme_has_two_one_line_commands():
    assert _readme_command("main").startswith("pip install -e .")
    test_command = _readme_command("test")
    assert "torch==2.13.0" in test_command and "bash scripts/run_tests.sh" in test_command
    assert "scripts/run_tests.py" in (REPO / "scripts" / "run_tests.sh").read_text()


def _run_tests_module():
    spec = importlib.util.spec_from_file_location("run_tests", REPO / "scripts" / "run_tests.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["run_tests"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_the_shards_cover_the_whole_suite_once():
    """Every test and notebook runs in exactly one shard (the NumPy-BLAS pass aside): the shards'
    marker expressions split tests/ without a gap or an overlap."""
    rt = _run_tests_module()
    names = [s.name for s in rt.SHARDS]
    assert {"solution notebooks", "learner notebooks", "mutants", "book"} <= set(names)
    on_tests = [s.args[s.args.index("-m") + 1] for s in rt.SHARDS if "-m" in s.args and not s.env]
    kinds = [{"standin"}, {"mutants"}, {"book"}, set()]  # the marker sets a test may carry
    for carried in kinds:
        chosen = [expr for expr in on_tests if eval(expr, {}, {m: m in carried for m in ("standin", "mutants", "book")})]
        assert len(chosen) == 1, f"a test marked {carried or 'nothing'} is run by {len(chosen)} shards: {chosen}"
    numpy_pass = next(s for s in rt.SHARDS if s.env.get("XTRAIN_BLAS") == "numpy")
    assert numpy_pass.env["XTRAIN_THREADS"] == "1" and "not blas_free" in numpy_pass.args[-1]


@pytest.mark.parametrize("statuses", [(0, 0, 0), (1, 0, 0), (0, 0, 1), (0, 5, 0)])
def test_the_test_script_fails_when_any_shard_fails(monkeypatch, capsys, statuses):
    """scripts/run_tests.py runs its shards at once: it must wait for all and fail if any did
    (a shard that collected nothing, pytest's status 5, is a failure too)."""
    rt = _run_tests_module()
    shards = [rt.Shard(f"shard {i}", [str(code)], seconds=i) for i, code in enumerate(statuses)]
    monkeypatch.setattr(rt, "command", lambda shard, extra: [sys.executable, "-c",
                                                              f"import sys, time; time.sleep(0.2); sys.exit({shard.args[0]})"])
    assert rt.run_all(shards, [], jobs=2) == int(any(statuses))
    out = capsys.readouterr().out
    assert all(f"shard {i}" in out for i in range(len(statuses)))


def test_ci_runs_the_readme_test_command():
    ci = (REPO / ".ci" / "run").read_text()
    assert "readme_command.py test" in ci


def test_readme_links_every_notebook_and_nothing_missing():
    readme = (REPO / "README.md").read_text()
    links = set(re.findall(r"\]\(((?:notebooks|solutions)/[^)]+\.ipynb)\)", readme))
    for link in links:
        assert (REPO / link).exists(), f"README links a notebook that does not exist: {link}"
    for folder in ("notebooks", "solutions"):
        for nb in (REPO / folder).glob("T*.ipynb"):
            assert f"{folder}/{nb.name}" in links, f"README does not link {folder}/{nb.name}"


def test_book_toc_lists_every_solution():
    toc = (REPO / "book" / "_toc.yml").read_text()
    for nb in (REPO / "solutions").glob("T*.ipynb"):
        assert f"solutions/{nb.stem}" in toc, f"book/_toc.yml does not list solutions/{nb.stem}"


def test_python_version_supported():
    assert sys.version_info >= (3, 10)


def test_every_module_the_package_imports_at_its_top_is_a_runtime_dependency():
    """`pip install -e .` must be enough for `xtrain train`: a third-party import at the top of a
    package module needs its distribution in [project] dependencies (the dev extras would hide it
    from the tests: `regex` came in through transformers)."""
    import ast  # noqa: PLC0415

    deps = {_name_and_bound(r)[0] for r in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]}
    dist_of = {"yaml": "pyyaml"}  # import name -> distribution, where they differ
    missing = set()
    for path in (REPO / "xtrain_lessons").rglob("*.py"):
        for node in ast.parse(path.read_text()).body:  # module level only: lazy imports are optional ones
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top in ("xtrain_lessons", "__future__"):
                    continue
                if dist_of.get(top, top).lower().replace("_", "-") not in deps:
                    missing.add(f"{top} ({path.relative_to(REPO)})")
    assert not missing, f"imported at module level but not in [project] dependencies: {sorted(missing)}"
