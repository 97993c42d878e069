"""Byte-level BPE tokenizer for the course, trained with the Hugging Face `tokenizers` library.

Byte-level means every UTF-8 byte has a token before any merge is learned, so *any* text
encodes, and `decode(encode(text)) == text` exactly (no unknown token, no normalisation).
The special token `<|endoftext|>` (EOT) separates documents; it always has id 0.

    tok = train_tokenizer(["data/stories.txt"], vocab_size=DEFAULT_VOCAB_SIZE)
    ids = tok.encode("Once upon a time").ids
    text = decode(tok, ids)               # keeps <|endoftext|> (tok.decode would drop it)
    save_tokenizer(tok, "runs/tok/tokenizer.json")
    tok = load_tokenizer("runs/tok/tokenizer.json")
    tokenizer_hash(tok)                   # recorded in prepared data, checked when it is read

The saved file is the standard `tokenizer.json`, so T09 can copy it next to an exported
Hugging Face model unchanged.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

EOT = "<|endoftext|>"
EOT_ID = 0  # EOT is the first special token, so it gets the first id
# 2048 suits the shipped corpus (about 1,300 distinct words): almost every word becomes one
# token, and the embedding + lm_head of a tiny model stay small. Use 4096+ for real TinyStories.
DEFAULT_VOCAB_SIZE = 2048


def train_tokenizer(files: list[str | os.PathLike], vocab_size: int = DEFAULT_VOCAB_SIZE,
                    min_frequency: int = 2):
    """Train a byte-level BPE tokenizer on UTF-8 text files; returns a `tokenizers.Tokenizer`.

    The vocabulary holds EOT (id 0), the 256 byte symbols, then learned merges up to
    `vocab_size` (fewer if the text has no more pairs seen `min_frequency` times).
    """

    if vocab_size < 257 + 1:
        raise ValueError(f"vocab_size must be at least 258 (EOT + 256 bytes + one merge), got {vocab_size}")
    paths = [Path(f) for f in files]
    if not paths:
        raise ValueError("train_tokenizer needs at least one text file")
    for p in paths:
        if not p.is_file():
            raise FileNotFoundError(f"tokenizer training file not found: {p}")
        check_utf8(p)
    tok = Tokenizer(models.BPE())
    # add_prefix_space=False: no text is added, so decoding gives back the exact input.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[EOT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Train from the text with EOT removed, so no merges are wasted on pieces of "<|endoftext|>".
    tok.train_from_iterator(_lines_without_eot(paths), trainer)
    assert tok.token_to_id(EOT) == EOT_ID
    return tok


PIECE = 1 << 16  # characters: longer lines are cut into pieces of about this size


def safe_cut(text: str, start: int = 0) -> int:
    """The last index > start where `text` may be cut without changing its byte-level BPE
    tokens: a space between two non-spaces starts a word (" word") in the pre-tokenizer's
    split, so the tokens of text[:i] + text[i:] are those of text. -1 if there is none."""
    i = text.rfind(" ", start + 1, len(text) - 1)
    while i > start and (text[i - 1].isspace() or text[i + 1].isspace()):
        i = text.rfind(" ", start + 1, i)
    return i if i > start else -1


def safe_pieces(text: str, size: int = PIECE):
    """`text` in pieces of at most ~`size` characters, cut only where safe_cut allows (so the
    tokens of the pieces are those of the whole; the tokenizer's memory stays bounded)."""
    start = 0
    while len(text) - start > size:
        cut = safe_cut(text[: start + size], start)
        if cut < 0:  # one giant word: cut where the next safe place is
            cut = text.find(" ", start + size)
            while 0 < cut < len(text) - 1 and (text[cut - 1].isspace() or text[cut + 1].isspace()):
                cut = text.find(" ", cut + 1)
            if cut <= 0 or cut >= len(text) - 1:
                break
        yield text[start:cut]
        start = cut
    yield text[start:]


def file_pieces(f, size: int = PIECE):
    """The lines of text file `f`, a line longer than `size` in pieces cut at safe places:
    memory bounded by `size`, not by the longest line (save for a word longer than that)."""
    carry = ""
    while True:
        part = f.readline(size)
        text = carry + part
        if not part or text.endswith("\n") or len(part) < size:  # a whole line, or the end
            if text:
                yield text
            if not part:
                return
            carry = ""
            continue
        cut = safe_cut(text)
        carry = text[cut:] if cut > 0 else text
        if cut > 0:
            yield text[:cut]


def _lines_without_eot(paths: list[Path], batch: int = 1000):
    """Yield batches of lines from UTF-8 files, EOT markers removed (streams big files; a long
    line in pieces, see file_pieces)."""
    buf = []
    for p in paths:
        with open(p, encoding="utf-8") as f:
            for line in file_pieces(f):
                if EOT in line:
                    line = line.replace(EOT, "")
                if line:
                    buf.append(line)
                if len(buf) >= batch:
                    yield buf
                    buf = []
    if buf:
        yield buf


def check_utf8(path: Path, chunk: int = 1 << 20) -> None:
    """ValueError naming `path` and the byte offset when it is not valid UTF-8 (read in chunks)."""
    dec = codecs.getincrementaldecoder("utf-8")()
    offset = 0
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            pending = len(dec.getstate()[0])  # bytes of a character cut by the last block
            try:
                dec.decode(block, final=not block)
            except UnicodeDecodeError as e:
                at = offset - pending + e.start
                raise ValueError(f"{path} is not valid UTF-8 (byte {at}: {e.reason}); "
                                 f"convert it first, e.g. `iconv -f latin1 -t utf-8`") from None
            if not block:
                return
            offset += len(block)


def train_tokenizer_from_text(text: str, vocab_size: int = DEFAULT_VOCAB_SIZE, min_frequency: int = 2):
    """Like `train_tokenizer`, from a string (handy in notebooks and tests)."""
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "text.txt"
        p.write_text(text, encoding="utf-8")
        return train_tokenizer([p], vocab_size, min_frequency)


def eot_id(tok) -> int:
    """The id of `<|endoftext|>` in `tok` (raises if the tokenizer has none)."""
    i = tok.token_to_id(EOT)
    if i is None:
        raise ValueError(f"this tokenizer has no {EOT} token; train it with train_tokenizer()")
    return i


def vocab_size(tok) -> int:
    """Number of ids, special tokens included: the model's embedding size."""
    return tok.get_vocab_size(with_added_tokens=True)


def encode(tok, text: str) -> list[int]:
    """Token ids of `text` (EOT written in the text becomes the EOT id)."""
    return tok.encode(text, add_special_tokens=False).ids


def decode(tok, ids) -> str:
    """Text of `ids`, keeping special tokens, so decode(tok, encode(tok, s)) == s."""
    return tok.decode([int(i) for i in ids], skip_special_tokens=False)


def tokenizer_hash(tok) -> str:
    """sha256 (hex) of what decides the token ids: equal hashes mean the same ids for the same text.

    Hashes the model (vocabulary and merges), the added tokens and the normaliser and
    pre-tokenizer settings, written canonically, so the hash does not change when a newer
    `tokenizers` release writes tokenizer.json in a different layout (e.g. merges as pairs).
    """
    j = json.loads(tok.to_str())
    model = dict(j.get("model") or {})
    vocab = model.pop("vocab", None)
    if isinstance(vocab, dict):
        vocab = sorted(vocab.items(), key=lambda kv: (kv[1], kv[0]))
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.pop("merges", None) or []]
    essence = {
        "model": {"type": model.get("type"), "vocab": vocab, "merges": merges},
        "added_tokens": sorted((t["id"], t["content"], bool(t.get("special"))) for t in j.get("added_tokens") or []),
        "normalizer": j.get("normalizer"),
        "pre_tokenizer": j.get("pre_tokenizer"),
    }
    canonical = json.dumps(essence, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def save_tokenizer(tok, path: str | os.PathLike) -> Path:
    """Write `tokenizer.json` atomically (a temporary file, then a rename). Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, tok.to_str(pretty=True).encode("utf-8"))
    return path


def load_tokenizer(path: str | os.PathLike):
    """Read a `tokenizer.json` (or a directory holding one), with clear errors."""
    path = Path(path)
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path} "
                                f"(create one with `xtrain data prepare` or train_tokenizer())")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # tokenizers raises a bare Exception on bad JSON
        raise ValueError(f"{path} is not a valid tokenizer.json ({e}); delete it and prepare again") from e


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` so a reader sees the old file or the new one, never half of one."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
