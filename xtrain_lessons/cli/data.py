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
import sys
import time
from pathlib import Path

import numpy as np

from xtrain_lessons.cli.errors import report
from xtrain_lessons.training.data import (
    TokenDataset,
    default_corpus_path,
    prepare,
    read_documents,
    read_header,
)
from xtrain_lessons.training.data.fetch import KNOWN_FILES, FetchError, fetch
from xtrain_lessons.training.tokenizer import (
    DEFAULT_VOCAB_SIZE,
    decode,
    load_tokenizer,
    train_tokenizer,
    vocab_size,
)


def _prepare(args) -> int:
    text = Path(args.text) if args.text else default_corpus_path()
    t0 = time.perf_counter()
    if args.tokenizer:
        tok = load_tokenizer(args.tokenizer)
        print(f"tokenizer {args.tokenizer}: vocab {vocab_size(tok)}")
    else:
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
        return report("data", e, 1)
