"""Get and prepare training text: fetch TinyStories, encode a corpus to tokens, show stats.

    xtrain data fetch tinystories [--out DIR] [--sha256 HEX] [--url URL]
    xtrain data prepare [TEXT] --out DIR [--vocab-size N] [--val-fraction F] [--tokenizer PATH]
    xtrain data stats DIR

`fetch` downloads to a temporary file and renames it only when the download is complete and
its sha256 is right, so an interrupted or bad download leaves nothing behind. `prepare`
without TEXT uses the corpus shipped with the course (data/stories.txt).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from xtrain_lessons.tokenizer import DEFAULT_VOCAB_SIZE, EOT, atomic_write_bytes

# Files `fetch` knows. sha256 None = not recorded yet: the computed one is printed instead
# (pass --sha256 to enforce one). The sha256 is of the file as downloaded.
KNOWN_FILES = {
    "tinystories": {
        "url": "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/TinyStories-valid.txt",
        "filename": "tinystories-valid.txt",
        "sha256": None,
        "about": "TinyStories validation split (Eldan & Li 2023, CDLA-Sharing-1.0), about 19 MB",
    },
}


class FetchError(RuntimeError):
    """A download that failed; nothing was written."""


# --------------------------------------------------------------------------- fetch
def download(url: str, dest: Path, sha256: str | None = None, progress: bool = True,
             timeout: float = 60.0) -> str:
    """Download `url` to `dest` atomically; return the sha256 of the bytes.

    Raises FetchError (and leaves no file) on an HTTP error, a short read, or a sha256 mismatch.
    """
    from tqdm import tqdm

    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    f = os.fdopen(fd, "wb")
    h = hashlib.sha256()
    try:
        try:
            resp = urllib.request.urlopen(url, timeout=timeout)
        except urllib.error.HTTPError as e:
            raise FetchError(f"download failed: HTTP {e.code} {e.reason} for {url}") from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise FetchError(f"download failed: cannot reach {url} ({reason})") from None
        with resp:
            total = resp.headers.get("Content-Length")
            total = int(total) if total and total.isdigit() else None
            n = 0
            with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024,
                      desc=dest.name, disable=not progress, file=sys.stderr) as bar:
                while True:
                    try:
                        chunk = resp.read(1 << 16)
                    except Exception as e:  # http.client.IncompleteRead, connection reset, timeout
                        raise FetchError(f"download interrupted after {n} bytes: {e!r}") from None
                    if not chunk:
                        break
                    f.write(chunk)
                    h.update(chunk)
                    n += len(chunk)
                    bar.update(len(chunk))
            if total is not None and n != total:
                raise FetchError(f"download interrupted: got {n} of {total} bytes from {url}")
        f.close()
        digest = h.hexdigest()
        if sha256 is not None and digest != sha256.lower():
            raise FetchError(f"sha256 mismatch for {url}: expected {sha256.lower()}, got {digest}. "
                             "The file was not saved")
        os.replace(tmp, dest)
        return digest
    except BaseException:
        f.close()
        Path(tmp).unlink(missing_ok=True)
        raise


def to_eot_lines(text: str) -> str:
    """Normalise document separators to our format: each EOT on a line of its own."""
    docs = [d.strip() for d in text.split(EOT)]
    return f"\n{EOT}\n".join(d for d in docs if d) + "\n"


def fetch(name: str, out_dir: str | os.PathLike = "data", url: str | None = None,
          sha256: str | None = None, progress: bool = True) -> Path:
    """Download a known file into `out_dir` in our `<|endoftext|>` line format; return its path."""
    if name not in KNOWN_FILES:
        raise FetchError(f"unknown dataset {name!r}; known: {', '.join(KNOWN_FILES)}")
    entry = KNOWN_FILES[name]
    url = url or entry["url"]
    sha256 = sha256 or entry["sha256"]
    out_dir = Path(out_dir)
    dest = out_dir / entry["filename"]
    raw = out_dir / f".{entry['filename']}.download"  # hidden; removed below whatever happens
    digest = download(url, raw, sha256=sha256, progress=progress)
    try:
        if sha256 is None:
            print(f"sha256 {digest} (no known checksum to compare with; pass --sha256 to enforce one)")
        else:
            print(f"sha256 {digest} OK")
        data = raw.read_bytes()
        text = data.decode("utf-8", errors="replace")
        n_bad = text.count("\ufffd") - data.decode("utf-8", errors="ignore").count("\ufffd")
        if n_bad:
            print(f"note: {n_bad} invalid UTF-8 byte sequence(s) replaced by U+FFFD")
        atomic_write_bytes(dest, to_eot_lines(text).encode("utf-8"))
    finally:
        raw.unlink(missing_ok=True)
    return dest


# --------------------------------------------------------------------------- prepare / stats
def _prepare(args) -> int:
    from xtrain_lessons.data import default_corpus_path, prepare
    from xtrain_lessons.tokenizer import load_tokenizer, train_tokenizer, vocab_size

    text = Path(args.text) if args.text else default_corpus_path()
    t0 = time.perf_counter()
    if args.tokenizer:
        tok = load_tokenizer(args.tokenizer)
        print(f"tokenizer {args.tokenizer}: vocab {vocab_size(tok)}")
    else:
        from xtrain_lessons.data import read_documents
        read_documents(text)  # clear errors about the text before training
        tok = train_tokenizer([text], args.vocab_size)
        print(f"trained byte-level BPE on {text}: vocab {vocab_size(tok)} in {time.perf_counter() - t0:.1f}s")
    p = prepare(text, args.out, tok, val_fraction=args.val_fraction, seed=args.seed)
    n = p.n_tokens("train") + p.n_tokens("val")
    print(f"wrote {p.out_dir}: train {p.n_tokens('train'):,} tokens ({p.n_documents('train'):,} docs), "
          f"val {p.n_tokens('val'):,} tokens ({p.n_documents('val'):,} docs), {p.dtype}")
    print(f"{p.header['source']['bytes'] / max(n, 1):.2f} bytes/token; "
          f"total {time.perf_counter() - t0:.1f}s")
    return 0


def _stats(args) -> int:
    import numpy as np

    from xtrain_lessons.data import TokenDataset, read_header
    from xtrain_lessons.tokenizer import decode, load_tokenizer

    d, h = read_header(args.dir)
    src = h.get("source", {})
    print(f"{d}")
    print(f"  source       {src.get('path')} ({src.get('bytes', 0):,} bytes, sha256 {src.get('sha256', '')[:12]}…)")
    print(f"  tokenizer    {h['tokenizer_hash'][:12]}…, vocab {h['vocab_size']}, eot id {h.get('eot_id')}")
    print(f"  dtype        {h['dtype']}; split by {h.get('split_by')}, val fraction {h.get('val_fraction')}")
    total = 0
    for split in h["splits"]:
        ds = TokenDataset(d, split)
        info = h["splits"][split]
        used = len(np.unique(np.asarray(ds.tokens))) if len(ds) else 0
        total += len(ds)
        print(f"  {split:5s}        {len(ds):,} tokens, {info.get('n_documents', '?'):,} documents, "
              f"{used} distinct ids")
    if src.get("bytes") and total:
        print(f"  compression  {src['bytes'] / total:.2f} bytes/token")
    tok_path = d / "tokenizer.json"
    if tok_path.is_file() and total:
        tok = load_tokenizer(tok_path)
        ds = TokenDataset(d, "train", tokenizer=tok)
        print("  first tokens " + repr(decode(tok, ds.tokens[:40])))
    return 0


def _fetch(args) -> int:
    path = fetch(args.name, args.out, url=args.url, sha256=args.sha256, progress=not args.quiet)
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    print(f"next: xtrain data prepare {path} --out runs/{args.name} --vocab-size 4096")
    return 0


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="data_command", metavar="<action>")
    p = sub.add_parser("fetch", help="download a known dataset (TinyStories validation split)")
    p.add_argument("name", choices=sorted(KNOWN_FILES))
    p.add_argument("--out", default="data", help="directory to write into (default: ./data)")
    p.add_argument("--url", default=None, help="download from this URL instead")
    p.add_argument("--sha256", default=None, help="expected sha256 of the download")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p = sub.add_parser("prepare", help="train a tokenizer and encode a text into train/val token files")
    p.add_argument("text", nargs="?", default=None,
                   help="UTF-8 text, documents separated by <|endoftext|> (default: the shipped stories)")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--vocab-size", type=int, default=DEFAULT_VOCAB_SIZE,
                   help=f"BPE vocabulary size (default {DEFAULT_VOCAB_SIZE})")
    p.add_argument("--tokenizer", default=None, help="use this tokenizer.json instead of training one")
    p.add_argument("--val-fraction", type=float, default=0.05, help="share of documents for val (0.05)")
    p.add_argument("--seed", type=int, default=0, help="seed of the train/val split")
    p = sub.add_parser("stats", help="describe prepared data")
    p.add_argument("dir", help="directory written by `xtrain data prepare`")


def run(args: argparse.Namespace) -> int:
    action = getattr(args, "data_command", None)
    if action is None:
        print("usage: xtrain data {fetch,prepare,stats} ... (see xtrain data --help)", file=sys.stderr)
        return 2
    try:
        return {"fetch": _fetch, "prepare": _prepare, "stats": _stats}[action](args)
    except (FetchError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
