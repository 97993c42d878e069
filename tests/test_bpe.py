"""The course's byte-level BPE: trainer, tokenizer, streaming, and parity with `tokenizers`/transformers."""

import json
import random
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from xtrain_lessons.training.tokenizer.bpe_hf import (
    EngineTokenizer,
    from_hf_json,
    load_hf,
    save_pretrained,
    to_hf_dict,
    to_hf_json,
    train_engine_tokenizer,
)
from xtrain_lessons.training.tokenizer.bpe_pretokenize import count_file, count_pretokens, pretokens, split_special
from xtrain_lessons.training.tokenizer.bpe_tokenizer import Tokenizer, str_to_token
from xtrain_lessons.training.tokenizer.bpe_train import (
    _Vocab,
    count_pairs,
    merge_incremental,
    merge_naive,
    merge_word,
    train_bpe,
    train_bpe_from_text,
    words_from_counts,
)

EOT = "<|endoftext|>"
STORIES = Path(__file__).resolve().parents[1] / "data" / "stories.txt"
TRICKY = [
    "", " ", "  ", "a", "Hello, world!", "  leading and trailing  ", "tabs\tand\nnewlines\r\n\n\n",
    "don't we'll they're I'd it's 'll '", "a  b   c    d", "x'l", "1234567 89",
    "Ünïcödé: Ελληνικά, русский, العربية, हिन्दी, 中文, 日本語, 한국어",
    "emoji 🙂👩‍👩‍👧 and 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", f"one{EOT}two\n{EOT}\nthree", "<|endoftext", f"{EOT}{EOT}",
    f"in{EOT}side a word", "zero width\u200bjoiner \u00a0nbsp", "word " * 40,
]


def random_unicode(rng: random.Random, n: int) -> str:
    """Text mixing ASCII, accents, CJK, emoji (with joiners), whitespace and the EOT marker."""
    pools = ["abcdefghij ", "  \t\n", "éüßçñ", "日本語中文한국어", "🙂🚀👩‍👧\u200d", "0123456789", "'.,!?\"",
             "𝔘𝔫𝔦", EOT]
    return "".join(rng.choice(rng.choice(pools)) if rng.random() < 0.97 else EOT for _ in range(n))


@pytest.fixture(scope="module")
def stories_text():
    return STORIES.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def trained():
    vocab, merges = train_bpe(STORIES, 1024, [EOT])
    return vocab, merges


@pytest.fixture(scope="module")
def tok(trained):
    return Tokenizer(*trained, special_tokens=[EOT])


# ----- pre-tokenization ----------------------------------------------------------------------

def test_pretokens_follow_gpt2():
    assert pretokens("Hello, world! It's  2024.") == ["Hello", ",", " world", "!", " It", "'s", " ", " 2024", "."]


def test_split_special_longest_wins():
    assert split_special("a<|x|><|x|>>b", ["<|x|>", "<|x|>>"]) == ["a", "<|x|>", "<|x|>>", "b"]
    assert split_special("", [EOT]) == []


def test_counting_skips_special_tokens():
    c = count_pretokens(f"the cat{EOT} the", [EOT])
    assert c == {b"the": 1, b" cat": 1, b" the": 1}


def test_count_file_same_with_processes(tmp_path, stories_text):
    p = tmp_path / "s.txt"
    p.write_text(stories_text[:300_000], encoding="utf-8")
    one = count_file(p, [EOT], workers=1)
    assert count_file(p, [EOT], workers=2, chunk_bytes=40_000) == one == count_pretokens(p.read_text("utf-8"), [EOT])


def test_a_file_that_is_not_utf8_is_one_clear_error(tmp_path):
    p = tmp_path / "latin1.txt"
    p.write_bytes("café".encode("latin-1"))
    with pytest.raises(ValueError, match=r"not valid UTF-8 \(byte 3: "):
        train_bpe(p, 300, [EOT])


# ----- training ------------------------------------------------------------------------------

def test_vocab_layout_and_size(trained):
    vocab, merges = trained
    assert len(vocab) == 1024 and vocab[0] == EOT.encode()
    assert all(vocab[1 + b] == bytes([b]) for b in range(256))
    assert len(set(vocab.values())) == len(vocab)
    assert all(a + b in set(vocab.values()) for a, b in merges)
    assert not any(b"endoftext" in t for t in vocab.values() if t != EOT.encode())


