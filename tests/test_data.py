"""Token data on disk: prepare (split by document, dtype, header), TokenDataset windows, errors."""

import json

import numpy as np
import pytest

from xtrain_lessons.training import data as D
from xtrain_lessons.training.tokenizer import EOT, decode, encode, train_tokenizer_from_text

DOCS = [f"Story {i}: {name} found a {thing} and was happy. The end number {i}."
        for i, (name, thing) in enumerate(
            [("Lily", "ball"), ("Tom", "kite"), ("Mia", "shell"), ("Ben", "hat"), ("Zoë", "café sign")] * 8)]
TEXT = f"\n{EOT}\n".join(DOCS) + "\n"


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer_from_text(TEXT, vocab_size=320)


@pytest.fixture(scope="module")
def prepared(tok, tmp_path_factory):
    d = tmp_path_factory.mktemp("prep")
    src = d / "text.txt"
    src.write_text(TEXT, encoding="utf-8")
    return D.prepare(src, d / "out", tok, val_fraction=0.2, seed=3)


def test_prepare_writes_header_and_files(prepared, tok):
    out = prepared.out_dir
    assert sorted(p.name for p in out.iterdir()) == ["data.json", "tokenizer.json", "train.bin", "val.bin"]
    h = json.loads((out / "data.json").read_text())
    assert h["dtype"] == "uint16" and h["vocab_size"] == 320 and h["eot_id"] == 0
    assert h["split_by"] == "documents"
    assert h["splits"]["train"]["n_documents"] + h["splits"]["val"]["n_documents"] == len(DOCS)
    assert h["splits"]["val"]["n_documents"] == 8  # 20% of 40
    for split in ("train", "val"):
        assert (out / f"{split}.bin").stat().st_size == 2 * h["splits"][split]["n_tokens"]
    assert prepared.n_tokens("train") > prepared.n_tokens("val") > 0
    assert len(h["source"]["sha256"]) == 64


def test_split_by_document_and_eot_after_each(prepared, tok):
    """Decoding each split gives whole documents, each ending in EOT, none in both splits."""
    seen = {}
    for split in ("train", "val"):
        ds = D.TokenDataset(prepared.out_dir, split, tokenizer=tok)
        ids = np.asarray(ds.tokens)
        assert ids[-1] == 0
        docs = decode(tok, ids).split(EOT)
        assert docs[-1] == ""
        seen[split] = docs[:-1]
        assert all(doc in DOCS for doc in seen[split])
    assert not set(seen["train"]) & set(seen["val"])
    assert sorted(seen["train"] + seen["val"]) == sorted(DOCS)
    # each split keeps the file's order
    assert seen["train"] == [d for d in DOCS if d in seen["train"]]


def test_prepare_is_deterministic(prepared, tok, tmp_path):
    src = tmp_path / "text.txt"
    src.write_text(TEXT, encoding="utf-8")
    again = D.prepare(src, tmp_path / "a", tok, val_fraction=0.2, seed=3)
    for split in ("train", "val"):
        assert (again.out_dir / f"{split}.bin").read_bytes() == (prepared.out_dir / f"{split}.bin").read_bytes()
    other = D.prepare(src, tmp_path / "b", tok, val_fraction=0.2, seed=4)
    assert (other.out_dir / "val.bin").read_bytes() != (prepared.out_dir / "val.bin").read_bytes()


def test_token_dtype_choice():
    assert D.token_dtype(2048) == np.uint16
    assert D.token_dtype(65536) == np.uint16
    assert D.token_dtype(65537) == np.uint32
    assert D.token_dtype(151_936) == np.uint32  # the Qwen3 vocabulary
    with pytest.raises(ValueError):
        D.token_dtype(0)


