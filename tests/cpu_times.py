"""A pytest plugin that records each test's wall time and CPU time (its own process and every
child process it waited for: notebook kernels, subprocesses), for sizing the suite on a busy machine.

    PYTHONPATH=tests python -m pytest -p cpu_times ...   # one JSON line per test, appended to
    $XTRAIN_CPU_TIMES (default cpu_times.jsonl); `python tests/cpu_times.py FILE...` prints the groups

CPU seconds barely move with the machine's load, wall seconds do: the groups' CPU time divided by
the cores the command keeps busy is what the suite costs on a quiet machine.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from collections import defaultdict
from pathlib import Path

import pytest

def _cpu() -> tuple[float, float]:
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    wall, (own, kids) = time.perf_counter(), _cpu()
    yield
    wall2, (own2, kids2) = time.perf_counter(), _cpu()
    record = {"id": item.nodeid, "wall": wall2 - wall, "cpu": own2 - own, "child_cpu": kids2 - kids}
    with open(os.environ.get("XTRAIN_CPU_TIMES", "cpu_times.jsonl"), "a") as f:  # as it goes: a killed run keeps it
        f.write(json.dumps(record) + "\n")


def group(test_id: str) -> str:
    path = test_id.split("::")[0]
    if path.startswith("solutions/"):
        return "notebooks: solutions"
    if path.startswith("notebooks/"):
        return "notebooks: learner"
    if "test_gpu_path.py" in path:
        return "stand-in end to end"
    if "test_mutants" in path:
        return "mutants"
    if "test_book" in path:
        return "book"
    return "package tests"


def summary(records: list[dict]) -> str:
    groups, files = defaultdict(lambda: [0.0, 0.0]), defaultdict(lambda: [0.0, 0.0])
    for r in records:
        cpu = r["cpu"] + r["child_cpu"]
        for table, key in ((groups, group(r["id"])), (files, r["id"].split("::")[0])):
            table[key][0] += r["wall"]
            table[key][1] += cpu
    lines = [f"{'group':40s} {'wall s':>8s} {'cpu s':>8s}"]
    lines += [f"{k:40s} {w:8.1f} {c:8.1f}" for k, (w, c) in sorted(groups.items(), key=lambda kv: -kv[1][1])]
    total = [sum(v[0] for v in groups.values()), sum(v[1] for v in groups.values())]
    lines += [f"{'total':40s} {total[0]:8.1f} {total[1]:8.1f}", "", "slowest files (cpu s):"]
    lines += [f"  {c:8.1f} {w:8.1f}  {k}" for k, (w, c) in sorted(files.items(), key=lambda kv: -kv[1][1])[:40]]
    lines += ["", "slowest tests (cpu s):"]
    slow = sorted(records, key=lambda r: -(r["cpu"] + r["child_cpu"]))[:25]
    lines += [f"  {r['cpu'] + r['child_cpu']:8.1f} {r['wall']:8.1f}  {r['id']}" for r in slow]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary([json.loads(line) for f in sys.argv[1:] for line in Path(f).read_text().splitlines() if line]))
