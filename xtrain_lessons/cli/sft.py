"""Supervised fine-tuning of a run on prompt / response pairs (T20), before RL.

    xtrain sft runs/base --data pairs.jsonl                     # fine-tune on your pairs
    xtrain sft runs/base --data pairs.jsonl --heldout test.jsonl --steps 300
    xtrain sft runs/arith --task arith                          # the course's arithmetic task
    xtrain grpo runs/arith-sft --reward arith ...               # then RL on the same task (T21)

--data: one JSON object per line, {"prompt": "...", "response": "..."} (and an optional
numeric "answer", which the held-out accuracy is graded against). The loss is the negative
log-likelihood of the response tokens only (the prompt and the padding are masked out), summed
and divided by the number of response tokens in the batch; --micro-batch splits a batch into
smaller forwards whose gradients add up to the same step (gradient accumulation). The model
learns to stop: an end-of-text token follows every response.

--task arith generates the arithmetic word problems of training/posttrain/arith.py (a train
and a held-out split, written to OUT/train.jsonl and OUT/heldout.jsonl) instead of --data.
With held-out pairs (--heldout, or the task's), the held-out loss and the greedy accuracy are
printed before, every --eval-every steps, and after.

OUT (default RUN_DIR-sft) is a run directory like the one `xtrain train` writes, so `xtrain
sample`, `xtrain export` and `xtrain grpo` take it: config.json, tokenizer.json, data/ (the base
run's), checkpoints/, metrics.jsonl (per step: loss, lr, tokens, grad_norm, and the held-out
numbers where measured), loss.png, samples.txt (before and after), summary.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xtrain_lessons.runtime.cpu_threads import get_threads, set_blas_threads
from xtrain_lessons.training.checkpoint import CheckpointError
from xtrain_lessons.training.posttrain.arith import make_task
from xtrain_lessons.training.posttrain.pairs import PairsError, read_pairs, write_pairs
from xtrain_lessons.training.posttrain.run_files import check_out
from xtrain_lessons.training.posttrain.sft import SFTConfig
from xtrain_lessons.training.posttrain.sft_run import sft_run
from xtrain_lessons.training.rundir import load_run

# flag -> (SFTConfig field, type, help)
_FLAGS = [
    ("--steps", "steps", int, "optimizer steps"),
    ("--batch-size", "batch_size", int, "pairs per optimizer step"),
    ("--micro-batch", "micro_batch", int, "pairs per forward, 0: the whole batch (smaller: "
     "gradient accumulation, the same step)"),
    ("--lr", "lr", float, "AdamW peak learning rate (linear warmup, cosine to a tenth)"),
    ("--warmup", "warmup", int, "warmup steps"),
    ("--weight-decay", "weight_decay", float, "AdamW weight decay"),
    ("--grad-clip", "grad_clip", float, "global gradient-norm clip (0: off)"),
    ("--seed", "seed", int, "seed of the order of the pairs"),
]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    d = SFTConfig()
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (of `xtrain train`, `xtrain sft` "
                        "or `xtrain grpo`) whose latest checkpoint is fine-tuned")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--data", metavar="PAIRS.jsonl", help="the training pairs, one JSON object per line")
    what.add_argument("--task", choices=["arith"], help="a generated task instead of --data")
    parser.add_argument("--heldout", metavar="PAIRS.jsonl", help="held-out pairs to measure on (default: "
                        "the task's held-out split, or none)")
    parser.add_argument("--out", metavar="DIR", help="run directory to write (default RUN_DIR-sft)")
    for flag, field, typ, hlp in _FLAGS:
        parser.add_argument(flag, dest=field, type=typ, default=getattr(d, field),
                            help=f"{hlp} (default {getattr(d, field)})")
    parser.add_argument("--eval-every", type=int, default=50,
                        help="measure on the held-out pairs every N steps (0: before and after only; default 50)")
    parser.add_argument("--max-new-tokens", type=int, default=24,
                        help="length limit of the greedy completions graded for accuracy (default 24)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the engine (default 1)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="tqdm progress bar")


def _fail(msg: str) -> int:
    print(f"xtrain sft: error: {msg}", file=sys.stderr)
    return 2


def _task_rows(out: Path) -> tuple[list, list]:
    train, heldout = make_task()
    rows = [[{"prompt": p.prompt, "response": p.response, "answer": p.answer} for p in split]
            for split in (train, heldout)]
    out.mkdir(parents=True, exist_ok=True)
    write_pairs(out / "train.jsonl", rows[0])
    write_pairs(out / "heldout.jsonl", rows[1])
    return rows[0], rows[1]


def run(args: argparse.Namespace) -> int:
    out = Path(args.out or str(Path(args.run_dir)).rstrip("/") + "-sft")
    try:
        cfg = SFTConfig(**{f: getattr(args, f) for _, f, _, _ in _FLAGS}).validate()
        if args.eval_every < 0 or args.max_new_tokens < 1:
            raise ValueError("--eval-every must be >= 0 and --max-new-tokens >= 1")
        model, tok, ck = load_run(args.run_dir)
        check_out(out)
        if args.task:
            rows, heldout = _task_rows(out)
            args.data = out / "train.jsonl"
        else:
            rows = read_pairs(args.data)
            heldout = []
        if args.heldout:
            heldout = read_pairs(args.heldout)
    except (PairsError, ValueError, FileNotFoundError, CheckpointError) as e:
        return _fail(str(e))
    threads_before = get_threads()
    set_blas_threads(args.threads)
    try:
        return sft_run(args, cfg, model, tok, ck, rows, heldout, out)
    except ValueError as e:  # a pair longer than the model's context
        return _fail(str(e))
    finally:
        set_blas_threads(threads_before)
