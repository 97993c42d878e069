"""The Jupyter Book builds offline, warnings as errors, shows T00 with its outputs, loads nothing from the network."""

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# a script or stylesheet fetched from the network: <script src="https://...">, <link href="//...">,
# or a URL in an inline script (a loader that fetches it later)
REMOTE = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)\s*=\s*[\"'](?:https?:)?//|"
                    r"<script\b[^>]*>[^<]*https?://", re.IGNORECASE)


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
    remote = [f"{p.relative_to(html)}: {m.group(0)[:120]}" for p in html.rglob("*.html")
              for m in [REMOTE.search(p.read_text(encoding="utf-8"))] if m]
    assert not remote, "pages load from the network:\n" + "\n".join(remote[:10])
    t05 = (html / "solutions" / "T05_transformer.html").read_text(encoding="utf-8")
    assert 'src="../_static/mathjax/MathJax.js' in t05 and (html / "_static" / "mathjax" / "MathJax.js").exists()


def test_the_course_map_is_generated_from_the_phase_table():
    """book/course_map.md, the book's first chapter, is the phase table's (phases.py), every phase in it."""
    from xtrain_lessons.course import phases

    page = (REPO / "book" / "course_map.md").read_text(encoding="utf-8")
    assert page == phases.course_map_markdown(), \
        "book/course_map.md is stale: run `xtrain notebooks build` (it regenerates the page from phases.py)"
    for p in phases.TABLE:
        assert f"**{p.id}** {p.title}" in page, p.id
    assert phases.runs_where_markdown() in page
