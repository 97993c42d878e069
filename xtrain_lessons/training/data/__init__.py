"""Training data as a token stream on disk: encode a corpus once, then sample windows fast.

`prepare` reads a UTF-8 text whose documents are separated by `<|endoftext|>`, splits the
*documents* into train and val (deterministically, so no document is in both), encodes them
with EOT after each document, and writes, atomically:

    out_dir/train.bin      raw token ids (uint16 when vocab <= 65536, else uint32)
    out_dir/val.bin
    out_dir/tokenizer.json the tokenizer that made them
    out_dir/data.json      the header: dtype, token counts, vocab size, tokenizer hash, source

`TokenDataset` memory-maps one split (nothing is loaded into RAM) and cuts random windows:

    ds = TokenDataset("runs/data", split="train", tokenizer=tok)
    x, y = ds.get_batch(batch_size=8, seq_len=64, rng=np.random.default_rng(0))
    # x, y: int64 [B, T]; y[b, t] is the token that follows x[b, t]

No pickle anywhere: JSON for the header, raw little-endian integers for the tokens.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import xtrain_lessons
from xtrain_lessons.training.tokenizer import (
    DEFAULT_VOCAB_SIZE,
    EOT,
    atomic_write_bytes,
    eot_id,
    load_tokenizer,
    safe_pieces,
    save_tokenizer,
    tokenizer_hash,
    train_tokenizer,
    vocab_size,
)

FORMAT = "xtrain-tokens"
FORMAT_VERSION = 1
HEADER = "data.json"
SPLITS = ("train", "val")


# --------------------------------------------------------------------------- finding the corpus
def default_corpus_path() -> Path:
    """The shipped corpus `data/stories.txt`: next to the package (a source checkout), else ./data."""
    candidates = [Path(xtrain_lessons.__file__).resolve().parents[1] / "data" / "stories.txt",
                  Path.cwd() / "data" / "stories.txt"]
    for c in candidates:
        if c.is_file():
            return c
    looked = ", ".join(str(c) for c in candidates)
    raise FileNotFoundError(
        f"could not find the course corpus data/stories.txt (looked in: {looked}). "
        "Pass a text file with --data PATH (or text_path=...), or regenerate it with "
        "`python scripts/make_corpus.py` in a checkout of xtrain-lessons.")


# --------------------------------------------------------------------------- reading text
def read_documents(text_path: str | os.PathLike) -> tuple[list[str], str]:
    """The documents of a UTF-8 file split at EOT (stripped, empty ones dropped), and its sha256.

    A file without any EOT is one document.
    """
    path = Path(text_path)
    if not path.exists():
        raise FileNotFoundError(f"text file not found: {path}")
    if not path.is_file():
        raise ValueError(f"{path} is not a file")
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        bad = raw[e.start:e.start + 1].hex()
        raise ValueError(f"{path} is not valid UTF-8: byte 0x{bad} at offset {e.start} ({e.reason}). "
                         "Convert it to UTF-8 first (e.g. `iconv -f latin1 -t utf-8`).") from None
    docs = [d.strip() for d in text.split(EOT)]
    docs = [d for d in docs if d]
    if not docs:
        raise ValueError(f"{path} is empty: no text to train on")
    return docs, hashlib.sha256(raw).hexdigest()


def split_documents(n_docs: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices of the train and val documents: a seeded random choice, each kept in file order."""
    if not 0.0 <= val_fraction < 1.0:
        raise ValueError(f"val_fraction must be in [0, 1), got {val_fraction}")
    n_val = int(round(n_docs * val_fraction))
    if val_fraction > 0 and n_docs >= 2:
        n_val = min(max(n_val, 1), n_docs - 1)  # both splits get at least one document
    perm = np.random.default_rng(seed).permutation(n_docs)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def token_dtype(n_vocab: int) -> np.dtype:
    """uint16 holds ids < 65536; bigger vocabularies need uint32."""
    if n_vocab <= 0:
        raise ValueError(f"vocab size must be positive, got {n_vocab}")
    if n_vocab <= 2 ** 16:
        return np.dtype("<u2")
    if n_vocab <= 2 ** 32:
        return np.dtype("<u4")
    raise ValueError(f"vocab size {n_vocab} does not fit in uint32")