def test_incremental_equals_naive(stories_text):
    counts = count_pretokens(stories_text[:200_000], [EOT])
    assert merge_incremental(counts, 700, [EOT]) == merge_naive(counts, 700, [EOT])
    rng = random.Random(1)
    text = random_unicode(rng, 5000)
    assert train_bpe_from_text(text, 400) == train_bpe_from_text(text, 400, naive=True)


def test_ties_go_to_the_lexicographically_greatest_pair():
    # "ab" and "cd" and "ba" each occur twice: (c, d) is the greatest pair of bytes.
    _, merges = train_bpe_from_text("ab cd ab cd ba ba", 256 + 1 + 1, special_tokens=[EOT])
    assert merges == [(b"c", b"d")]
    _, merges = train_bpe_from_text("zz zz a a", 258, special_tokens=[EOT])
    assert merges == [(b"z", b"z")]


def test_a_file_of_only_special_tokens_trains_no_merge(tmp_path):
    p = tmp_path / "eot.txt"
    p.write_text(EOT * 50, encoding="utf-8")
    vocab, merges = train_bpe(p, 400, [EOT])
    assert merges == [] and len(vocab) == 257


def test_training_is_deterministic(tmp_path, stories_text):
    p = tmp_path / "s.txt"
    p.write_text(stories_text[:200_000], encoding="utf-8")
    assert train_bpe(p, 600, [EOT], workers=1) == train_bpe(p, 600, [EOT], workers=2)


def _first_tie(counts, n_merges):
    """Index of the first merge whose top pair count is tied (recounting naively)."""
    v = _Vocab([EOT])
    words, freqs = words_from_counts(counts, 1)
    for step in range(n_merges):
        pairs = count_pairs(words, freqs)
        ranked = sorted(pairs.items(), key=lambda kv: -kv[1])
        if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
            return step, [p for p, c in ranked if c == ranked[0][1]], v
        best = ranked[0][0]
        new_id = v.add(best)
        words = [merge_word(w, best, new_id) for w in words]
    return n_merges, [], v


def test_merges_equal_tokenizers_trainer_until_the_first_tie(trained):
    """Both take the most frequent pair; they differ only in how they break a tie: we take
    the greatest pair of byte strings, `tokenizers` the pair of smallest ids in its own vocab
    (bytes ordered by their printable character, then merged tokens by creation)."""
    from xtrain_lessons.training.tokenizer import train_tokenizer

    _, ours = trained
    hf = train_tokenizer([STORIES], 1024, min_frequency=0)
    j = json.loads(hf.to_str())["model"]
    theirs = [tuple(str_to_token(s) for s in (m.split(" ") if isinstance(m, str) else m)) for m in j["merges"]]
    assert len(ours) == len(theirs)
    tie, tied_pairs, v = _first_tie(count_file(STORIES, [EOT]), len(ours))
    assert tie > 50  # the comparison covers a real stretch of training
    assert ours[:tie] == theirs[:tie]
    # At the tie: ours is the greatest bytes pair, theirs the smallest pair of their ids.
    as_bytes = [(v.vocab[a], v.vocab[b]) for a, b in tied_pairs]
    assert ours[tie] == max(as_bytes)
    hf_ids = {str_to_token(s) if s != EOT else EOT.encode(): i for s, i in j["vocab"].items()}
    assert theirs[tie] == min(as_bytes, key=lambda p: (hf_ids[p[0]], hf_ids[p[1]]))


# ----- encoding and decoding -----------------------------------------------------------------

