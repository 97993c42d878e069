"""Benchmark the course's BPE against `tokenizers`: python scripts/bench_bpe.py [--json] [--rounds 3].

The same function is meant for `xtrain bench tokenizer` (xtrain_lessons/measure/bench_tokenizer.py).
"""

import argparse
import json
import sys

from xtrain_lessons.measure.bench_tokenizer import bench_tokenizer, format_results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("corpus", nargs="?", default="data/stories.txt")
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=int, default=100, help="streaming file = corpus repeated this often")
    ap.add_argument("--no-naive", action="store_true", help="skip the naive trainer")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    r = bench_tokenizer(a.corpus, a.vocab_size, a.rounds, a.scale, not a.no_naive,
                        progress=lambda m: print(m, file=sys.stderr))
    print(json.dumps(r, indent=2) if a.json else format_results(r))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