# --------------------------------------------------------------------------- prepare
@dataclass(frozen=True)
class PreparedData:
    """What `prepare` wrote: the directory and the header it recorded there."""
    out_dir: Path
    header: dict = field(repr=False)

    @property
    def dtype(self) -> str:
        return self.header["dtype"]

    @property
    def vocab_size(self) -> int:
        return self.header["vocab_size"]

    @property
    def tokenizer_hash(self) -> str:
        return self.header["tokenizer_hash"]

    def n_tokens(self, split: str = "train") -> int:
        return self.header["splits"][split]["n_tokens"]

    def n_documents(self, split: str = "train") -> int:
        return self.header["splits"][split]["n_documents"]

    def __repr__(self) -> str:
        h = self.header
        return (f"PreparedData({str(self.out_dir)!r}, train={self.n_tokens('train'):,} tokens, "
                f"val={self.n_tokens('val'):,} tokens, vocab_size={h['vocab_size']}, dtype={h['dtype']})")


def prepare(text_path: str | os.PathLike, out_dir: str | os.PathLike, tokenizer,
            val_fraction: float = 0.05, seed: int = 0) -> PreparedData:
    """Encode a corpus once into `out_dir` (train.bin, val.bin, tokenizer.json, data.json).

    Documents (separated by `<|endoftext|>`) are split between train and val, never cut;
    each document is followed by EOT in the token stream. A file holding a single document
    cannot be split by document: its tokens are split by position instead (recorded in the
    header as `"split_by": "tokens"`).
    """
    t0 = time.perf_counter()
    text_path, out_dir = Path(text_path), Path(out_dir)
    docs, source_sha = read_documents(text_path)
    n_vocab, eot = vocab_size(tokenizer), eot_id(tokenizer)
    dtype = token_dtype(n_vocab)

    def encode_docs(texts: list[str]) -> np.ndarray:
        parts = []
        pieces, ends = [], set()  # a long document in pieces: the same ids, bounded memory
        for text in texts:
            pieces.extend(safe_pieces(text))
            ends.add(len(pieces) - 1)
        i0 = 0
        while i0 < len(pieces):  # batches of ~1M characters: the Encodings are ~200 B/token
            i1, n = i0, 0
            while i1 < len(pieces) and (n < (1 << 20) or i1 == i0):
                n, i1 = n + len(pieces[i1]), i1 + 1
            for i, enc in enumerate(tokenizer.encode_batch(pieces[i0:i1], add_special_tokens=False), start=i0):
                parts.append(np.asarray(enc.ids, dtype=dtype))
                if i in ends:
                    parts.append(np.array([eot], dtype=dtype))
            i0 = i1
        return np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)

    if len(docs) >= 2:
        train_idx, val_idx = split_documents(len(docs), val_fraction, seed)
        arrays = {"train": encode_docs([docs[i] for i in train_idx]),
                  "val": encode_docs([docs[i] for i in val_idx])}
        n_docs = {"train": len(train_idx), "val": len(val_idx)}
        split_by = "documents"
    else:
        ids = encode_docs(docs)
        cut = len(ids) - int(round(len(ids) * val_fraction))
        arrays = {"train": ids[:cut], "val": ids[cut:]}
        n_docs = {"train": 1, "val": 0}
        split_by = "tokens"

    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / HEADER).unlink(missing_ok=True)  # no old header may describe half-new files
    for split, ids in arrays.items():
        atomic_write_bytes(out_dir / f"{split}.bin", ids.astype(dtype).tobytes())
    save_tokenizer(tokenizer, out_dir / "tokenizer.json")
    header = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "dtype": dtype.name,
        "vocab_size": n_vocab,
        "eot_id": eot,
        "tokenizer_hash": tokenizer_hash(tokenizer),
        "split_by": split_by,
        "val_fraction": val_fraction,
        "seed": seed,
        "splits": {s: {"file": f"{s}.bin", "n_tokens": int(len(arrays[s])), "n_documents": n_docs[s]}
                   for s in SPLITS},
        "source": {"path": str(text_path.resolve()), "sha256": source_sha,
                   "bytes": text_path.stat().st_size, "n_documents": len(docs)},
        "seconds": round(time.perf_counter() - t0, 3),
    }
    # The header goes last: a directory with data.json is a complete one.
    atomic_write_bytes(out_dir / HEADER, (json.dumps(header, indent=2) + "\n").encode("utf-8"))
    return PreparedData(out_dir, header)