@pytest.mark.parametrize("text", TRICKY)
def test_round_trip_tricky(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_round_trip_random_unicode(tok):
    rng = random.Random(0)
    for n in (0, 1, 7, 100, 2000):
        text = random_unicode(rng, n)
        assert tok.decode(tok.encode(text)) == text


def test_special_tokens_inside_words_and_alone(tok):
    ids = tok.encode(f"hel{EOT}lo")
    assert ids.count(0) == 1 and ids == tok.encode("hel") + [0] + tok.encode("lo")
    assert tok.encode(EOT * 5) == [0] * 5
    assert tok.encode("") == [] and tok.decode([]) == ""


def test_overlapping_special_tokens_longest_wins(trained):
    vocab, merges = trained
    t = Tokenizer(vocab, merges, special_tokens=[EOT, EOT + EOT])
    ids = t.encode(EOT * 3)
    assert len(ids) == 2 and t.decode(ids) == EOT * 3
    assert ids[0] == t.special_ids[EOT + EOT] and ids[1] == t.special_ids[EOT]


def test_decode_replaces_invalid_utf8(tok):
    ids = [1 + b for b in b"\xed\xa0\x80"]  # a UTF-16 surrogate written as UTF-8: invalid
    assert tok.decode(ids) == "\ufffd" * 3
    cut = tok.encode("🙂")
    assert tok.decode([1 + b for b in "🙂".encode()[:2]]) == "\ufffd"
    assert tok.decode(cut) == "🙂"


def test_lone_surrogate_in_text_is_one_clear_error(tok):
    with pytest.raises(ValueError, match="lone surrogate"):
        tok.encode("abc\ud800def")


@pytest.mark.parametrize("specials", [[EOT], []])
def test_encode_iterable_equals_encode(trained, stories_text, specials):
    tok = Tokenizer(*trained, special_tokens=specials)  # without specials nothing is held back for them
    rng = random.Random(3)
    texts = [stories_text[:50_000], "".join(TRICKY) * 3, random_unicode(rng, 3000)]
    for text in texts:
        for size in (1, 2, 3, 7, 64, 1000):
            chunks = [text[i:i + size] for i in range(0, len(text), size)]
            assert list(tok.encode_iterable(chunks)) == tok.encode(text), size


def test_encode_iterable_waits_for_contractions_and_spaces():
    """A chunk ending in "we'l" must not emit "'" yet ("'ll" is one pre-token), nor "a  " the spaces."""
    text = "we'll they've a  b\t\n  c  " * 20
    tok = Tokenizer(*train_bpe_from_text(text, 300, []), special_tokens=[])
    assert (b"'ll" in tok.vocab.values()) and (b"  " in tok.vocab.values())
    for size in (1, 2, 3):
        chunks = [text[i:i + size] for i in range(0, len(text), size)]
        assert list(tok.encode_iterable(chunks)) == tok.encode(text), size


def test_encode_iterable_on_an_open_file_of_only_special_tokens(tok, tmp_path):
    p = tmp_path / "eot.txt"
    p.write_text((EOT + "\n") * 100 + EOT, encoding="utf-8")
    with open(p, encoding="utf-8") as f:
        ids = list(tok.encode_iterable(f))
    assert ids == tok.encode(p.read_text(encoding="utf-8"))
    assert ids.count(0) == 101


def test_encode_iterable_memory_stays_flat(tok, stories_text):
    """Peak Python memory while streaming 1 MB is no more than while streaming 50 kB."""
    lines = stories_text[:50_000].splitlines(keepends=True)

    def peak(n_repeats):
        tracemalloc.start()
        n = sum(1 for _ in tok.encode_iterable(line for _ in range(n_repeats) for line in lines))
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        return n, peak

    n1, p1 = peak(1)
    n20, p20 = peak(20)
    assert n20 > 19 * n1  # it did encode the whole stream
    assert p20 < 1.5 * p1 + (256 << 10)  # holding the stream would take > 20x


def test_files_round_trip(tok, tmp_path):
    tok.save_files(tmp_path / "vocab.json", tmp_path / "merges.txt")
    back = Tokenizer.from_files(tmp_path / "vocab.json", tmp_path / "merges.txt", [EOT])
    assert back.vocab == tok.vocab and back.merges == tok.merges
    for text in TRICKY:
        assert back.encode(text) == tok.encode(text)


# ----- Hugging Face interop ------------------------------------------------------------------

def _hf_cases(stories_text):
    rng = random.Random(5)
    return TRICKY + [random_unicode(rng, 500) for _ in range(20)] + [stories_text[:20_000]]


def test_exported_json_gives_our_ids_in_tokenizers_and_transformers(tok, tmp_path, stories_text):
    from tokenizers import Tokenizer as HFTokenizer
    from transformers import AutoTokenizer

    save_pretrained(tok, tmp_path)
    hf = HFTokenizer.from_file(str(tmp_path / "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(str(tmp_path))
    for text in _hf_cases(stories_text):
        ids = tok.encode(text)
        assert hf.encode(text, add_special_tokens=False).ids == ids
        assert auto(text, add_special_tokens=False)["input_ids"] == ids
        assert hf.decode(ids, skip_special_tokens=False) == text
    rng = random.Random(7)
    for _ in range(20):  # any id sequence, valid UTF-8 or not, decodes the same
        ids = [rng.randrange(len(tok.vocab)) for _ in range(rng.randrange(1, 30))]
        assert hf.decode(ids, skip_special_tokens=False) == tok.decode(ids)


def test_trained_on_the_corpus_equals_autotokenizer_on_the_whole_corpus(tok, tmp_path, stories_text):
    from transformers import AutoTokenizer

    save_pretrained(tok, tmp_path)
    auto = AutoTokenizer.from_pretrained(str(tmp_path))
    assert auto(stories_text, add_special_tokens=False)["input_ids"] == tok.encode(stories_text)


def test_loading_a_tokenizers_trained_json_gives_identical_ids(stories_text, tmp_path):
    """A GPT-2-style tokenizer.json made by `tokenizers` (bytes in its own order, not ours)."""
    from xtrain_lessons.training.tokenizer import save_tokenizer, train_tokenizer

    hf = train_tokenizer([STORIES], 800)
    save_tokenizer(hf, tmp_path / "tokenizer.json")
    ours = load_hf(tmp_path / "tokenizer.json")
    assert len(ours.vocab) == hf.get_vocab_size()
    for text in _hf_cases(stories_text):
        assert ours.encode(text) == hf.encode(text, add_special_tokens=False).ids
    assert json.loads(to_hf_json(ours))["model"]["vocab"] == json.loads(hf.to_str())["model"]["vocab"]


def gpt2_layout(tok) -> dict:
    """`tok` written the way GPT-2's own tokenizer.json is laid out: the bytes in GPT-2's order
    (printable ones first), merged tokens after them, <|endoftext|> last, a post-processor."""
    from xtrain_lessons.training.tokenizer.bpe_tokenizer import bytes_to_unicode, token_to_str

    printable = [b for b in range(256) if bytes_to_unicode()[b] == chr(b)]
    order = [bytes([b]) for b in printable + [b for b in range(256) if b not in printable]]
    order += [a + b for a, b in tok.merges]
    vocab = {token_to_str(t): i for i, t in enumerate(dict.fromkeys(order))}
    vocab[EOT] = len(vocab)
    j = to_hf_dict(tok)
    j["model"]["vocab"] = vocab
    j["added_tokens"][0]["id"] = vocab[EOT]
    j["post_processor"] = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    return j


def test_a_gpt2_laid_out_json_reads_with_identical_ids(tok, stories_text):
    from tokenizers import Tokenizer as HFTokenizer

    text = json.dumps(gpt2_layout(tok))
    hf, ours = HFTokenizer.from_str(text), from_hf_json(text)
    assert ours.special_ids[EOT] == len(ours.vocab) - 1 and ours.byte_ids[ord("!")] == 0
    for case in _hf_cases(stories_text):
        ids = ours.encode(case)
        assert ids == hf.encode(case, add_special_tokens=False).ids
        assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=False) == case


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=60))
def test_any_text_round_trips_with_the_ids_of_tokenizers(tok, text):
    """Property test: any Unicode string (hypothesis draws odd categories and combining marks),
    so the `regex` module and the Rust regex behind `tokenizers` must split it alike."""
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert _hf(tok).encode(text, add_special_tokens=False).ids == ids


