"""Export a training run to the Hugging Face format (transformers loads it), or import one back.

    xtrain export RUN_DIR --out HF_DIR [--dtype float32|bfloat16] [--check]
        RUN_DIR: a run directory of `xtrain train` (its latest checkpoint), a checkpoints root
        or one step directory. Writes config.json, model.safetensors, generation_config.json,
        tokenizer.json and tokenizer_config.json to HF_DIR (atomically). --check then loads
        HF_DIR with transformers and compares logits and greedy generation with the engine.

    xtrain import-hf HF_DIR --out RUN_DIR
        Read a Qwen3-layout folder (config.json + model.safetensors + tokenizer.json) into a
        run directory (RUN_DIR/checkpoints/step_00000000, RUN_DIR/tokenizer.json).

Both subcommands live in this module (cli.py registers it twice); configure_parser and run
tell them apart by the subcommand name.
"""

from __future__ import annotations

import argparse
import sys

DEFAULT_PROMPTS = ["Once upon a time", "One day, a little", "The cat"]


def configure_parser(parser: argparse.ArgumentParser) -> None:
    """Options of `xtrain export`, or of `xtrain import-hf` when that is the parser's name."""
    if parser.prog.rsplit(" ", 1)[-1] == "import-hf":
        parser.add_argument("hf_dir", metavar="HF_DIR",
                            help="Hugging Face model folder (config.json, model.safetensors, tokenizer.json)")
        parser.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory to create")
        parser.set_defaults(_action="import")
        return
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
    from .checkpoint import CheckpointError  # noqa: PLC0415
    from .export import ExportError, closed_loop_check, export_hf, load_run  # noqa: PLC0415

    try:
        if getattr(args, "_action", "export") == "import":
            return _run_import(args)
        model, tok, ckpt = load_run(args.run_dir)
        out = export_hf(model, tok, args.out, dtype=args.dtype)
    except (ExportError, CheckpointError, FileNotFoundError, KeyError, ValueError) as e:
        print(f"xtrain {getattr(args, 'command', None) or 'export'}: {e}", file=sys.stderr)
        return 1
    n = len(model.state_dict())
    print(f"exported {ckpt} -> {out} ({n} tensors, {model.n_params():,} parameters, {args.dtype})")
    if args.check:
        report = closed_loop_check(model, tok, out, args.prompt or DEFAULT_PROMPTS, args.tokens)
        print(report["summary"])
        if report.get("available"):
            # fp32 must match exactly; bf16 may part ways on near-ties (reported, not failed)
            if report["tokenizer_ids_equal"] is False:
                return 1
            if args.dtype == "float32" and not all(report["greedy_identical"]):
                return 1
    return 0


def _run_import(args: argparse.Namespace) -> int:
    from .export import import_hf, save_run  # noqa: PLC0415

    model, tok = import_hf(args.hf_dir)  # errors are reported by run()
    ckpt = save_run(model, tok, args.out, source=str(args.hf_dir))
    print(f"imported {args.hf_dir} -> {ckpt} ({model.n_params():,} parameters)")
    return 0