def test_uint32_when_the_vocabulary_is_large(tmp_path):
    """A tokenizer with > 65536 ids is written as uint32 and read back intact."""
    from tokenizers import AddedToken

    big = train_tokenizer_from_text(TEXT, vocab_size=300)
    big.add_tokens([AddedToken(f"<extra_{i}>", special=False) for i in range(65_600 - 300)])
    assert big.get_vocab_size() > 65536
    src = tmp_path / "t.txt"
    src.write_text(f"Lily <extra_65299> {EOT} Tom <extra_7>", encoding="utf-8")
    p = D.prepare(src, tmp_path / "out", big, val_fraction=0.5)
    assert p.dtype == "uint32"
    ids = np.concatenate([np.asarray(D.TokenDataset(p.out_dir, s).tokens) for s in ("train", "val")])
    assert ids.max() >= 65536
    assert (tmp_path / "out" / "train.bin").stat().st_size == 4 * p.n_tokens("train")


def test_windows_are_next_token_pairs(prepared):
    ds = D.TokenDataset(prepared.out_dir, "train")
    x, y = ds.get_batch(16, 7, np.random.default_rng(0))
    assert x.shape == y.shape == (16, 7) and x.dtype == y.dtype == np.int64
    tokens = np.asarray(ds.tokens)
    for xb, yb in zip(x, y):
        # find where this window starts and check it against the stream
        starts = [s for s in range(len(tokens) - 7) if (tokens[s:s + 7] == xb).all()]
        assert any((tokens[s + 1:s + 8] == yb).all() for s in starts)
    assert (x[:, 1:] == y[:, :-1]).all()


def test_batches_are_seeded(prepared):
    ds = D.TokenDataset(prepared.out_dir, "train")
    a = ds.get_batch(4, 8, np.random.default_rng(42))
    b = ds.get_batch(4, 8, np.random.default_rng(42))
    c = ds.get_batch(4, 8, np.random.default_rng(43))
    assert all((u == v).all() for u, v in zip(a, b))
    assert not (a[0] == c[0]).all()


def test_windows_reach_both_ends(prepared):
    """Starts run from 0 to len - seq_len - 1: the first and the last window are both drawn."""
    ds = D.TokenDataset(prepared.out_dir, "val")
    tokens = np.asarray(ds.tokens).astype(np.int64)
    T = len(ds) - 2  # exactly two windows fit: starts 0 and 1
    x, y = ds.get_batch(64, T, np.random.default_rng(0))
    first = (x == tokens[0:T]).all(axis=1) & (y == tokens[1:T + 1]).all(axis=1)
    last = (x == tokens[1:T + 1]).all(axis=1) & (y == tokens[2:T + 2]).all(axis=1)
    assert (first | last).all() and first.any() and last.any()


def test_window_longer_than_split_is_an_error(prepared):
    ds = D.TokenDataset(prepared.out_dir, "val")
    ds.get_batch(1, len(ds) - 1, np.random.default_rng(0))  # exactly one window fits
    with pytest.raises(ValueError, match="fewer than one window"):
        ds.get_batch(1, len(ds), np.random.default_rng(0))


def test_get_batch_wants_a_generator(prepared):
    ds = D.TokenDataset(prepared.out_dir, "train")
    with pytest.raises(TypeError, match="default_rng"):
        ds.get_batch(2, 4, 0)


def test_iter_batches_covers_the_split_in_order(prepared):
    ds = D.TokenDataset(prepared.out_dir, "val")
    xs = [x for x, _ in ds.iter_batches(3, 5)]
    flat = np.concatenate([x.reshape(-1) for x in xs])
    n = (len(ds) - 1) // 5 * 5
    assert (flat == np.asarray(ds.tokens[:n])).all()
    assert len(list(ds.iter_batches(3, 5, max_batches=1))) == 1


def test_tokenizer_mismatch_is_detected(prepared, tok):
    other = train_tokenizer_from_text(TEXT, vocab_size=300)
    with pytest.raises(ValueError, match="tokenizer mismatch"):
        D.TokenDataset(prepared.out_dir, "train", tokenizer=other)
    D.TokenDataset(prepared.out_dir, "train", tokenizer=tok)  # the right one is accepted
    assert D.TokenDataset(prepared.out_dir).tokenizer().to_str() == tok.to_str()