_HF_CACHE = {}


def _hf(tok):
    from tokenizers import Tokenizer as HFTokenizer

    if id(tok) not in _HF_CACHE:
        _HF_CACHE[id(tok)] = HFTokenizer.from_str(to_hf_json(tok))
    return _HF_CACHE[id(tok)]


def test_unsupported_tokenizer_json_is_refused_by_name(tok):
    j = json.loads(to_hf_json(tok))
    j["pre_tokenizer"]["add_prefix_space"] = True
    with pytest.raises(ValueError, match="prefix"):
        from_hf_json(json.dumps(j))
    j = json.loads(to_hf_json(tok))
    j["model"]["type"] = "WordPiece"
    with pytest.raises(ValueError, match="only BPE"):
        from_hf_json(json.dumps(j))


def test_engine_tokenizer_works_with_the_engine(tmp_path, stories_text):
    """What `xtrain train --tokenizer-impl course` relies on: the engine's tokenizer helpers."""
    from xtrain_lessons.training import tokenizer as engine
    from xtrain_lessons.training.data import TokenDataset, prepare

    p = tmp_path / "s.txt"
    p.write_text(stories_text[:100_000], encoding="utf-8")
    eng = train_engine_tokenizer([p], 600)
    assert isinstance(eng, EngineTokenizer)
    assert engine.eot_id(eng) == 0 and engine.vocab_size(eng) == 600
    text = f"Once upon a time{EOT}the end"
    assert engine.decode(eng, engine.encode(eng, text)) == text
    engine.save_tokenizer(eng, tmp_path / "tok" / "tokenizer.json")
    hf = engine.load_tokenizer(tmp_path / "tok" / "tokenizer.json")
    assert engine.tokenizer_hash(hf) == engine.tokenizer_hash(eng)
    assert engine.encode(hf, stories_text[:20_000]) == engine.encode(eng, stories_text[:20_000])
    prepared = prepare(p, tmp_path / "data", eng, val_fraction=0.1, seed=0)
    ds = TokenDataset(prepared.out_dir, "train", tokenizer=hf)
    assert len(ds) > 0


