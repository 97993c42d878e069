"""Byte-level BPE tokenizer: exact round trips, EOT handling, hashing, saving and loading."""

import json
import subprocess
import sys

import pytest

from xtrain_lessons.training.tokenizer import (
    EOT,
    EOT_ID,
    decode,
    encode,
    eot_id,
    load_tokenizer,
    save_tokenizer,
    tokenizer_hash,
    train_tokenizer,
    train_tokenizer_from_text,
    vocab_size,
)

TRAIN_TEXT = (
    "Once upon a time, there was a little girl named Lily. She loved her red ball.\n"
    f"{EOT}\n"
    "Tom and his dog went to the park. \"Look!\" said Tom. The dog wagged its tail.\n"
    f"{EOT}\n"
    "Café au lait, naïve façade, Übermut, 日本語のテキスト, emoji 🙂🚀.\n"
) * 20

ROUND_TRIP_CASES = [
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n\n\nand a blank line",
    "Ünïcödé: Ελληνικά, русский, العربية, हिन्दी, 中文, 日本語, 한국어",
    "emoji 🙂👩‍👩‍👧 and rare 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    f"one{EOT}two\n{EOT}\nthree",
    "<|endoftext",  # a broken special token is plain text
    "zero width\u200bjoiner and \u00a0nbsp",
    "word " * 50,
]


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer_from_text(TRAIN_TEXT, vocab_size=400)


@pytest.mark.parametrize("text", ROUND_TRIP_CASES)
def test_round_trip_exact(tok, text):
    assert decode(tok, encode(tok, text)) == text


def test_eot_is_one_special_token_with_id_0(tok):
    assert eot_id(tok) == EOT_ID == 0
    ids = encode(tok, f"a{EOT}b")
    assert ids.count(0) == 1
    assert encode(tok, EOT) == [0]


def test_eot_text_is_not_learned_as_merges(tok):
    pieces = [t for t in tok.get_vocab() if "endoftext" in t and t != EOT]
    assert pieces == []


def test_vocab_size_and_compression(tok):
    assert vocab_size(tok) <= 400
    assert vocab_size(tok) > 300  # merges were learned
    sample = "Once upon a time, there was a little girl named Lily."
    assert len(encode(tok, sample)) < len(sample.encode()) / 2


def test_rejects_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer_from_text("abc", vocab_size=10)
    with pytest.raises(FileNotFoundError, match="not found"):
        train_tokenizer([tmp_path / "missing.txt"], 300)
    with pytest.raises(ValueError, match="at least one"):
        train_tokenizer([], 300)


def test_training_is_deterministic_across_processes(tok, tmp_path):
    """Same text, same vocab size -> the same tokenizer, even in a new process."""
    text_file = tmp_path / "t.txt"
    text_file.write_text(TRAIN_TEXT, encoding="utf-8")
    code = ("import sys; from xtrain_lessons.training.tokenizer import *; "
            "print(tokenizer_hash(train_tokenizer([sys.argv[1]], 400)))")
    out = subprocess.run([sys.executable, "-c", code, str(text_file)], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == tokenizer_hash(tok)


def test_hash_changes_with_the_tokenizer(tok):
    other = train_tokenizer_from_text(TRAIN_TEXT, vocab_size=350)
    assert tokenizer_hash(other) != tokenizer_hash(tok)
    assert len(tokenizer_hash(tok)) == 64


def test_save_load_round_trip(tok, tmp_path):
    path = save_tokenizer(tok, tmp_path / "sub" / "tokenizer.json")
    assert path.is_file()
    assert [p.name for p in path.parent.iterdir()] == ["tokenizer.json"]  # no temp file left
    json.loads(path.read_text(encoding="utf-8"))  # standard JSON
    again = load_tokenizer(path)
    assert tokenizer_hash(again) == tokenizer_hash(tok)
    assert tokenizer_hash(load_tokenizer(tmp_path / "sub")) == tokenizer_hash(tok)  # a directory works too
    s = ROUND_TRIP_CASES[4]
    assert encode(again, s) == encode(tok, s)


def test_load_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "tokenizer.json"
    bad.write_text("{ this is not json", encoding="utf-8")
    with pytest.raises(ValueError, match="not a valid tokenizer.json"):
        load_tokenizer(bad)


def test_eot_id_missing():
    from tokenizers import Tokenizer, models

    with pytest.raises(ValueError, match="no <\\|endoftext\\|> token"):
        eot_id(Tokenizer(models.BPE()))


def test_hash_ignores_the_json_layout(tok):
    """The old tokenizer.json layout (merges as "a b" strings) hashes the same as the new one."""
    from tokenizers import Tokenizer

    j = json.loads(tok.to_str())
    j["model"]["merges"] = [m if isinstance(m, str) else " ".join(m) for m in j["model"]["merges"]]
    old_style = Tokenizer.from_str(json.dumps(j, indent=4))
    assert tokenizer_hash(old_style) == tokenizer_hash(tok)