def test_out_of_range_ids_are_named(prepared, tmp_path):
    import shutil

    d = tmp_path / "bad"
    shutil.copytree(prepared.out_dir, d)
    ids = np.fromfile(d / "train.bin", dtype="<u2")
    ids[5] = 999  # vocab is 320
    ids.tofile(d / "train.bin")
    with pytest.raises(ValueError, match="token id 999 at position 5"):
        D.TokenDataset(d, "train")


def test_truncated_file_and_bad_header(prepared, tmp_path):
    import shutil

    d = tmp_path / "trunc"
    shutil.copytree(prepared.out_dir, d)
    (d / "train.bin").write_bytes((d / "train.bin").read_bytes()[:-2])
    with pytest.raises(ValueError, match="truncated"):
        D.TokenDataset(d, "train")
    with pytest.raises(ValueError, match="unknown split"):
        D.TokenDataset(d, "test")
    (d / "data.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        D.TokenDataset(d, "val")
    (d / "data.json").write_text('{"hello": 1}')
    with pytest.raises(ValueError, match="header"):
        D.TokenDataset(d, "val")
    with pytest.raises(FileNotFoundError, match="xtrain data prepare"):
        D.TokenDataset(tmp_path / "nothing")


def test_text_errors(tok, tmp_path):
    with pytest.raises(FileNotFoundError, match="text file not found"):
        D.prepare(tmp_path / "missing.txt", tmp_path / "o", tok)
    empty = tmp_path / "empty.txt"
    empty.write_text(f"  \n{EOT}\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty"):
        D.prepare(empty, tmp_path / "o", tok)
    latin = tmp_path / "latin1.txt"
    latin.write_bytes("café olé".encode("latin-1"))
    with pytest.raises(ValueError, match=r"not valid UTF-8: byte 0xe9 at offset 3"):
        D.prepare(latin, tmp_path / "o", tok)
    assert not (tmp_path / "o" / "data.json").exists()
    with pytest.raises(ValueError, match="val_fraction"):
        D.split_documents(10, 1.0, 0)


def test_single_document_is_split_by_position(tok, tmp_path):
    src = tmp_path / "one.txt"
    src.write_text(" ".join(DOCS), encoding="utf-8")  # no EOT at all
    p = D.prepare(src, tmp_path / "o", tok, val_fraction=0.1)
    assert p.header["split_by"] == "tokens"
    tr = np.asarray(D.TokenDataset(p.out_dir, "train").tokens)
    va = np.asarray(D.TokenDataset(p.out_dir, "val").tokens)
    assert (np.concatenate([tr, va]) == encode(tok, " ".join(DOCS)) + [0]).all()
    assert abs(len(va) - 0.1 * (len(tr) + len(va))) <= 1


def test_split_documents_gives_both_splits_a_document():
    tr, va = D.split_documents(3, 0.01, 0)
    assert len(va) == 1 and len(tr) == 2
    tr, va = D.split_documents(10, 0.0, 0)
    assert len(va) == 0 and len(tr) == 10


def test_ensure_prepared_reuses_matching_data(tmp_path):
    src = tmp_path / "text.txt"
    src.write_text(TEXT, encoding="utf-8")
    a = D.ensure_prepared(tmp_path / "o", src, vocab_size=300)
    mtime = (tmp_path / "o" / "train.bin").stat().st_mtime_ns
    b = D.ensure_prepared(tmp_path / "o", src, vocab_size=300)
    assert b.header == a.header and (tmp_path / "o" / "train.bin").stat().st_mtime_ns == mtime
    c = D.ensure_prepared(tmp_path / "o", src, vocab_size=290)  # other settings: prepared again
    assert c.tokenizer_hash != a.tokenizer_hash


def test_default_corpus_path(monkeypatch, tmp_path):
    import xtrain_lessons

    p = D.default_corpus_path()
    assert p.name == "stories.txt" and p.is_file()
    # with no checkout next to the package and nothing in cwd: a clear error naming --data
    monkeypatch.setattr(xtrain_lessons, "__file__", str(tmp_path / "pkg" / "xtrain_lessons" / "__init__.py"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match="--data"):
        D.default_corpus_path()
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "stories.txt").write_text("hi")
    assert D.default_corpus_path() == tmp_path / "data" / "stories.txt"
