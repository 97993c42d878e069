"""The Jupyter Book builds offline, warnings as errors, and shows T00 with its outputs."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_book_builds_offline_with_warnings_as_errors(tmp_path):
    jb = shutil.which("jupyter-book") or str(Path(sys.executable).parent / "jupyter-book")
    if not Path(jb).exists():
        pytest.skip("jupyter-book is not installed (pip install -e '.[dev]')")
    res = subprocess.run([jb, "build", str(REPO / "book"), "--path-output", str(tmp_path), "-W", "-n",
                          "--keep-going"], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    html = tmp_path / "_build" / "html"
    t00 = (html / "solutions" / "T00_welcome.html").read_text(encoding="utf-8")
    assert "How an exercise works" in t00
    assert "T00.1 rms: pass" in t00  # the executed output is in the page
    assert (html / "course_map.html").exists()