def read_header(path_or_dir: str | os.PathLike) -> tuple[Path, dict]:
    """(directory, header) of prepared data; `path_or_dir` is the directory or its data.json."""
    p = Path(path_or_dir)
    d = p.parent if p.name == HEADER or p.suffix == ".bin" else p
    hp = d / HEADER
    if not hp.is_file():
        raise FileNotFoundError(f"no prepared data at {d} ({HEADER} is missing); "
                                f"run `xtrain data prepare TEXT --out {d}` first")
    try:
        header = json.loads(hp.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{hp} is not valid JSON ({e}); prepare the data again") from None
    missing = [k for k in ("format", "dtype", "vocab_size", "tokenizer_hash", "splits") if k not in header]
    if missing or header.get("format") != FORMAT:
        raise ValueError(f"{hp} is not an {FORMAT} header (missing {missing or 'format'}); prepare the data again")
    if header.get("version", 0) > FORMAT_VERSION:
        raise ValueError(f"{hp} has format version {header['version']}; this xtrain_lessons reads "
                         f"up to {FORMAT_VERSION}. Update xtrain-lessons or prepare the data again")
    return d, header


def ensure_prepared(out_dir: str | os.PathLike, text_path: str | os.PathLike | None = None,
                    vocab_size: int = DEFAULT_VOCAB_SIZE, val_fraction: float = 0.05,
                    seed: int = 0) -> PreparedData:
    """Prepared data for `text_path` (default: the shipped corpus) in `out_dir`, made once.

    Reuses `out_dir` when its header matches the text's sha256 and the requested settings;
    otherwise trains a byte-level BPE tokenizer of `vocab_size` on the text and prepares.
    """
    text_path = Path(text_path) if text_path is not None else default_corpus_path()
    out_dir = Path(out_dir)
    if (out_dir / HEADER).is_file():
        try:
            _, h = read_header(out_dir)
            sha = hashlib.sha256(text_path.read_bytes()).hexdigest()
            if (h["source"]["sha256"] == sha and h.get("requested_vocab_size") == vocab_size
                    and h["val_fraction"] == val_fraction and h["seed"] == seed):
                return PreparedData(out_dir, h)
        except (ValueError, KeyError, OSError):
            pass  # stale or broken: prepare again
    read_documents(text_path)  # clear errors before spending time on training
    tok = train_tokenizer([text_path], vocab_size)
    prepared = prepare(text_path, out_dir, tok, val_fraction, seed)
    header = dict(prepared.header, requested_vocab_size=vocab_size)
    atomic_write_bytes(out_dir / HEADER, (json.dumps(header, indent=2) + "\n").encode("utf-8"))
    return PreparedData(out_dir, header)


# --------------------------------------------------------------------------- reading tokens
class TokenDataset:
    """One split of prepared data, memory-mapped, with random next-token windows.

    `tokenizer` (a Tokenizer or its hash string) is optional; when given, it must be the
    one the data was made with, else ids would mean different words.
    """

    def __init__(self, path_or_dir: str | os.PathLike, split: str = "train", tokenizer=None,
                 check_ids: bool = True):
        self.dir, self.header = read_header(path_or_dir)
        h = self.header
        if split not in h["splits"]:
            raise ValueError(f"unknown split {split!r}; {self.dir} has {sorted(h['splits'])}")
        if tokenizer is not None:
            want = tokenizer if isinstance(tokenizer, str) else tokenizer_hash(tokenizer)
            if want != h["tokenizer_hash"]:
                raise ValueError(
                    f"tokenizer mismatch: the data in {self.dir} was encoded with tokenizer "
                    f"{h['tokenizer_hash'][:12]}…, but the given tokenizer is {want[:12]}…. "
                    f"Use {self.dir / 'tokenizer.json'} or prepare the data again with this tokenizer")
        self.split = split
        self.vocab_size = int(h["vocab_size"])
        self.dtype = np.dtype(h["dtype"]).newbyteorder("<")
        info = h["splits"][split]
        self.path = self.dir / info["file"]
        n = int(info["n_tokens"])
        if not self.path.is_file():
            raise FileNotFoundError(f"{self.path} is missing; prepare the data again")
        size = self.path.stat().st_size
        if size != n * self.dtype.itemsize:
            raise ValueError(f"{self.path} holds {size} bytes but the header says {n} {h['dtype']} tokens "
                             f"({n * self.dtype.itemsize} bytes): the file is truncated or stale; "
                             "prepare the data again")
        # np.memmap cannot map an empty file; an empty split is a zero-length array.
        self.tokens = (np.memmap(self.path, dtype=self.dtype, mode="r", shape=(n,)) if n
                       else np.zeros(0, dtype=self.dtype))
        if check_ids:
            self.check_ids()

    def check_ids(self, chunk: int = 1 << 22) -> None:
        """Raise if any token id is >= vocab_size, naming the first bad id and its position."""
        for start in range(0, len(self.tokens), chunk):
            part = self.tokens[start:start + chunk]
            bad = np.flatnonzero(part >= self.vocab_size)
            if bad.size:
                pos = start + int(bad[0])
                raise ValueError(f"{self.path}: token id {int(self.tokens[pos])} at position {pos} is out of "
                                 f"range for vocab_size {self.vocab_size}; the data is corrupt or was "
                                 "made with another tokenizer")

    def __len__(self) -> int:
        return len(self.tokens)

    def __repr__(self) -> str:
        return f"TokenDataset({str(self.dir)!r}, split={self.split!r}, n_tokens={len(self):,})"

    def _check_window(self, seq_len: int) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len must be >= 1, got {seq_len}")
        if len(self) < seq_len + 1:
            raise ValueError(f"the {self.split} split has {len(self)} tokens, fewer than one window of "
                             f"seq_len + 1 = {seq_len + 1}; use a shorter seq_len or more text")

    def get_batch(self, batch_size: int, seq_len: int, rng: np.random.Generator):
        """Random windows: x, y int64 [batch_size, seq_len] with y[:, t] = token after x[:, t]."""
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy Generator (np.random.default_rng(seed)), got {type(rng).__name__}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._check_window(seq_len)
        starts = rng.integers(0, len(self) - seq_len, size=batch_size)  # start + seq_len < len
        idx = starts[:, None] + np.arange(seq_len + 1)  # (B, T+1)
        win = self.tokens[idx].astype(np.int64)
        return np.ascontiguousarray(win[:, :-1]), np.ascontiguousarray(win[:, 1:])

    def iter_batches(self, batch_size: int, seq_len: int, max_batches: int | None = None):
        """Non-overlapping windows in order, for evaluation: yields (x, y) like get_batch.

        The last batch may be smaller; tokens after the last full window are skipped.
        """
        self._check_window(seq_len)
        n_windows = (len(self) - 1) // seq_len
        starts = np.arange(n_windows) * seq_len
        if max_batches is not None:
            starts = starts[:max_batches * batch_size]
        for i in range(0, len(starts), batch_size):
            idx = starts[i:i + batch_size, None] + np.arange(seq_len + 1)
            win = self.tokens[idx].astype(np.int64)
            yield np.ascontiguousarray(win[:, :-1]), np.ascontiguousarray(win[:, 1:])

    def tokenizer(self):
        """The tokenizer saved beside the data."""
        return load_tokenizer(self.dir / "tokenizer.json")
