"""Build the learner notebooks from the solutions, check they are fresh, and execute them.

    xtrain notebooks build            # solutions/*.ipynb -> notebooks/*.ipynb (stubs in place)
    xtrain notebooks check            # exit 1 when a committed learner notebook is stale
    xtrain notebooks run [NAMES...]   # execute notebooks in place, saving their outputs

`solutions/TNN_<topic>.ipynb` is the one source of truth. A solution region

        # BEGIN SOLUTION T05.2 rmsnorm            (or // BEGIN SOLUTION ... inside CUDA C)
        ...the answer...
        # END SOLUTION

becomes a one-line stub in the learner notebook:

        raise NotImplementedError("T05.2 rmsnorm")  # your code here (about 2 lines)
        /* EXERCISE T01.1 vector_add: your code here (about 3 lines) */
"""

from __future__ import annotations

import argparse
import sys

from xtrain_lessons.course.notebooks import (
    NOTEBOOKS,
    REPO,
    SOLUTIONS,
    build,
    execute,
    solution_paths,
    stale_notebooks,
)


def configure_parser(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="<action>", required=True)
    sub.add_parser("build", help="regenerate notebooks/ from solutions/").add_argument(
        "names", nargs="*", help="phase prefixes such as T05 (default: all)")
    sub.add_parser("check", help="exit 1 when a learner notebook is stale")
    run = sub.add_parser("run", help="execute notebooks in place and save their outputs")
    run.add_argument("names", nargs="*", help="phase prefixes such as T05 (default: all)")
    run.add_argument("--which", choices=["solutions", "notebooks", "both"], default="both",
                     help="which set to execute (default: both)")


def run(args: argparse.Namespace) -> int:
    if args.action == "build":
        written = build(args.names or None)
        for p in written:
            print(f"wrote {p.relative_to(REPO)}")
        print(f"{len(written)} learner notebook(s) regenerated, the rest were up to date")
        return 0
    if args.action == "check":
        stale = stale_notebooks()
        for name in stale:
            print(f"stale: notebooks/{name} (run `xtrain notebooks build`)")
        print("all learner notebooks are up to date" if not stale else f"{len(stale)} stale")
        return 1 if stale else 0
    build(args.names or None)
    dirs = {"solutions": [SOLUTIONS], "notebooks": [NOTEBOOKS], "both": [SOLUTIONS, NOTEBOOKS]}
    failed = 0
    for folder in dirs[args.which]:
        for sol in solution_paths(args.names or None):
            path = folder / sol.name
            try:
                seconds = execute(path)
                print(f"ran {path.relative_to(REPO)} in {seconds:.1f} s")
            except Exception as exc:  # report every failing notebook, not just the first
                failed += 1
                print(f"FAILED {path.relative_to(REPO)}: {type(exc).__name__}: {exc}"[:2000],
                      file=sys.stderr)
    return 1 if failed else 0
