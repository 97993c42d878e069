"""The phase map (tests/phase_map.py) names every test file, package module and notebook that
exists, and CONTRIBUTING.md shows it as it is."""

from pathlib import Path

from phase_map import PHASES, markdown_table

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "xtrain_lessons"


def test_every_test_file_belongs_to_a_phase():
    mapped = {t for _, _, tests in PHASES.values() for t in tests}
    files = {p.name for p in (REPO / "tests").glob("test_*.py")}
    assert files - mapped == set(), "add these test files to tests/phase_map.py"
    assert mapped - files == set(), "tests/phase_map.py names test files that do not exist"


def test_every_module_belongs_to_a_phase():
    mapped = {m for _, modules, _ in PHASES.values() for m in modules}
    for m in mapped:
        assert (PACKAGE / m).exists(), f"tests/phase_map.py names {m}, which does not exist"
    folders = tuple(m for m in mapped if m.endswith("/"))  # a folder entry maps everything in it
    modules = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if p.name != "__init__.py"}
    unmapped = {m for m in modules - mapped if not m.startswith(folders)}
    assert unmapped == set(), "add these modules to a phase in tests/phase_map.py"


def test_every_phase_has_its_notebooks():
    for phase, (topic, _, _) in PHASES.items():
        for folder in ("solutions", "notebooks"):
            assert (REPO / folder / f"{phase}_{topic}.ipynb").is_file(), f"{folder}/{phase}_{topic}.ipynb"


def test_contributing_shows_the_map():
    assert markdown_table() in (REPO / "CONTRIBUTING.md").read_text(encoding="utf-8"), \
        "CONTRIBUTING.md's phase table is stale: paste `python tests/phase_map.py` into it"
