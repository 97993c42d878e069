"""Train a tiny Qwen3-style model on a text file (default: the shipped stories corpus).

With no arguments: trains a byte-level BPE tokenizer on data/stories.txt, tokenizes it,
and trains the "tiny" preset for a few minutes on the CPU, printing validation loss and
samples as it goes. Everything lands in a run directory (default runs/<timestamp>):
tokenizer.json, data/, config.json, checkpoints/, metrics.jsonl, samples.txt, loss.png,
summary.json.

Settings come from, in increasing priority: the defaults (xtrain_lessons.training.loop.TrainConfig),
--config FILE (TOML or JSON, keys as in TrainConfig), then the flags given here.

    xtrain train                                   # the default run
    xtrain train --data my.txt --steps 3000 --out runs/mine
    xtrain train --config run.toml --max-lr 1e-3
    xtrain train --resume runs/mine [--steps 5000]  # continue exactly where it stopped
    xtrain train --attention flash --recompute --dropout 0.1   # T13, T14, T18 switches
At the end the model is exported to RUN_DIR/hf/ in the Hugging Face layout (T09) and, when
transformers is installed, loaded there and compared with the engine (greedy tokens, logits).
Ctrl-C (or SIGTERM) stops at the end of the current step and saves a checkpoint. The default schedule
(no --steps, no --config) also stops, with a checkpoint, after 540 s of wall time, so it fits
in 10 minutes even on a slow or busy machine; --time-limit changes that.
"""

from __future__ import annotations

import argparse
import json
import os

from xtrain_lessons.interop.hf import ExportError, closed_loop_check, export_hf
from xtrain_lessons.cli.device_check import require_device
from xtrain_lessons.cli.errors import UsageError, report
from xtrain_lessons.training.checkpoint import CheckpointError
from xtrain_lessons.training.config import DEFAULT_RUN_TIME_LIMIT, TrainConfig
from xtrain_lessons.training.loop import train

# flag name -> (TrainConfig field, type, help)
_FLAGS = [
    ("--data", "data", str, "UTF-8 text file, documents separated by <|endoftext|> lines"),
    ("--out", "out", str, "run directory (default runs/<timestamp>)"),
    ("--steps", "steps", int, "number of optimizer steps (the cosine schedule spans them)"),
    ("--preset", "preset", str, "model preset (xtrain_lessons.model.qwen3.PRESETS): tiny, test, ..."),
    ("--seed", "seed", int, "seed of the model init and the data stream"),
    ("--tokenizer", "tokenizer", str, "use this tokenizer.json instead of training one on --data"),
    ("--vocab-size", "vocab_size", int, "vocabulary size when training the tokenizer"),
    ("--tokenizer-impl", "tokenizer_impl", str, "who trains and runs the BPE: course (the course's own, "
     "phase T05b; default) or hf (the tokenizers library); the same tokenizer.json either way"),
    ("--batch-size", "batch_size", int, "sequences per step"),
    ("--seq-len", "seq_len", int, "tokens per sequence"),
    ("--max-lr", "max_lr", float, "peak learning rate (after warmup)"),
    ("--min-lr", "min_lr", float, "final learning rate (end of the cosine)"),
    ("--warmup", "warmup", int, "linear warmup steps"),
    ("--weight-decay", "weight_decay", float, "AdamW decoupled weight decay (2-D weights only)"),
    ("--grad-clip", "grad_clip", float, "global gradient-norm clip (0: off)"),
    ("--spike-factor", "spike_factor", float, "stop when a loss exceeds this x the lowest so far "
     "(divergence guard; 0: off)"),
    ("--eval-every", "eval_every", int, "validation every N steps (0: never)"),
    ("--eval-batches", "eval_batches", int, "batches per validation"),
    ("--log-every", "log_every", int, "T07b: steps between host synchronisations (loss, grad norm, NaN "
     "check read every N steps; a bad step's update is skipped on the device). 0: 1 on the CPU, "
     "10 on a GPU"),
    ("--sample-every", "sample_every", int, "print a sample every N steps (0: never)"),
    ("--sample-prompt", "sample_prompt", str, "prompt of the periodic samples"),
    ("--sample-tokens", "sample_tokens", int, "tokens per sample"),
    ("--checkpoint-every", "checkpoint_every", int, "checkpoint every N steps (0: only at the end)"),
    ("--keep-checkpoints", "keep_checkpoints", int, "how many checkpoints to keep"),
    ("--time-limit", "time_limit", float, "stop (with a checkpoint) after this many seconds (0: none; "
     "default: none, or 540 for the default schedule, i.e. without --steps or --config)"),
    ("--threads", "threads", int, "CPU threads of the engine: its matmuls and row blocks "
     "(default 0: every core, up to 8, shared among the processes of `xtrain launch`; the same "
     "results with any count)"),
    ("--accum-steps", "accum_steps", int, "T16: micro-batches of --batch-size per optimizer step "
     "(gradient accumulation; under `xtrain launch` each rank takes --batch-size rows)"),
    ("--dtype", "dtype", str, "compute dtype: float32, bf16 or fp16 (T12/T12b mixed precision: low-precision "
     "copies of float32 master weights; fp16 with dynamic loss scaling)"),
    ("--loss-scale", "loss_scale", float, "fp16: a fixed loss scale (default 0: dynamic, from 2^16; "
     "1: no scaling, to see fp16 gradients underflow)"),
]


