"""Generate text from a trained run (its latest checkpoint).

    xtrain sample runs/mine --prompt "Once upon a time" --max-new-tokens 80
    xtrain sample runs/mine --prompt "The dog" --temperature 0     # greedy
    xtrain sample runs/mine --prompt "Tom" --top-k 40 --top-p 0.9 --seed 3 --num-samples 3

Generation stops at <|endoftext|> or after --max-new-tokens tokens (default 100, at most the
model's context length). The same seed gives the same text.
"""

from __future__ import annotations

import argparse
import math
import sys

from xtrain_lessons.cli.device_check import require_device
from xtrain_lessons.cli.errors import UsageError, report
from xtrain_lessons.model.generate import generate
from xtrain_lessons.training.checkpoint import CheckpointError
from xtrain_lessons.training.rundir import load_run
from xtrain_lessons.training.tokenizer import eot_id


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `xtrain train`")
    parser.add_argument("--prompt", default="Once upon a time", help="text to continue")
    parser.add_argument("--max-new-tokens", type=int, default=None,
                        help="tokens to generate (default 100; at most the model's context length)")
    parser.add_argument("--temperature", type=float, default=0.8, help="0 means greedy")
    parser.add_argument("--top-k", type=int, default=None)
    parser.add_argument("--top-p", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--num-samples", type=int, default=1)


def check_sampling(args: argparse.Namespace) -> None:
    """The sampling flags, before anything is loaded (UsageError naming the flag)."""
    t, k, p = args.temperature, args.top_k, args.top_p
    if not (math.isfinite(t) and t >= 0):
        raise UsageError(f"--temperature must be a finite number >= 0 (0: greedy), got {t}")
    if k is not None and k < 1:
        raise UsageError(f"--top-k must be >= 1 (leave it out for no top-k), got {k}")
    if p is not None and not (0.0 < p <= 1.0):
        raise UsageError(f"--top-p must be in (0, 1] (leave it out for no nucleus sampling), got {p}")
    if args.max_new_tokens is not None and args.max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.num_samples < 1:
        raise UsageError(f"--num-samples must be >= 1, got {args.num_samples}")


def new_tokens(args: argparse.Namespace, context: int) -> int:
    """--max-new-tokens, at most the model's context (a longer text would not see its start)."""
    if args.max_new_tokens is None:
        return min(100, context)
    if args.max_new_tokens > context:
        raise UsageError(f"--max-new-tokens {args.max_new_tokens} is more than the model's context of "
                         f"{context} tokens: give at most {context}")
    return args.max_new_tokens


def run(args: argparse.Namespace) -> int:
    check_sampling(args)
    where = require_device("sample")  # the device asked for is used, or refused here in one line
    try:
        model, tok, ck = load_run(args.run_dir)
    except (FileNotFoundError, CheckpointError) as e:
        return report("sample", e, 2)
    if where == "cuda":
        model.to("cuda")
    args.max_new_tokens = new_tokens(args, model.config.max_seq_len)
    ids = tok.encode(args.prompt).ids or [eot_id(tok)]
    print(f"# {args.run_dir} step {ck.step} on {where}, temperature {args.temperature}, top_k {args.top_k}, "
          f"top_p {args.top_p}, seed {args.seed}", file=sys.stderr)
    for i in range(args.num_samples):
        new = generate(model, ids, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                       top_k=args.top_k, top_p=args.top_p, eos_id=eot_id(tok), seed=args.seed + i)
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        print(args.prompt + tok.decode(new))
    return 0
