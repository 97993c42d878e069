"""Training a byte-level BPE: start from the 256 bytes, repeatedly merge the most frequent pair.

    vocab, merges = train_bpe("data/stories.txt", 2048, ["<|endoftext|>"])
    vocab[0] == b"<|endoftext|>"; vocab[1 + 104] == b"h"; merges[0] == (b" ", b"t")

The vocabulary (id -> bytes) holds the special tokens first (so `<|endoftext|>` is id 0, as
the engine expects), then the 256 single bytes, then one new token per merge. The pair to
merge is the most frequent adjacent pair over all words (pre-tokens weighted by their count);
ties go to the lexicographically greatest pair of byte strings (GPT-2's and CS336's rule), so
training is deterministic. A merge whose bytes already form a token reuses its id (the vocab
never holds the same bytes twice, like `tokenizers`).

Two trainers give the same merges: `merge_naive` recounts every pair of every word after each
merge (easy to trust, O(corpus) per merge); `merge_incremental` keeps the pair counts and an
index pair -> words, and after a merge touches only the words that contain the merged pair.
"""

from __future__ import annotations

import heapq
import os
from collections import Counter, defaultdict

from tqdm import tqdm

from xtrain_lessons.training.tokenizer.bpe_pretokenize import count_file, count_pretokens

Pair = tuple[int, int]


def initial_vocab(special_tokens=()) -> dict[int, bytes]:
    """Special tokens (ids 0..k-1), then the 256 bytes (ids k..k+255)."""
    vocab = {i: s.encode("utf-8") for i, s in enumerate(special_tokens)}
    k = len(vocab)
    vocab.update({k + b: bytes([b]) for b in range(256)})
    return vocab


def words_from_counts(counts: Counter, n_special: int) -> tuple[list[list[int]], list[int]]:
    """(words as lists of byte-token ids, their counts), in sorted order of the words' bytes."""
    items = sorted(counts.items())
    return [[n_special + b for b in w] for w, _ in items], [n for _, n in items]


def count_pairs(words, freqs) -> Counter:
    """Count of each adjacent pair of ids over all words, each word weighted by its count."""
    pairs: Counter = Counter()
    for w, f in zip(words, freqs):
        for p in zip(w, w[1:]):
            pairs[p] += f
    return pairs


def merge_word(word: list[int], pair: Pair, new_id: int) -> list[int]:
    """`word` with every occurrence of `pair` (left to right, not overlapping) replaced."""
    a, b = pair
    out, i, n = [], 0, len(word)
    while i < n:
        if i + 1 < n and word[i] == a and word[i + 1] == b:
            out.append(new_id)
            i += 2
        else:
            out.append(word[i])
            i += 1
    return out


class _Vocab:
    """id <-> bytes, growing by one token per merge (or reusing one whose bytes exist)."""
    def __init__(self, special_tokens):
        self.vocab = initial_vocab(special_tokens)
        self.ids = {b: i for i, b in self.vocab.items()}

    def add(self, pair: Pair) -> int:
        new = self.vocab[pair[0]] + self.vocab[pair[1]]
        if new not in self.ids:
            self.ids[new] = len(self.vocab)
            self.vocab[len(self.vocab)] = new
        return self.ids[new]


def merge_naive(counts: Counter, vocab_size: int, special_tokens=(), min_frequency: int = 1):
    """The reference trainer: recount all pairs after every merge. Returns (vocab, merges)."""
    v = _Vocab(special_tokens)
    words, freqs = words_from_counts(counts, len(special_tokens))
    merges = []
    while len(v.vocab) < vocab_size:
        pairs = count_pairs(words, freqs)
        if not pairs:
            break
        best = max(pairs, key=lambda p: (pairs[p], v.vocab[p[0]], v.vocab[p[1]]))
        if pairs[best] < min_frequency:
            break
        new_id = v.add(best)
        merges.append((v.vocab[best[0]], v.vocab[best[1]]))
        words = [merge_word(w, best, new_id) for w in words]
    return v.vocab, merges


def _inverted(b: bytes) -> tuple:
    # Orders byte strings backwards (a longer string after its prefix, so the terminator 256
    # is larger than any byte): a min-heap then pops the lexicographically greatest first.
    return tuple(255 - x for x in b) + (256,)


