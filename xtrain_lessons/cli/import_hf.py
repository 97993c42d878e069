"""Import a Hugging Face Qwen3-layout folder into a run directory of the engine.

    xtrain import-hf HF_DIR --out RUN_DIR
        Read a Qwen3-layout folder (config.json + model.safetensors + tokenizer.json) into a
        run directory (RUN_DIR/checkpoints/step_00000000, RUN_DIR/tokenizer.json).
"""

from __future__ import annotations

import argparse

from xtrain_lessons.cli.errors import report
from xtrain_lessons.interop.hf import ExportError, import_hf
from xtrain_lessons.training.checkpoint import CheckpointError
from xtrain_lessons.training.rundir import save_run


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("hf_dir", metavar="HF_DIR",
                        help="Hugging Face model folder (config.json, model.safetensors, tokenizer.json)")
    parser.add_argument("--out", required=True, metavar="RUN_DIR", help="run directory to create")


def run(args: argparse.Namespace) -> int:
    try:
        model, tok = import_hf(args.hf_dir)
        ckpt = save_run(model, tok, args.out, source=str(args.hf_dir))
    except (ExportError, CheckpointError, FileNotFoundError, KeyError, ValueError) as e:
        return report("import-hf", e, 1)
    print(f"imported {args.hf_dir} -> {ckpt} ({model.n_params():,} parameters)")
    return 0
