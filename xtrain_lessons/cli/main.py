"""The `xtrain` command line: one entry point, one subcommand per job.

Each subcommand lives in its own module, which provides
    configure_parser(parser: argparse.ArgumentParser) -> None
    run(args: argparse.Namespace) -> int          # the exit code
and a module docstring whose first line is the subcommand's one-line help.
Add a subcommand by adding one line to SUBCOMMANDS.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from xtrain_lessons import __version__
from xtrain_lessons.cli.device_check import require_device
from xtrain_lessons.cli.errors import report

# (subcommand name, module that implements it)
SUBCOMMANDS: list[tuple[str, str]] = [
    ("doctor", "xtrain_lessons.cli.doctor"),
    ("notebooks", "xtrain_lessons.cli.notebooks"),
    ("export", "xtrain_lessons.cli.export"),
    ("import-hf", "xtrain_lessons.cli.import_hf"),
    ("data", "xtrain_lessons.cli.data"),
    ("train", "xtrain_lessons.cli.train"),
    ("sample", "xtrain_lessons.cli.sample"),
    ("bench", "xtrain_lessons.cli.bench"),
    ("launch", "xtrain_lessons.cli.launch"),
    ("eval", "xtrain_lessons.cli.eval"),
    ("study", "xtrain_lessons.cli.study"),
    ("sft", "xtrain_lessons.cli.sft"),
    ("grpo", "xtrain_lessons.cli.grpo"),
]
# Commands that report on the device rather than run on it: `--device cuda` is not refused there.
ASKS_NO_DEVICE = {"doctor"}


def _add_device_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--device",
        choices=["cpu", "cuda", "auto"],
        default=None,
        help="array backend: cpu (NumPy), cuda (CuPy) or auto (cuda when a GPU is usable); "
        "default: $XTRAIN_DEVICE, else auto",
    )
    parser.add_argument("--debug", action="store_true", default=None,
                        help="show the Python traceback of an error (also: XTRAIN_DEBUG=1)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="xtrain",
        description="xtrain-lessons: build and train a small LLM from scratch. "
        "Run `xtrain <command> --help` for the options of each command.",
    )

    parser.add_argument("--version", action="version", version=f"xtrain-lessons {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="<command>")
    for name, module_name in SUBCOMMANDS:
        module = importlib.import_module(module_name)
        doc = (module.__doc__ or "").strip()
        summary = doc.splitlines()[0] if doc else name
        p = sub.add_parser(name, help=summary, description=doc,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        _add_device_flag(p)
        module.configure_parser(p)
        p.set_defaults(_module=module)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    if getattr(args, "device", None):
        os.environ["XTRAIN_DEVICE"] = args.device
    debug_before = os.environ.get("XTRAIN_DEBUG")
    if getattr(args, "debug", None):
        os.environ["XTRAIN_DEBUG"] = "1"  # inherited by the workers of `xtrain launch`
    try:
        if args.command not in ASKS_NO_DEVICE:
            require_device(args.command)  # the GPU asked for by name is there, or one line before any work
        return int(args._module.run(args) or 0)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - expected failures become one line (cli/errors.py)
        return report(args.command, e)
    finally:
        if debug_before is None:
            os.environ.pop("XTRAIN_DEBUG", None)
        else:
            os.environ["XTRAIN_DEBUG"] = debug_before


if __name__ == "__main__":
    sys.exit(main())
