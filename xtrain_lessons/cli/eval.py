"""Score a trained run on a held-out text file: loss, perplexity and bits per byte.

    xtrain eval runs/mine --data study/eval.txt
    xtrain eval runs/mine --data held_out.txt --json      # one JSON line

The whole file is scored in non-overlapping windows of the run's seq_len (the last one
shorter), each document followed by <|endoftext|>; bits per byte divide by the file's own
bytes (documents + 1 per document end), so runs with different tokenizers compare on the
same bytes (xtrain_lessons.measure.evaluate says exactly how).
"""

from __future__ import annotations

import argparse
import json
import sys

from xtrain_lessons.measure.evaluate import EvalError, evaluate_run


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `xtrain train`")
    parser.add_argument("--data", required=True, metavar="FILE", help="held-out UTF-8 text file")
    parser.add_argument("--seq-len", type=int, default=None, help="window length (default: the run's)")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per forward pass")
    parser.add_argument("--json", action="store_true", help="print one JSON line instead of text")


def run(args: argparse.Namespace) -> int:

    try:
        r = evaluate_run(args.run_dir, args.data, seq_len=args.seq_len, batch_size=args.batch_size,
                         progress=not args.json and sys.stderr.isatty())
    except EvalError as e:
        print(f"xtrain eval: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(r))
    else:
        print(f"{r['run']} (step {r['step']}) on {r['data']}: loss {r['loss']:.4f} nats/token, "
              f"ppl {r['ppl']:.2f}, {r['bits_per_byte']:.4f} bits/byte "
              f"({r['n_tokens']:,} tokens, {r['n_bytes']:,} bytes, {r['n_windows']} windows of "
              f"{r['seq_len']})")
    return 0


if __name__ == "__main__":  # until `xtrain eval` is registered in cli.py
    p = argparse.ArgumentParser(prog="xtrain eval", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(p)
    sys.exit(run(p.parse_args()))