def merge_incremental(counts: Counter, vocab_size: int, special_tokens=(), min_frequency: int = 1,
                      progress: bool = False):
    """Same merges as `merge_naive`; after each merge only the words holding the pair change.

    pair_counts: pair -> weighted count; where: pair -> indices of words that (may) hold it;
    heap: (-count, inverted bytes of both halves, pair), stale entries skipped when popped.
    """
    v = _Vocab(special_tokens)
    words, freqs = words_from_counts(counts, len(special_tokens))
    pair_counts: Counter = Counter()
    where: dict[Pair, set[int]] = defaultdict(set)
    for i, (w, f) in enumerate(zip(words, freqs)):
        for p in zip(w, w[1:]):
            pair_counts[p] += f
            where[p].add(i)
    key = {i: _inverted(b) for i, b in v.vocab.items()}
    heap = [(-c, key[p[0]], key[p[1]], p) for p, c in pair_counts.items()]
    heapq.heapify(heap)
    merges = []
    bar = _bar(progress, vocab_size - len(v.vocab))
    while len(v.vocab) < vocab_size:
        best = _pop_best(heap, pair_counts)
        if best is None or pair_counts[best] < min_frequency:
            break
        n_before = len(v.vocab)
        new_id = v.add(best)
        key.setdefault(new_id, _inverted(v.vocab[new_id]))
        merges.append((v.vocab[best[0]], v.vocab[best[1]]))
        changed = set()
        for i in sorted(where.pop(best)):
            w = words[i]
            if len(w) < 2 or best not in zip(w, w[1:]):
                continue  # a stale index entry: an earlier merge changed this word
            new_w = merge_word(w, best, new_id)
            f = freqs[i]
            for p in zip(w, w[1:]):
                pair_counts[p] -= f
                changed.add(p)
            for p in zip(new_w, new_w[1:]):
                pair_counts[p] += f
                where[p].add(i)
                changed.add(p)
            words[i] = new_w
        for p in changed:
            c = pair_counts[p]
            if c > 0:
                heapq.heappush(heap, (-c, key[p[0]], key[p[1]], p))
            else:
                del pair_counts[p]
        if bar is not None:
            bar.update(len(v.vocab) - n_before)
    if bar is not None:
        bar.close()
    return v.vocab, merges


def _pop_best(heap, pair_counts):
    """The pair with the highest count (ties: greatest bytes), skipping stale heap entries."""
    while heap:
        neg, _, _, p = heap[0]
        if pair_counts.get(p, 0) == -neg:
            return p
        heapq.heappop(heap)
    return None


def _bar(progress: bool, total: int):
    if not progress:
        return None

    return tqdm(total=total, desc="BPE merges", unit="merge")


def train_bpe(input_path: str | os.PathLike, vocab_size: int, special_tokens=("<|endoftext|>",),
              min_frequency: int = 1, workers: int | None = None, progress: bool = False):
    """Train on a UTF-8 file. Returns (vocab: dict[int, bytes], merges: list[(bytes, bytes)])."""
    _check(vocab_size, special_tokens)
    counts = count_file(input_path, list(special_tokens), workers=workers)
    return merge_incremental(counts, vocab_size, special_tokens, min_frequency, progress)


def train_bpe_from_text(text: str, vocab_size: int, special_tokens=("<|endoftext|>",),
                        min_frequency: int = 1, naive: bool = False):
    """Train on a string (notebooks, tests). naive=True uses the recounting trainer."""
    _check(vocab_size, special_tokens)
    counts = count_pretokens(text, list(special_tokens))
    merge = merge_naive if naive else merge_incremental
    return merge(counts, vocab_size, special_tokens, min_frequency)


def _check(vocab_size: int, special_tokens) -> None:
    if len(set(special_tokens)) != len(special_tokens):
        raise ValueError(f"special tokens must be distinct, got {list(special_tokens)}")
    if vocab_size < 256 + len(special_tokens):
        raise ValueError(f"vocab_size {vocab_size} is smaller than 256 bytes + "
                         f"{len(special_tokens)} special tokens; use at least {256 + len(special_tokens)}")
