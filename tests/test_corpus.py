"""The shipped corpus data/stories.txt: reproducible from scripts/make_corpus.py, big and varied enough."""

import hashlib
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "data" / "stories.txt"
EOT = "<|endoftext|>"


@pytest.fixture(scope="module")
def make_corpus():
    spec = importlib.util.spec_from_file_location("make_corpus", ROOT / "scripts" / "make_corpus.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["make_corpus"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def text():
    return CORPUS.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def stories(text):
    assert text.endswith("\n")
    return [s.strip() for s in text.split(f"\n{EOT}\n")]


def test_committed_file_is_what_the_script_generates(make_corpus):
    generated = make_corpus.generate()
    assert generated.encode("utf-8") == CORPUS.read_bytes(), \
        "data/stories.txt is stale: run `python scripts/make_corpus.py` and update data/README.md"


def test_readme_records_the_sha256(text):
    readme = (ROOT / "data" / "README.md").read_text(encoding="utf-8")
    assert hashlib.sha256(text.encode("utf-8")).hexdigest() in readme
    assert "CC0" in readme and "make_corpus.py" in readme


def test_generation_is_seeded(make_corpus):
    a = make_corpus.generate(n=20, seed=7)
    assert a == make_corpus.generate(n=20, seed=7)
    assert a != make_corpus.generate(n=20, seed=8)
    assert a.count(EOT) == 19


def test_size_and_count(text, stories):
    assert len(text.encode("utf-8")) >= 1_000_000
    assert len(stories) >= 3000


def test_plain_ascii_text(text):
    assert text.isascii()
    assert not re.search(r"[{}\[\]\t]", text), "template syntax leaked into the text"
    assert "  " not in text


def test_each_story_is_short_and_well_formed(stories):
    for s in stories:
        n = len(s.split())
        assert 80 <= n <= 250, (n, s[:80])
        assert s[0].isupper() or s[0] == '"', s[:40]
        assert re.search(r'[.!?]"?$', s), s[-40:]
        for para in s.split("\n"):
            assert para.count('"') % 2 == 0, para  # quotation marks are balanced


def test_variety(text, stories):
    sentences = re.findall(r"[^.!?\n]+[.!?]", text.replace(EOT, ""))
    assert len(set(sentences)) / len(sentences) > 0.3
    words = {w.strip('.,!?"').lower() for w in text.replace(EOT, " ").split()}
    assert len(words) > 1000
    assert len(set(stories)) == len(stories)  # no story twice
    openings = {s.split(".")[0] for s in stories}
    assert len(openings) > 500


@pytest.mark.parametrize("pattern, what", [
    (r"\b[Tt]hey (was|has|is)\b", "they + singular verb"),
    (r"\b[Aa] [aeiouAEIOU]", "a before a vowel"),
    (r"\b[Aa]n [b-df-hj-np-tv-zB-DF-HJ-NP-TV-Z]", "an before a consonant"),
    (r"[a-z,] (He|She|They|His|Her|Their)\b", "capitalised pronoun mid-sentence"),
    (r"[.!?] [a-z]", "lower-case sentence start"),
    (r" [,.!?]", "space before punctuation"),
    (r"\b(\w+) \1\b", "doubled word"),
])
def test_grammar_lint(text, pattern, what):
    hits = [text[max(0, m.start() - 30):m.end() + 20] for m in re.finditer(pattern, text)]
    assert not hits, f"{what}: {hits[:3]}"
