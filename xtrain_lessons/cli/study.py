"""Run a scaling study: model sizes x token budgets on one corpus, a fitted scaling law.

    xtrain study                          # the full preset (<= 40 min on 2 cores) into study/
    xtrain study --preset quick           # about a minute or two: the T19 notebook's grid
    xtrain study --data data/tinystories-valid.txt --out study-ts

Every run is scored on one fixed held-out file (the corpus's last documents, written to
OUT/corpus/eval.txt) in bits per byte. Writes OUT/results.csv and .json, fit.json (the law
L = E + A/N^alpha + B/D^beta and the compute-optimal size), curves.png, loss_vs_flops.png and
samples.md. Killed or stopped with Ctrl-C, the same command continues: finished runs are
reused and the interrupted one resumes from its checkpoint.
"""

from __future__ import annotations

import argparse
import sys

from xtrain_lessons.measure.evaluate import EvalError
from xtrain_lessons.measure.study import PRESETS, format_table, run_study


def configure_parser(parser: argparse.ArgumentParser) -> None:

    parser.add_argument("--preset", choices=sorted(PRESETS), default="full",
                        help="the grid: quick (minutes), full (the default, <= 40 min), micro (tests)")
    parser.add_argument("--out", default="study", help="study directory (default: study)")
    parser.add_argument("--data", default=None, metavar="FILE",
                        help="corpus: UTF-8 text, documents separated by <|endoftext|> (default: "
                             "the shipped data/stories.txt)")
    bar = parser.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="show progress bars (default: when stderr is a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false")


def run(args: argparse.Namespace) -> int:

    try:
        report = run_study(args.preset, out=args.out, data=args.data, progress=args.progress)
    except (ValueError, FileNotFoundError, EvalError) as e:
        print(f"xtrain study: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("xtrain study: interrupted; run the same command again to continue", file=sys.stderr)
        return 130
    f = report["fit"]
    print(format_table(report["rows"]))
    print(f"fit on the grid: bits/byte = {f['E']:.3f} + {f['A']:.4g} / N^{f['alpha']:.3f} + "
          f"{f['B']:.4g} / D^{f['beta']:.3f}  (rms log error {f['rms_log_error']:.3f})")
    for o in report["optimal"]:
        print(f"compute-optimal at {o['flops']:.0e} FLOPs (C = 6ND): N = {o['N']:,.0f} non-embedding "
              f"parameters, D = {o['D']:,.0f} tokens, predicted {o['loss']:.3f} bits/byte")
    print("wrote " + ", ".join(report["paths"].values()))
    return 0


if __name__ == "__main__":  # until `xtrain study` is registered in cli.py
    p = argparse.ArgumentParser(prog="xtrain study", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    configure_parser(p)
    sys.exit(run(p.parse_args()))