def _parse_value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE", help="TOML or JSON file of TrainConfig settings")
    parser.add_argument("--resume", metavar="RUN_DIR",
                        help="continue the run in RUN_DIR from its latest checkpoint")
    parser.add_argument("--from-checkpoint", metavar="STEP_DIR", default=None,
                        help="with --resume: continue from this checkpoint (e.g. step_00000400) instead "
                        "of the latest; newer ones are set aside")
    parser.add_argument("--name", help="run directory runs/NAME (instead of --out)")
    for flag, dest, typ, hlp in _FLAGS:
        parser.add_argument(flag, dest=dest, type=typ, default=None, help=hlp)
    parser.add_argument("--model", dest="model_set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a model preset field, e.g. --model n_layers=2 (repeatable)")
    parser.add_argument("--stop-at", type=int, default=None,
                        help="stop after this many steps without changing the schedule (then --resume)")
    parser.add_argument("--attention", choices=["composed", "flash"], default=None,
                        help="attention path: composed (T05) or flash (T14)")
    parser.add_argument("--recompute", action="store_true", default=None,
                        help="recompute each block's activations in backward (T13)")
    parser.add_argument("--dropout", type=float, default=None, metavar="P",
                        help="dropout probability at the residual sites (T18)")
    parser.add_argument("--no-cuda-graph", dest="cuda_graph", action="store_false", default=None,
                        help="--device cuda: run every step eagerly. By default the step (forward, backward, "
                        "clip, AdamW) is captured once per batch shape as a CUDA graph and replayed with one "
                        "launch, its capture checked bit for bit against the eager step (T07b); lr, the batch, "
                        "dropout's stream and fp16's loss scale are read from device memory at each replay. "
                        "Features that need the host inside a step (xtrain launch, --log-every 1) keep it "
                        "eager, with one line saying so")
    parser.add_argument("--no-export", dest="export", action="store_false",
                        help="do not export RUN_DIR/hf/ (Hugging Face layout) at the end")
    parser.add_argument("--no-hf-check", dest="hf_check", action="store_false",
                        help="export, but skip the closed-loop comparison in transformers")
    bar = parser.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="show the progress bar (default: when stderr is a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false")


def asked_dtype(args: argparse.Namespace) -> str | None:
    """The compute dtype this run will use, as far as it can be told before any work: the flag, else
    the --config file's, else the resumed run's config.json's (None when none of them says; their
    errors are reported where they are read)."""
    if args.dtype:
        return args.dtype
    try:
        if args.config and not args.resume:
            return TrainConfig.from_file(args.config).dtype
        if args.resume:
            with open(os.path.join(args.resume, "config.json")) as f:
                return json.load(f).get("train", {}).get("dtype")
    except (ValueError, OSError, AttributeError):
        return None
    return None


def run(args: argparse.Namespace) -> int:
    require_device("train", asked_dtype(args))  # before any work: the GPU asked for is there, or one line
    overrides = {dest: getattr(args, dest) for _, dest, _, _ in _FLAGS if getattr(args, dest) is not None}
    if args.name:
        if "out" in overrides:
            raise UsageError("give --out or --name, not both")
        overrides["out"] = f"runs/{args.name}"
    if args.model_set:
        model = {}
        for item in args.model_set:
            if "=" not in item:
                raise UsageError(f"--model expects KEY=VALUE, got {item!r}")
            k, v = item.split("=", 1)
            model[k.strip()] = _parse_value(v.strip())
        overrides["model"] = model
    if getattr(args, "cuda_graph", None) is not None:
        overrides["cuda_graph"] = args.cuda_graph
    switches = {"attention": args.attention, "recompute": args.recompute, "dropout": args.dropout}
    switches = {k: v for k, v in switches.items() if v is not None}
    if switches:
        overrides["model"] = {**overrides.get("model", {}), **switches}
    try:
        if args.resume:
            if args.config:
                raise UsageError("--config cannot be combined with --resume "
                                 "(the run's own config.json is used; pass flags to change it)")
            overrides.pop("out", None)
            result = train(resume=args.resume, overrides=overrides, stop_at=args.stop_at,
                           progress=args.progress, from_checkpoint=args.from_checkpoint)
        else:
            if args.from_checkpoint:
                raise UsageError("--from-checkpoint needs --resume RUN_DIR")
            cfg = TrainConfig.from_file(args.config) if args.config else TrainConfig()
            if not args.config and "steps" not in overrides and "time_limit" not in overrides:
                # the default schedule is promised to fit in 10 minutes: guard it on slow machines
                overrides["time_limit"] = DEFAULT_RUN_TIME_LIMIT
            result = train(cfg, overrides=overrides, stop_at=args.stop_at, progress=args.progress)
    except (ValueError, FileNotFoundError) as e:
        return report("train", e, 2 if not isinstance(e, CheckpointError) else 1)
    if result.status == "diverged":
        return 1
    if result.status == "interrupted":
        return 130
    if os.environ.get("RANK", "0") != "0":  # T17: under `xtrain launch`, rank 0 exports
        return 0
    if args.export and result.step > 0:
        export_and_check(result, check=args.hf_check)
    return 0


CHECK_PROMPTS = ["Once upon a time", "One day, a little girl named", "The dog was"]


def export_and_check(result, check: bool = True) -> None:
    """T09's closed loop: export RUN_DIR/hf/, then let transformers load it and compare."""
    hf_dir = result.run_dir / "hf"
    try:
        export_hf(result.model, result.tokenizer, hf_dir)
    except ExportError as e:
        print(f"export skipped: {e}")
        return
    print(f"exported the model to {hf_dir} (Hugging Face Qwen3 layout)")
    if not check:
        return
    result.model.compute_dtype = "float32"  # T12: compare the float32 master weights
    report = closed_loop_check(result.model, result.tokenizer, hf_dir, CHECK_PROMPTS, n_tokens=40)
    print(report.get("summary") or report.get("reason") or "transformers: check unavailable")