def test_tokenizer_impl_switch(tmp_path, stories_text):
    from tokenizers import Tokenizer as HFTokenizer

    from xtrain_lessons.training.tokenizer.bpe_hf import load_tokenizer_impl, train_tokenizer_impl

    p = tmp_path / "s.txt"
    p.write_text(stories_text[:50_000], encoding="utf-8")
    course, hf = train_tokenizer_impl("course", [p], 400), train_tokenizer_impl("hf", [p], 400)
    assert isinstance(course, EngineTokenizer) and isinstance(hf, HFTokenizer)
    course.save(str(tmp_path / "tokenizer.json"))
    assert isinstance(load_tokenizer_impl("course", tmp_path), EngineTokenizer)
    assert isinstance(load_tokenizer_impl("hf", tmp_path / "tokenizer.json"), HFTokenizer)
    with pytest.raises(ValueError, match="one of"):
        train_tokenizer_impl("rust", [p], 400)


def test_a_run_trained_with_our_tokenizer_resumes_and_exports(tmp_path, stories_text, monkeypatch):
    """`xtrain train --tokenizer-impl course`, simulated without touching train.py: the run,
    its resume (which reads tokenizer.json with `tokenizers`) and T09's export closed loop."""
    from xtrain_lessons.training import tokenizer as engine
    from xtrain_lessons.interop.hf import closed_loop_check, export_hf
    from xtrain_lessons.training.config import TrainConfig
    from xtrain_lessons.training.loop import train

    corpus = tmp_path / "small.txt"
    text = stories_text[:30_000]
    corpus.write_text(text[:text.rfind(EOT)] + EOT + "\n", encoding="utf-8")
    monkeypatch.setattr(engine, "train_tokenizer", lambda files, n: train_engine_tokenizer(files, n))
    cfg = TrainConfig(preset="test", data=str(corpus), out=str(tmp_path / "run"), vocab_size=300, steps=4,
                      batch_size=2, seq_len=16, warmup=1, eval_every=0, sample_every=0, checkpoint_every=2,
                      threads=1)
    first = train(cfg, stop_at=2, progress=False, log=lambda m: None)
    assert isinstance(first.tokenizer, EngineTokenizer)
    done = train(resume=tmp_path / "run", progress=False, log=lambda m: None)
    assert done.step == 4
    export_hf(done.model, done.tokenizer, tmp_path / "hf")
    report = closed_loop_check(done.model, first.tokenizer, tmp_path / "hf", ["Once upon a time"], n_tokens=5)
    assert report["tokenizer_ids_equal"] is True, report["summary"]
    assert report["greedy_identical"] and all(report["greedy_identical"]), report["summary"]


def test_the_benchmark_runs_and_reports_consistent_results(tmp_path, stories_text):
    """A smoke test of bench_tokenizer on a small corpus (its numbers are not asserted)."""
    from xtrain_lessons.measure.bench_tokenizer import bench_tokenizer, format_results

    p = tmp_path / "s.txt"
    text = stories_text[:40_000]
    p.write_text(text[:text.rfind(EOT)] + EOT + "\n", encoding="utf-8")
    r = bench_tokenizer(p, vocab_size=400, rounds=1, scale=3, progress=lambda m: None)
    assert r["naive_vs_incremental"]["same_merges"] and r["encode_mb_per_s"]["same_ids"]
    assert r["stream"]["3x"]["tokens"] > 2.9 * r["stream"]["1x"]["tokens"]
    assert "tokenizers" in format_results(r)
