"""Export a training run to the Hugging Face format (transformers loads it).

    xtrain export RUN_DIR --out HF_DIR [--dtype float32|bfloat16] [--check]
        RUN_DIR: a run directory of `xtrain train` (its latest checkpoint), a checkpoints root
        or one step directory. Writes config.json, model.safetensors, generation_config.json,
        tokenizer.json and tokenizer_config.json to HF_DIR (atomically). --check then loads
        HF_DIR with transformers and compares logits and greedy generation with the engine.
"""

from __future__ import annotations

import argparse

from xtrain_lessons.cli.errors import report
from xtrain_lessons.interop.hf import ExportError, closed_loop_check, export_hf
from xtrain_lessons.training.checkpoint import CheckpointError
from xtrain_lessons.training.rundir import load_run

DEFAULT_PROMPTS = ["Once upon a time", "One day, a little", "The cat"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", metavar="RUN_DIR", help="run directory, checkpoints root or step directory")
    parser.add_argument("--out", required=True, metavar="HF_DIR", help="folder to write the Hugging Face model to")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                        help="dtype of the exported weights (default float32)")
    parser.add_argument("--check", action="store_true",
                        help="load the export with transformers and compare it with the engine")
    parser.add_argument("--prompt", action="append", default=None,
                        help="prompt for --check (repeatable; default: three short story openings)")
    parser.add_argument("--tokens", type=int, default=40, help="greedy tokens compared by --check (default 40)")
    parser.set_defaults(_action="export")


def run(args: argparse.Namespace) -> int:

    try:
        model, tok, ckpt = load_run(args.run_dir)
        out = export_hf(model, tok, args.out, dtype=args.dtype)
    except (ExportError, CheckpointError, FileNotFoundError, KeyError, ValueError) as e:
        return report("export", e, 1)
    n = len(model.state_dict())
    print(f"exported {ckpt.path} -> {out} ({n} tensors, {model.n_params():,} parameters, {args.dtype})")
    if args.check:
        result = closed_loop_check(model, tok, out, args.prompt or DEFAULT_PROMPTS, args.tokens)
        print(result["summary"])
        if result.get("available"):
            # fp32 must match exactly; bf16 may part ways on near-ties (reported, not failed)
            if result["tokenizer_ids_equal"] is False:
                return 1
            if args.dtype == "float32" and not all(result["greedy_identical"]):
                return 1
    return 0
