"""Generate text from a trained run (its latest checkpoint).

    xtrain sample runs/mine --prompt "Once upon a time" --max-new-tokens 80
    xtrain sample runs/mine --prompt "The dog" --temperature 0     # greedy
    xtrain sample runs/mine --prompt "Tom" --top-k 40 --top-p 0.9 --seed 3 --num-samples 3

Generation stops at <|endoftext|> or after --max-new-tokens tokens. The same seed gives
the same text.
"""

from __future__ import annotations

import argparse
import sys

from xtrain_lessons.model.generate import generate
from xtrain_lessons.training.checkpoint import CheckpointError
from xtrain_lessons.training.rundir import load_run
from xtrain_lessons.training.tokenizer import eot_id


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `xtrain train`")
    parser.add_argument("--prompt", default="Once upon a time", help="text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=100)
    parser.add_argument("--temperature", type=float, default=0.8, help="0 means greedy")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-samples", type=int, default=1)


def run(args: argparse.Namespace) -> int:

    try:
        model, tok, ck = load_run(args.run_dir)
    except (FileNotFoundError, CheckpointError) as e:
        print(f"xtrain sample: error: {e}", file=sys.stderr)
        return 2
    ids = tok.encode(args.prompt).ids or [eot_id(tok)]
    print(f"# {args.run_dir} step {ck.step}, temperature {args.temperature}, top_k {args.top_k}, "
          f"top_p {args.top_p}, seed {args.seed}", file=sys.stderr)
    for i in range(args.num_samples):
        new = generate(model, ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                       top_k=args.top_k, top_p=args.top_p, eos_id=eot_id(tok), seed=args.seed + i)
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        print(args.prompt + tok.decode(new))
    return 0
