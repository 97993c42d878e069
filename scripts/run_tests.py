"""The whole test suite, as CI runs it (the README's test command calls this through run_tests.sh).

The suite is cut into shards, each one `python -m pytest` process with its own selection and
environment; the shards run as many at a time as the machine has cores (two on a 2-core machine),
the longest first, so that the cores stay busy to the end:

    solution notebooks      solutions/ under nbval, the engine's default BLAS (MKL when installed)
    GPU path on stand-in    every learner notebook (exercises unsolved: each check must say not yet,
                            on the GPU) and every command on CuPy's stand-in (marker standin)
    mutants                 every exercise check against its wrong solutions (marker mutants)
    package tests           tests/ except the shards above and the book
    package tests, NumPy's BLAS, one thread
                            tests/ again as another CPU would run them, so that a result depending
                            on the BLAS's last bits fails here and not on the next machine; the
                            modules that call no BLAS (marker blas_free) are left out
    book                    the book built offline and its pages opened in a browser

Each shard's output is printed when it ends (the failures whole, a passing shard's summary line);
the exit status is 1 when any shard failed.

    bash scripts/run_tests.sh                 # everything
    bash scripts/run_tests.sh -x -q           # extra arguments go to every shard's pytest
    python scripts/run_tests.py --list        # the shards and their estimated seconds
    python scripts/run_tests.py --only mutants,book
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NOT_OTHERS = "not standin and not mutants and not book"


@dataclass
class Shard:
    name: str
    args: list[str]
    seconds: float  # measured in a clean-clone run on 2 cores, two shards at once (CONTRIBUTING.md): longest first
    env: dict[str, str] = field(default_factory=dict)


def marked(marker: str) -> list[str]:
    """The test modules that may hold tests with `marker` (their source names it, or conftest.py
    gives it by file name): passing them instead of tests/ spares a shard collecting every module."""
    found = [p for p in sorted((REPO / "tests").glob("test_*.py")) if f"mark.{marker}" in p.read_text()]
    found += {"mutants": [REPO / "tests" / "test_mutants.py"],
              "book": sorted((REPO / "tests").glob("test_book*.py"))}.get(marker, [])
    return sorted({str(p.relative_to(REPO)) for p in found})


SHARDS = [
    Shard("solution notebooks", ["solutions"], 710),
    Shard("GPU path on stand-in", [*marked("standin"), "-m", "standin"], 860),
    Shard("mutants", [*marked("mutants"), "-m", "mutants"], 145),
    Shard("package tests", ["tests", "-m", NOT_OTHERS], 570),
    Shard("package tests, NumPy's BLAS, one thread", ["tests", "-m", f"{NOT_OTHERS} and not blas_free"], 365,
          {"XTRAIN_BLAS": "numpy", "XTRAIN_THREADS": "1"}),
    Shard("book", [*marked("book"), "-m", "book"], 165),
]


@dataclass
class Run:
    shard: Shard
    proc: subprocess.Popen
    log: Path
    start: float
    seconds: float = 0.0
    status: int | None = None


def command(shard: Shard, extra: list[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", *shard.args, "--durations=5", "--durations-min=10", *extra]


def slowest(text: str) -> list[str]:
    """The lines of pytest's "slowest durations" table in a shard's output."""
    lines = text.splitlines()
    start = next((i for i, ln in enumerate(lines) if "slowest" in ln and "durations" in ln), None)
    if start is None:
        return []
    table = []
    for ln in lines[start + 1:]:
        if not ln.strip() or ln.startswith("="):
            break
        table.append(ln)
    return table


def start(shard: Shard, extra: list[str], folder: Path) -> Run:
    log = folder / (shard.name.replace(" ", "_").replace(",", "").replace("'", "") + ".log")
    cmd = command(shard, extra)
    env = {**os.environ, **shard.env}
    with open(log, "w") as out:
        out.write(f"$ {' '.join(f'{k}={v}' for k, v in shard.env.items())} {' '.join(cmd[1:])}\n")
        out.flush()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    print(f"[{time.strftime('%H:%M:%S')}] start  {shard.name}", flush=True)
    return Run(shard, proc, log, time.perf_counter())


def finish(run: Run) -> None:
    run.seconds = time.perf_counter() - run.start
    text = run.log.read_text(errors="replace")
    ok = run.status == 0
    print(f"[{time.strftime('%H:%M:%S')}] {'passed' if ok else 'FAILED'} {run.shard.name} ({run.seconds:.0f} s)",
          flush=True)
    if ok:
        last = [ln for ln in text.splitlines() if ln.strip()][-1:]
        print(f"    {last[0] if last else ''}", flush=True)
        for ln in slowest(text):
            print(f"      {ln}", flush=True)
    else:
        print(f"==== {run.shard.name}: output ====\n{text}\n==== end of {run.shard.name} ====", flush=True)


def run_all(shards: list[Shard], extra: list[str], jobs: int) -> int:
    pending = sorted(shards, key=lambda s: -s.seconds)
    running: list[Run] = []
    done: list[Run] = []
    with tempfile.TemporaryDirectory(prefix="xtrain-tests-") as tmp:
        while pending or running:
            while pending and len(running) < jobs:
                running.append(start(pending.pop(0), extra, Path(tmp)))
            time.sleep(0.5)
            for run in [r for r in running if r.proc.poll() is not None]:
                run.status = run.proc.returncode
                finish(run)
                running.remove(run)
                done.append(run)
    print("\nshard                                        seconds  result")
    for run in sorted(done, key=lambda r: -r.seconds):
        result = "passed" if run.status == 0 else ("no tests" if run.status == 5 else f"FAILED ({run.status})")
        print(f"{run.shard.name:44s} {run.seconds:7.0f}  {result}")
    return int(any(r.status != 0 for r in done))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="Other arguments go to every shard's pytest (e.g. -x, -q, -k EXPR).")
    parser.add_argument("--jobs", type=int, default=max(2, os.cpu_count() or 2),
                        help="shards at a time (default: the CPU cores, at least 2)")
    parser.add_argument("--only", default="", help="comma-separated shard names (or the start of one)")
    parser.add_argument("--list", action="store_true", help="print the shards and exit")
    args, extra = parser.parse_known_args(argv)
    shards = SHARDS
    if args.only:
        wanted = [w.strip() for w in args.only.split(",") if w.strip()]
        shards = [s for s in SHARDS if any(s.name.startswith(w) for w in wanted)]
        if not shards:
            parser.error(f"no shard named {args.only!r}; the shards: {', '.join(s.name for s in SHARDS)}")
    if args.list:
        for s in SHARDS:
            env = " ".join(f"{k}={v}" for k, v in s.env.items())
            print(f"{s.seconds:5.0f} s  {s.name:44s} {env} pytest {' '.join(s.args)}")
        return 0
    return run_all(shards, extra, args.jobs)


if __name__ == "__main__":
    sys.exit(main())
