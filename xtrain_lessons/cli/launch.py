"""Start N worker processes with a torchrun-style environment and watch them.

    xtrain launch --nproc 2 -- xtrain train --steps 50 --out runs/dp
    xtrain launch --nproc 2 -- python my_script.py

Each worker gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR (127.0.0.1 by
default) and MASTER_PORT (a free port unless --master-port is given), the same variables
torchrun sets, so a script written for one runs under the other. OMP_NUM_THREADS defaults to
1 per worker (N workers on N cores). A command starting with `xtrain` runs with this Python
(`python -m xtrain_lessons.cli.main`).

The launcher never hangs on a broken group: when a worker exits with a non-zero code, the
others are stopped (SIGTERM, then SIGKILL after --grace seconds) and the launcher exits with
that code, naming the rank. --max-time bounds the whole run. Ctrl-C stops every worker.
"""

from __future__ import annotations

import argparse

from xtrain_lessons.cli.errors import report
from xtrain_lessons.parallel.launch import launch


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", "--nproc-per-node", dest="nproc", type=int, default=2,
                        help="number of worker processes (default 2)")
    parser.add_argument("--master-addr", default="127.0.0.1", help="rendezvous address (default 127.0.0.1)")
    parser.add_argument("--master-port", type=int, default=0, help="rendezvous port (default: a free one)")
    parser.add_argument("--max-time", type=float, default=None,
                        help="stop every worker after this many seconds (exit code 124)")
    parser.add_argument("--grace", type=float, default=5.0,
                        help="seconds between SIGTERM and SIGKILL when stopping workers")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")


def run(args: argparse.Namespace) -> int:
    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    try:
        return launch(cmd, args.nproc, args.master_addr, args.master_port or None, args.max_time, args.grace)
    except ValueError as e:
        return report("launch", e, 2)
