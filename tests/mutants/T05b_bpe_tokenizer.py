"""Wrong solutions to the exercises of T05b: each must be rejected by the notebook's own check.

The checks are taken from solutions/T05b_bpe_tokenizer.ipynb itself (its code cells up to
"## Measure" are executed once), so a check weakened in the notebook fails here. A check
returns the function it was given only when that function passes.
"""

import json
from collections import Counter
from pathlib import Path

import pytest
import regex

NOTEBOOK = Path(__file__).resolve().parents[2] / "solutions" / "T05b_bpe_tokenizer.ipynb"
EOT = "<|endoftext|>"
GPT2_RE = regex.compile(r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")


# ----- T05b.1 pretokenize --------------------------------------------------------------------

def pretokenize_ignores_specials(text, special_tokens=()):
    return GPT2_RE.findall(text)


def pretokenize_shortest_special_first(text, special_tokens=()):
    if not special_tokens:
        return GPT2_RE.findall(text)
    out = []
    for piece in regex.split("(" + "|".join(regex.escape(s) for s in special_tokens) + ")", text):
        if piece in special_tokens:
            out.append(piece)
        elif piece:
            out.extend(GPT2_RE.findall(piece))
    return out


def pretokenize_drops_specials(text, special_tokens=()):
    return [p for p in pretokenize_shortest_special_first(text, sorted(special_tokens, key=len, reverse=True))
            if p not in special_tokens]


def pretokenize_whitespace_split(text, special_tokens=()):
    return regex.findall(r"\S+|\s+", text)


def pretokenize_no_trailing_space_rule(text, special_tokens=()):
    pat = regex.compile(r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+""")
    return pat.findall(text) if not special_tokens else [
        t for piece in regex.split("(" + "|".join(regex.escape(s) for s in sorted(special_tokens, key=len, reverse=True)) + ")", text)
        for t in ([piece] if piece in special_tokens else pat.findall(piece))]


# ----- T05b.2 merge_step ---------------------------------------------------------------------

def _merge(words, best, step=2):
    new = {}
    for w, n in words.items():
        out, i = [], 0
        while i < len(w):
            if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                out.append(w[i] + w[i + 1])
                i += step
            else:
                out.append(w[i])
                i += 1
        new[tuple(out)] = n
    return new


def _pairs(words, weighted=True, distinct=False):
    pairs = Counter()
    for w, n in words.items():
        ps = set(zip(w, w[1:])) if distinct else zip(w, w[1:])
        for p in ps:
            pairs[p] += n if weighted else 1
    return pairs


def merge_step_smallest_on_tie(words):
    pairs = _pairs(words)
    best = min(pairs, key=lambda p: (-pairs[p], p))
    return best, _merge(words, best)


def merge_step_unweighted(words):
    pairs = _pairs(words, weighted=False)
    best = max(pairs, key=lambda p: (pairs[p], p))
    return best, _merge(words, best)


def merge_step_pair_once_per_word(words):
    pairs = _pairs(words, distinct=True)
    best = max(pairs, key=lambda p: (pairs[p], p))
    return best, _merge(words, best)


def merge_step_overlapping(words):
    pairs = _pairs(words)
    best = max(pairs, key=lambda p: (pairs[p], p))
    return best, _merge(words, best, step=1)


# ----- T05b.3 apply_merge --------------------------------------------------------------------

def _apply(pair, new_id, words, freqs, pair_counts, where, scan_all=False, index_new=True, weight=True,
           write_back=True):
    from xtrain_lessons.training.tokenizer.bpe_train import merge_word

    changed = set()
    todo = range(len(words)) if scan_all else where.pop(pair, ())
    for i in todo:
        old = words[i]
        new = merge_word(old, pair, new_id)
        if new == old:
            continue
        f = freqs[i] if weight else 1
        for p in zip(old, old[1:]):
            pair_counts[p] -= f
        for p in zip(new, new[1:]):
            pair_counts[p] += f
            if index_new:
                where.setdefault(p, set()).add(i)
        if write_back:
            words[i] = new
        changed.add(i)
    return changed


def apply_merge_scans_every_word(*a):
    return _apply(*a, scan_all=True)


def apply_merge_forgets_new_pairs_in_index(*a):
    return _apply(*a, index_new=False)


def apply_merge_unweighted(*a):
    return _apply(*a, weight=False)


def apply_merge_keeps_old_word(*a):
    return _apply(*a, write_back=False)


# ----- T05b.4 bpe_encode ---------------------------------------------------------------------

def _join_at(parts, k):
    return parts[:k] + [parts[k] + parts[k + 1]] + parts[k + 2:]


def bpe_encode_latest_merge_first(word, ranks):
    parts = [bytes([b]) for b in word]
    while True:
        known = [(ranks[p], k) for k, p in enumerate(zip(parts, parts[1:])) if p in ranks]
        if not known:
            return parts
        parts = _join_at(parts, max(known)[1])


def bpe_encode_leftmost_known_pair(word, ranks):
    parts = [bytes([b]) for b in word]
    while True:
        known = [k for k, p in enumerate(zip(parts, parts[1:])) if p in ranks]
        if not known:
            return parts
        parts = _join_at(parts, known[0])


def bpe_encode_longest_match(word, ranks):
    vocab = {a + b for a, b in ranks} | {bytes([b]) for b in range(256)}
    out, i = [], 0
    while i < len(word):
        j = max(j for j in range(i + 1, len(word) + 1) if word[i:j] in vocab)
        out.append(word[i:j])
        i = j
    return out


def bpe_encode_one_merge_only(word, ranks):
    parts = [bytes([b]) for b in word]
    known = [(ranks[p], k) for k, p in enumerate(zip(parts, parts[1:])) if p in ranks]
    return _join_at(parts, min(known)[1]) if known else parts


# ----- T05b.5 decode -------------------------------------------------------------------------

def decode_token_by_token(ids, vocab):
    return "".join(vocab[i].decode("utf-8", errors="replace") for i in ids)


def decode_ignoring_errors(ids, vocab):
    return b"".join(vocab[i] for i in ids).decode("utf-8", errors="ignore")


def decode_strict(ids, vocab):
    return b"".join(vocab[i] for i in ids).decode("utf-8")


def decode_latin1(ids, vocab):
    return b"".join(vocab[i] for i in ids).decode("latin-1")


BY_CHECK = {
    "check_pretokenize": [pretokenize_ignores_specials, pretokenize_shortest_special_first,
                          pretokenize_drops_specials, pretokenize_whitespace_split,
                          pretokenize_no_trailing_space_rule],
    "check_merge_step": [merge_step_smallest_on_tie, merge_step_unweighted, merge_step_pair_once_per_word,
                         merge_step_overlapping],
    "check_apply_merge": [apply_merge_scans_every_word, apply_merge_forgets_new_pairs_in_index,
                          apply_merge_unweighted, apply_merge_keeps_old_word],
    "check_bpe_encode": [bpe_encode_latest_merge_first, bpe_encode_leftmost_known_pair,
                         bpe_encode_longest_match, bpe_encode_one_merge_only],
    "check_decode": [decode_token_by_token, decode_ignoring_errors, decode_strict, decode_latin1],
}
# the same mutants in tests/test_mutants.py's format: exercise id -> {what the mistake is: mutant}
_EXERCISES = {"check_pretokenize": "T05b.1", "check_merge_step": "T05b.2", "check_apply_merge": "T05b.3",
              "check_bpe_encode": "T05b.4", "check_decode": "T05b.5"}
MUTANTS = {_EXERCISES[c]: {f.__name__.replace("_", " "): f for f in fns} for c, fns in BY_CHECK.items()}
SOLUTIONS = {"check_pretokenize": "pretokenize", "check_merge_step": "merge_step",
             "check_apply_merge": "apply_merge", "check_bpe_encode": "bpe_encode", "check_decode": "decode"}


@pytest.fixture(scope="module")
def notebook():
    """The namespace of the solution notebook, run up to its Measure section."""
    import matplotlib

    matplotlib.use("Agg")
    ns: dict = {}
    for cell in json.loads(NOTEBOOK.read_text(encoding="utf-8"))["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and src.startswith("## Measure"):
            break
        if cell["cell_type"] == "code":
            exec(compile(src, str(NOTEBOOK), "exec"), ns)  # noqa: S102
    return ns


@pytest.mark.parametrize("check_name", sorted(BY_CHECK))
def test_solution_passes_and_every_mutant_is_rejected(notebook, check_name, capsys):
    check = notebook[check_name]
    solution = notebook[SOLUTIONS[check_name]]
    assert check(solution) is solution, capsys.readouterr().out
    assert len(BY_CHECK[check_name]) >= 3
    for mutant in BY_CHECK[check_name]:
        assert check(mutant) is not mutant, f"{mutant.__name__} passed {check_name}"
    out = capsys.readouterr().out
    assert out.count("fail") >= len(BY_CHECK[check_name]), out
