"""The GPU check: everything a contributor with an NVIDIA GPU runs before saying "it works on a GPU".

    python scripts/gpu_check.py                  # on a machine with a GPU and CuPy (about 10 minutes)
    python scripts/gpu_check.py --quick          # the same with fewer steps and no benchmark
    python scripts/gpu_check.py --stand-in       # the CPU-side parts, on the tests' CuPy stand-in (CI)
    python scripts/gpu_check.py --only train,launch
    python scripts/gpu_check.py --budget 500 --out results/ --notebooks T01,T03 --bench-against eager,sdpa
                                                 # a lent GPU's session: stop in time, keep every output
    python scripts/gpu_check.py --only lease --budget 450 --out r/     # issue 39's targets, as gpu_lease.sh runs them
    python scripts/gpu_check.py --dry-run 2 --budget 10 --out /tmp/r    # the plan's logic, no GPU: commands sleep

It prints one line per check — `PASS name: detail`, `FAIL name: reason` or `SKIP name: reason` —
and exits 1 when any check failed. The checks:

  gpu-tests   `pytest -m gpu`: every GPU kernel against its reference on the device, and the
              model's float32 / bf16 steps against the CPU's
  gpu-tests-quick  the same on QUICK_TESTS (the GPU engine, graphs, flash-attention, cuBLAS, the
              torch baselines without the compiled ones), `-v`: a timeout keeps what passed
  notebooks   every solution notebook, executed with the device set to cuda (to the end)
  train       `xtrain train` in float32, bf16 and fp16 on the GPU and on the CPU, same seed and
              data: the final train and validation losses agree within TRAIN_BOUND nats
  launch      `xtrain launch --nproc 2` with both ranks on one GPU (gloo through the host)
  bench       `xtrain bench train --device cuda` at the tiny, 20m and gpt2-small shapes: the
              engine in float32 against --bench-against, and in bf16 against torch autocast bf16
              (amp), on the same GPU
  targets-bf16  the bench in bf16 at 20m and gpt2-small with --cuda-graph against --targets-against
              (default sdpa,cuda-graph: nothing to compile, so a minute or so): the engine's graph
              against torch's eager step and its whole-step graph, MFU against the card's spec peak,
              each step's peak memory
  targets-compiled  the same against --compiled-against (default reduce-overhead): the engine's graph
              against torch.compile(mode="reduce-overhead"); apart, because compiling takes minutes
              and a run cut short at its timeout reports nothing
  train-speed `xtrain train --device cuda --dtype bf16` at the bench's 20m shape: tokens/s against
              the bench's graphed and eager steps (targets-bf16 first)
  memory      peak device memory of a bf16 step at T = 4096 (B x T = 8192 tokens), gpt2-small, the
              engine (--memory-attention: flash, else composed) against torch SDPA
  graph-loop  float32: `xtrain train` with its step captured as a graph (stopped at step 30, resumed
              to 60, eval every 20) against the same run with the graph off: every logged loss and
              the final weights bit for bit (skipped while `xtrain train` has no switch for it)
  bench-f32   the bench in float32 at 20m with --cuda-graph against sdpa,compile,cuda-graph
  profile     scripts/gpu_profile.py at the bench's shapes (--profile-dtypes): the step's wall time,
              the host's time to issue it, the GPU's busy time and the kernels that fill it

Every command runs in a process group of its own with its own timeout (never past --budget), and
its output goes to a file as it is written (`--out`: NN_label.log), so a command killed at its
timeout leaves what it printed. With --out, a summary (summary.txt and summary.json: each check's
status and time, the measured figures and issue 39's four targets, MET / NOT MET / NOT MEASURED)
is rewritten after every check, so a session cut short keeps its last one.

`--stand-in` runs the same commands on the CPU with cupy_standin as CuPy (what CI can do): the
notebooks, train and launch checks run; gpu-tests and bench are skipped (no GPU to measure).
`--dry-run S` replaces every command by one that prints itself and sleeps S seconds: the plan,
its timeouts, budget and summary, on any machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# final losses of a 200-step run on a GPU against the CPU: measured within 0.025 nats on an H200
# (float32, bf16, flash, accumulation); twice that is the bound (two float32 implementations
# drift apart over 200 AdamW steps; a wrong kernel moves the loss by far more)
TRAIN_BOUND = 0.05
CHECKS = ("gpu-tests", "gpu-tests-quick", "notebooks", "train", "launch", "bench", "targets-bf16", "targets-compiled",
          "train-speed", "memory", "graph-loop", "bench-f32", "profile")
DEFAULT_CHECKS = ("gpu-tests", "notebooks", "train", "launch", "bench", "profile")
# the lent GPU's plan (gpu_lease.sh; `--only lease`): most valuable first, so that a budget running out loses the least
LEASE_PLAN = "targets-bf16,train-speed,memory,targets-compiled,graph-loop,gpu-tests-quick,bench-f32,gpu-tests"
# seconds each command may take (never more than --step-timeout, never past --budget)
TIMEOUTS = {"bench-20m": 120, "bench-gpt2-small": 120, "compiled-20m": 200, "compiled-gpt2-small": 230,
            "train-speed": 120, "memory": 100, "graph-loop": 60,
            "gpu-tests-quick": 110, "bench-f32": 180, "gpu-tests": 600}
QUICK_TESTS = ["tests/test_flash_attention*.py", "tests/test_cuda_graph.py", "tests/test_gpu_engine.py",
               "tests/test_cublas_direct.py", "tests/test_torch_baselines.py", "tests/test_kernels_bf16.py",
               "tests/test_emulator_features.py"]
TRAIN_SHAPE_20M = ["--preset", "20m", "--vocab-size", "8192", "--batch-size", "32", "--seq-len", "512"]
MEMORY_SHAPE = ["--preset", "gpt2-small", "--vocab-size", "32768", "--batch-size", "2", "--seq-len", "4096"]
STANDIN_SHAPE = ["--preset", "test", "--vocab-size", "300", "--batch-size", "4", "--seq-len", "16"]
BENCH_SHAPES = {
    "tiny": ["--preset", "tiny", "--vocab-size", "2048", "--batch-size", "16", "--seq-len", "128"],
    "20m": ["--preset", "20m", "--vocab-size", "8192", "--batch-size", "32", "--seq-len", "512"],
    "gpt2-small": ["--preset", "gpt2-small", "--vocab-size", "32768", "--batch-size", "8", "--seq-len", "1024"],
}


def env_for(device: str, stand_in: bool) -> dict:
    if stand_in:
        from xtrain_lessons import cupy_standin  # noqa: PLC0415

        return cupy_standin.subprocess_env(device=device, kernels="reference")  # the row kernels' NumPy twins
    return {**os.environ, "XTRAIN_DEVICE": device}


DEADLINE = [float("inf")]  # perf_counter time after which nothing new starts (--budget)
OUT_DIR: list[Path] = []  # --out: every command's full output is kept there
DRY_RUN: list[float] = []  # --dry-run S: commands print themselves and sleep S seconds
RESULTS: dict = {}  # what the checks measured, for later checks and the summary
SCRATCH: list[Path] = []  # without --out, the commands' logs go to main's temporary folder
_counter = [0]


class OutOfBudget(Exception):
    """--budget ran out before this command could start."""


def remaining() -> float:
    return DEADLINE[0] - time.perf_counter()


def run(cmd, env, timeout=1800, label="cmd") -> subprocess.CompletedProcess:
    """Run `cmd` in a process group of its own, its output (stdout and stderr together) written to
    a file as it comes (--out: NN_label.log), killed with its group at `timeout` or at --budget.
    Returns the output as stdout; on a timeout raises subprocess.TimeoutExpired (the file keeps
    what it printed)."""
    timeout = min(timeout, remaining())
    if timeout < 5:
        raise OutOfBudget(f"--budget ran out before: {' '.join(str(c) for c in cmd[-6:])}")
    cmd = [str(c) for c in cmd]
    if DRY_RUN:
        cmd = [sys.executable, "-c", "import sys, time; print('DRY RUN:', *sys.argv[2:], flush=True); "
               "time.sleep(float(sys.argv[1]))", str(DRY_RUN[0]), *cmd]
    _counter[0] += 1
    folder = OUT_DIR[0] if OUT_DIR else SCRATCH[0] if SCRATCH else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    log = folder / f"{_counter[0]:02d}_{label}.log"
    t0, timed_out = time.perf_counter(), False
    with open(log, "w") as f:
        f.write(f"$ {' '.join(cmd)}\n")
        f.flush()
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            stop_group(proc)
    text = log.read_text(errors="replace").split("\n", 1)[1]
    status = f"timed out after {timeout:.0f} s" if timed_out else f"exit {proc.returncode}"
    _log(cmd, f"{status}, {time.perf_counter() - t0:.0f} s, {log.name}", text, "")
    if timed_out:
        raise subprocess.TimeoutExpired(cmd, timeout, output=text)
    return subprocess.CompletedProcess(cmd, proc.returncode, text, "")


def stop_group(proc, grace: float = 5.0) -> None:
    """SIGTERM to the command's whole process group (compile workers, pytest's children), SIGKILL
    after `grace` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _log(cmd, status, stdout, stderr) -> None:
    if OUT_DIR:
        text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (stdout, stderr))
        with open(OUT_DIR[0] / "commands.log", "a") as f:
            f.write(f"$ {' '.join(str(c) for c in cmd)}\n({status})\n{text}\n")


def xtrain(*args, env, timeout=1800, label=None):
    return run([sys.executable, "-m", "xtrain_lessons.cli.main", *args], env, timeout,
               label or "xtrain-" + "-".join(str(a) for a in args[:2]))


def tail(p: subprocess.CompletedProcess) -> str:
    lines = (p.stderr or p.stdout).strip().splitlines()
    return lines[-1] if lines else f"exit {p.returncode}"


# ------------------------------------------------------------------ the checks
def check_gpu_tests(args, work):
    if args.stand_in:
        return "SKIP", "needs a real GPU (the tests skip on the stand-in)"
    # no nbval options (`-o addopts=`): a GPU machine may have pytest without the notebook plugins
    import importlib.util  # noqa: PLC0415

    # the notebook stack may be missing on a GPU machine: its two test modules hold no GPU test
    ignore = [] if importlib.util.find_spec("nbformat") else ["--ignore=tests/test_gpu_path.py",
                                                              "--ignore=tests/test_notebook_pipeline.py"]
    p = run([sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-o", "addopts=", "-p", "no:cacheprovider",
             "--continue-on-collection-errors", "--durations=5", *ignore, "tests"], env_for("cuda", False),
            timeout=min(args.step_timeout, TIMEOUTS["gpu-tests"]), label="gpu-tests")
    summary = tail(p)
    if p.returncode != 0 or "skipped" in summary and "passed" not in summary:
        return "FAIL", summary
    return "PASS", summary


def check_notebooks(args, work):
    import nbformat  # noqa: PLC0415
    from nbclient import NotebookClient  # noqa: PLC0415

    paths = notebook_order(args)
    slow, failed = [], []
    for path in paths:
        if remaining() < 60:
            failed.append(f"--budget ran out after {len(slow)} of {len(paths)} notebooks")
            break
        nb = nbformat.read(path, as_version=4)
        t0 = time.perf_counter()
        try:
            NotebookClient(nb, timeout=int(min(900, remaining())), kernel_name="python3",
                           resources={"metadata": {"path": str(path.parent)}}).execute(
                env=env_for("cuda", args.stand_in))
        except Exception as e:  # noqa: BLE001 - report each failing notebook with its cell, go on
            failed.append(f"{path.name}: {str(e).strip().splitlines()[-1][:300]}")
        finally:
            if OUT_DIR and path.stem.split("_")[0] in args.notebooks_kept.split(","):
                nbformat.write(nb, OUT_DIR[0] / path.name)
        slow.append((time.perf_counter() - t0, path.stem))
        print(f"       {path.stem}: {slow[-1][0]:.0f} s{' FAILED' if failed and path.name in failed[-1] else ''}",
              flush=True)
    if failed:
        return "FAIL", f"{len(slow)} of {len(paths)} notebooks ran; " + "; ".join(failed)
    worst = max(slow)
    return "PASS", f"{len(paths)} notebooks ran to the end on cuda (slowest: {worst[1]}, {worst[0]:.0f} s)"


def notebook_order(args) -> list[Path]:
    """The solution notebooks to run, in the order --notebooks names them ("rest": all the others)."""
    every = sorted((REPO / "solutions").glob("T*.ipynb"))
    names = args.notebooks.split(",") if args.notebooks else ["T01", "T05", "T06", "T12", "T12b"] if args.quick else ["rest"]
    named = [p for name in names for p in every if p.stem.split("_")[0] == name]
    return named + ([p for p in every if p not in named] if "rest" in names else [])


def train_flags(args):
    steps = str(args.train_steps or (40 if args.quick or args.stand_in else 200))
    small = ["--preset", "test", "--vocab-size", "512", "--batch-size", "8", "--seq-len", "32"] if args.stand_in else []
    return [*small, "--steps", steps, "--eval-every", steps, "--eval-batches", "4", "--sample-every", "0",
            "--checkpoint-every", "0", "--no-progress", "--no-hf-check", "--seed", "0"]


def final_losses(out: Path) -> tuple[float, float]:
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    val = [r["val_loss"] for r in recs if r.get("val_loss") is not None]
    return recs[-1]["train_loss"], val[-1]


def check_train(args, work):
    lines, failed = [], []
    for dtype in ("float32", "bf16", "fp16"):  # every dtype, whichever fails
        got = {}
        for device in ("cpu", "cuda"):
            out = work / f"train-{dtype}-{device}"
            p = xtrain("train", "--device", device, "--dtype", dtype, "--out", out, *train_flags(args),
                       env=env_for(device, args.stand_in))
            if p.returncode != 0:
                failed.append(f"{dtype} on {device}: {tail(p)}")
                break
            got[device] = final_losses(out)
            if OUT_DIR:  # every step's loss, grad norm, loss scale and skips, for a closer look
                with open(OUT_DIR[0] / "train_metrics.jsonl", "a") as f:
                    for line in (out / "metrics.jsonl").read_text().splitlines():
                        f.write(json.dumps({"run": f"{dtype}-{device}", **json.loads(line)}) + "\n")
        if len(got) < 2:
            continue
        d = max(abs(a - b) for a, b in zip(got["cpu"], got["cuda"]))
        lines.append(f"{dtype} |Δloss| {d:.3f}")
        if not d <= TRAIN_BOUND:
            failed.append(f"{dtype}: final train/val losses {got['cuda']} on cuda vs {got['cpu']} on the CPU "
                          f"differ by {d:.3f} > {TRAIN_BOUND}")
    if failed:
        return "FAIL", "; ".join(failed + lines)
    return "PASS", f"final losses within {TRAIN_BOUND} of the CPU run: " + ", ".join(lines)


def check_launch(args, work):
    out = work / "launch"
    p = xtrain("launch", "--nproc", "2", "--", sys.executable, "-m", "xtrain_lessons.cli.main", "train",
               "--device", "cuda", "--out", out, *train_flags(args), env=env_for("cuda", args.stand_in))
    if p.returncode != 0:
        return "FAIL", tail(p)
    summary = json.loads((out / "summary.json").read_text())
    return ("PASS" if summary["status"] == "done" else "FAIL"), f"2 ranks on one GPU: {summary['status']}"


def check_bench(args, work):
    if args.stand_in:
        return "SKIP", "no GPU to time (the stand-in is NumPy on the CPU)"
    if args.quick:
        return "SKIP", "--quick"
    results, failed = [], []
    for name, shape in BENCH_SHAPES.items():  # every shape and dtype, whichever fails
        for dtype, against in (("float32", args.bench_against), ("bf16", "amp")):
            if dtype not in args.bench_dtypes.split(","):
                continue
            p = xtrain("bench", "train", "--device", "cuda", "--dtype", dtype, "--against", against, "--steps", "6",
                       "--rounds", "3", *shape, *args.bench_flags.split(), env=env_for("cuda", False),
                       timeout=args.step_timeout, label=f"bench-{name}-{dtype}")
            if p.returncode != 0:
                failed.append(f"{name} {dtype}: {tail(p)}")
                continue
            results.append(f"{name} {dtype}: {tail(p)}")
            print(f"       {name} {dtype}:\n" + "\n".join("         " + ln for ln in p.stdout.strip().splitlines()),
                  flush=True)
    return ("FAIL" if failed else "PASS"), "; ".join(failed + results)


def check_profile(args, work):
    if args.stand_in:
        return "SKIP", "no GPU to profile"
    done, failed = [], []
    for name, shape in BENCH_SHAPES.items():
        if name not in args.profile_shapes.split(","):
            continue
        for dtype in args.profile_dtypes.split(","):
            p = run([sys.executable, "scripts/gpu_profile.py", "--dtype", dtype, *shape, *args.profile_flags.split()],
                    env_for("cuda", False), timeout=args.step_timeout, label=f"profile-{name}-{dtype}")
            if p.returncode != 0:
                failed.append(f"{name} {dtype}: {tail(p)}")
                continue
            done.append(p.stdout.strip().splitlines()[0])
            print("\n".join("       " + ln for ln in p.stdout.strip().splitlines()), flush=True)
    return ("FAIL" if failed else "PASS"), "; ".join(failed + done)


# ------------------------------------------------------------------ issue 39's targets
def _bench_shape(args, name):
    return STANDIN_SHAPE + ["--peak-n", "256"] if args.stand_in else BENCH_SHAPES[name]


def _bench_counts(args):
    return ["--steps", "2", "--rounds", "1"] if args.stand_in else ["--steps", "6", "--rounds", "3"]


def _bench_bf16(args, against: str, kind: str):
    """The bench in bf16 at 20m and GPT-2-small with --cuda-graph against `against`; its output goes
    to RESULTS["bench SHAPE bf16" + (" compiled" for kind "compiled")]."""
    done, failed, skipped = [], [], []
    for name in ("20m", "gpt2-small"):
        label, key = f"{kind}-{name}", f"bench {name} bf16" + (" compiled" if kind == "compiled" else "")
        try:
            p = xtrain("bench", "train", "--device", "cuda", "--dtype", "bf16", "--cuda-graph", "--against",
                       against, *_bench_counts(args), *_bench_shape(args, name), env=env_for("cuda", args.stand_in),
                       timeout=min(args.step_timeout, TIMEOUTS[label]), label=label)
        except subprocess.TimeoutExpired as e:
            RESULTS[key] = e.output or ""
            failed.append(f"{name}: timed out after {e.timeout:.0f} s")
            continue
        except OutOfBudget:
            skipped.append(f"{name}: not started, the budget ran out")
            continue
        RESULTS[key] = p.stdout
        (failed if p.returncode else done).append(f"{name}: {tail(p)}")
        print("\n".join("       " + ln for ln in p.stdout.strip().splitlines()[-14:]), flush=True)
    status = "FAIL" if failed else "PASS" if done else "SKIP"
    return status, "; ".join(failed + done + skipped)


def check_targets_bf16(args, work):
    """The bench in bf16 at 20m and GPT-2-small, the engine's graph against torch's uncompiled steps."""
    return _bench_bf16(args, args.targets_against, "bench")


def check_targets_compiled(args, work):
    """The same against torch.compile(mode="reduce-overhead") (and whatever --compiled-against names)."""
    return _bench_bf16(args, args.compiled_against, "compiled")


def check_train_speed(args, work):
    """`xtrain train --device cuda --dtype bf16` at the bench's 20m shape: its tokens/s over the
    steady steps against the bench's graphed and eager steps at that shape."""
    out, steps = work / "speed", "6" if args.stand_in else "80"
    shape = STANDIN_SHAPE if args.stand_in else TRAIN_SHAPE_20M
    p = xtrain("train", "--device", "cuda", "--dtype", "bf16", *shape, "--steps", steps, "--log-every", "10",
               "--eval-every", "0", "--sample-every", "0", "--checkpoint-every", "0", "--no-export", "--no-hf-check",
               "--no-progress", "--tokenizer-impl", "hf", "--seed", "0", "--out", out,
               env=env_for("cuda", args.stand_in), timeout=min(args.step_timeout, TIMEOUTS["train-speed"]),
               label="train-speed")
    if p.returncode != 0:
        return "FAIL", tail(p)
    if DRY_RUN:
        return "PASS", "dry run"
    recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    tps = steady_tokens_per_s(recs)
    RESULTS["train tok/s"] = tps
    bench = RESULTS.get("bench 20m bf16", "")
    graph, eager = stepper_rate(bench, "engine+graph"), stepper_rate(bench, "engine")
    parts = [f"train {tps:,.0f} tok/s (steps {recs[len(recs) // 4]['step']}-{recs[-1]['step']})"]
    parts += [f"{tps / r:.2f}x the bench's {what} ({r:,.0f})"
              for what, r in (("graphed step", graph), ("eager step", eager)) if r]
    if not bench:
        parts.append("no bench at this shape to compare (targets-bf16 did not run)")
    return "PASS", "; ".join(parts)


def steady_tokens_per_s(recs: list[dict]) -> float:
    """Tokens per second over the last three quarters of a run's metric records (the first quarter
    holds the capture, the first compilations and the warm-up)."""
    first, last = recs[len(recs) // 4], recs[-1]
    if last["step"] == first["step"]:
        return last["tokens_per_s"]
    return (last["tokens"] - first["tokens"]) / (last["elapsed_s"] - first["elapsed_s"])


def check_memory(args, work):
    """Peak device memory of a bf16 GPT-2-small step at T = 4096, engine against torch SDPA."""
    shape = STANDIN_SHAPE[:-2] + ["--seq-len", "64"] if args.stand_in else MEMORY_SHAPE
    tried = []
    for attention in args.memory_attention.split(","):
        p = xtrain("bench", "train", "--device", "cuda", "--dtype", "bf16", "--against", "sdpa", "--attention",
                   attention, "--steps", "2", "--rounds", "1", *shape, *(["--peak-n", "256"] if args.stand_in else []),
                   env=env_for("cuda", args.stand_in), timeout=min(args.step_timeout, TIMEOUTS["memory"]),
                   label=f"memory-{attention}")
        RESULTS[f"memory {attention}"] = p.stdout
        if DRY_RUN:
            return "PASS", "dry run"
        line = next((ln for ln in p.stdout.splitlines() if ln.startswith("peak device memory")), None)
        if p.returncode == 0 and line:
            RESULTS["memory"] = (attention, line)
            return "PASS", f"{attention} attention: {line}"
        tried.append(f"{attention}: {tail(p)}")
    return "FAIL", "; ".join(tried)


def graph_switch() -> str | None:
    """The `xtrain train` flag that turns the step's CUDA graph off, if it has one yet."""
    p = subprocess.run([sys.executable, "-m", "xtrain_lessons.cli.main", "train", "--help"], capture_output=True,
                       text=True, cwd=REPO, timeout=120)
    flags = re.findall(r"--[a-z][a-z0-9-]*", p.stdout)
    named = [f for f in ("--no-cuda-graph", "--no-graph", "--eager-step") if f in flags]
    return (named or [f for f in flags if f.startswith("--no-") and "graph" in f] or [None])[0]


def check_graph_loop(args, work):
    """float32: the loop with its graph (stopped at 30, resumed to 60, eval every 20) against the
    loop with the graph off, every logged loss and the final weights bit for bit."""
    off = None if DRY_RUN else graph_switch()
    if off is None and not DRY_RUN:
        return "SKIP", "`xtrain train --help` names no switch that turns the step's CUDA graph off (not merged yet?)"
    base = ["--device", "cuda", "--dtype", "float32", "--preset", "tiny", "--vocab-size", "2048", "--batch-size",
            "16", "--seq-len", "128", "--steps", "60", "--eval-every", "20", "--eval-batches", "2", "--sample-every",
            "0", "--checkpoint-every", "30", "--no-export", "--no-hf-check", "--no-progress", "--tokenizer-impl", "hf",
            "--seed", "0"]
    if args.stand_in:
        base = ["--device", "cuda", "--dtype", "float32", *STANDIN_SHAPE, "--steps", "6", "--eval-every", "2",
                "--eval-batches", "1", "--sample-every", "0", "--checkpoint-every", "3", "--no-export", "--no-hf-check",
                "--no-progress", "--tokenizer-impl", "hf", "--seed", "0"]
    half = "3" if args.stand_in else "30"
    env, t = env_for("cuda", args.stand_in), min(args.step_timeout, TIMEOUTS["graph-loop"])
    runs = [("graph", ["train", *base, "--out", work / "graph", "--stop-at", half]),
            ("graph", ["train", "--device", "cuda", "--resume", work / "graph", "--no-progress", "--no-export",
                       "--no-hf-check"]),
            ("eager", ["train", *base, "--out", work / "eager", *([off] if off else [])])]
    for name, cmd in runs:
        p = xtrain(*cmd, env=env, timeout=t, label=f"graph-loop-{name}")
        if p.returncode != 0:
            return "FAIL", f"{name}: {tail(p)}"
    if DRY_RUN:
        return "PASS", "dry run"
    return compare_runs(work / "graph", work / "eager")


def compare_runs(a: Path, b: Path) -> tuple[str, str]:
    """("PASS" or "FAIL", detail): two runs' metric records (losses, grad norms, val losses) and final
    weights, bit for bit."""
    from safetensors.numpy import load_file  # noqa: PLC0415

    def records(run):  # one per step (a resumed run's file may repeat the steps after its checkpoint)
        keep = ("step", "train_loss", "grad_norm", "val_loss")
        by_step = {r["step"]: {k: r.get(k) for k in keep}
                   for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
        return [by_step[s] for s in sorted(by_step)]

    def weights(run):  # the final checkpoint's parameters and AdamW moments
        step = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
        return {f"{f}:{k}": v for f in ("model", "optimizer") if (step / f"{f}.safetensors").exists()
                for k, v in load_file(step / f"{f}.safetensors").items()}

    ra, rb = records(a), records(b)
    differ = [x["step"] for x, y in zip(ra, rb) if x != y] + (["count"] if len(ra) != len(rb) else [])
    wa, wb = weights(a), weights(b)
    wdiff = sorted(k for k in wa if k not in wb or wa[k].tobytes() != wb[k].tobytes())
    if differ or wdiff or set(wa) != set(wb):
        return "FAIL", (f"the graphed loop differs from the eager one: records at steps {differ[:5]}, "
                        f"weights {wdiff[:3]}")
    return "PASS", f"{len(ra)} records and {len(wa)} weight and moment tensors identical (graph with a resume vs eager)"


def check_gpu_tests_quick(args, work):
    if args.stand_in:
        return "SKIP", "needs a real GPU (the tests skip on the stand-in)"
    files = sorted({str(p.relative_to(REPO)) for pattern in QUICK_TESTS for p in REPO.glob(pattern)})
    p = run([sys.executable, "-m", "pytest", "-m", "gpu", "-v", "-o", "addopts=", "-p", "no:cacheprovider",
             "-k", "not compile and not reduce_overhead", *files], env_for("cuda", False),
            timeout=min(args.step_timeout, TIMEOUTS["gpu-tests-quick"]), label="gpu-tests-quick")
    summary = tail(p)
    ok = p.returncode == 0 and ("passed" in summary or bool(DRY_RUN))
    return ("PASS" if ok else "FAIL"), f"{summary} ({len(files)} files)"


def check_bench_f32(args, work):
    p = xtrain("bench", "train", "--device", "cuda", "--dtype", "float32", "--cuda-graph", "--against",
               args.bench_against, *_bench_counts(args), *_bench_shape(args, "20m"), env=env_for("cuda", args.stand_in),
               timeout=min(args.step_timeout, TIMEOUTS["bench-f32"]), label="bench-20m-f32")
    RESULTS["bench 20m float32"] = p.stdout
    print("\n".join("       " + ln for ln in p.stdout.strip().splitlines()[-12:]), flush=True)
    return ("FAIL" if p.returncode else "PASS"), tail(p)


# ------------------------------------------------------------------ reading the outputs
def stepper_rate(bench: str, name: str) -> float | None:
    """tokens/s of the bench's line for stepper `name` ("engine", "engine+graph", "torch sdpa")."""
    line = next((ln for ln in bench.splitlines() if ln.startswith(name + ":")), "")
    m = re.search(r"([\d,]+) tok/s", line)
    return float(m.group(1).replace(",", "")) if m else None


def summary_line(bench: str, graph: bool) -> str:
    prefix = "throughput vs torch (CUDA graph):" if graph else "throughput vs torch:"
    return next((ln for ln in bench.splitlines() if ln.startswith(prefix)), "")


def ratio(line: str, baseline: str) -> float | None:
    m = re.search(rf"(?:: |, ){re.escape(baseline)} ([\d.]+)x", line)
    return float(m.group(1)) if m else None


def mfu(line: str) -> float | None:
    m = re.search(r"MFU ([\d.]+)%", line)
    return float(m.group(1)) if m else None


def memory_ratio(line: str) -> float | None:
    m = re.search(r"engine / (?:.*?, )?torch sdpa ([\d.]+)x", line)
    return float(m.group(1)) if m else None


def targets() -> list[dict]:
    """Issue 39's four targets from what the checks measured: MET, NOT MET or NOT MEASURED."""
    out = []

    def target(name, value, ok, shown):
        out.append({"target": name, "value": value, "status": "NOT MEASURED" if value is None else
                    "MET" if ok(value) else "NOT MET", "shown": "n/a" if value is None else shown(value)})

    def graphed(bench):  # the bench's engine+graph line is a replayed graph, not its eager fallback
        return "CUDA graph: the step is captured and replayed" in bench

    def note(bench):
        return "" if graphed(bench) else "; the engine's graph was NOT used (eager fallback)"

    for shape in ("20m", "gpt2-small"):  # reduce-overhead: in the compiled run, or wherever it was named
        bench = RESULTS.get(f"bench {shape} bf16 compiled", "")
        if ratio(summary_line(bench, graph=True), "reduce-overhead") is None:
            bench = RESULTS.get(f"bench {shape} bf16", "")
        line = summary_line(bench, graph=True)
        target(f"bf16 {shape}: engine graph >= 1.0x torch.compile(reduce-overhead)", ratio(line, "reduce-overhead"),
               lambda v: v >= 1.0, lambda v, b=bench: f"{v:.2f}x{note(b)}")
    bench = RESULTS.get("bench gpt2-small bf16", "")
    line = summary_line(bench, graph=True)
    basis = "dense spec" in line
    target("bf16 gpt2-small: MFU >= 35% of the card's dense bf16 spec peak", mfu(line) if basis else None,
           lambda v: v >= 35.0, lambda v: f"{v:.1f}%{note(bench)}")
    bench = RESULTS.get("bench 20m bf16", "")
    graph = stepper_rate(bench, "engine+graph")
    tps = RESULTS.get("train tok/s")
    target("xtrain train bf16 tokens/s within 10% of the bench's graphed step (20m)",
           tps / graph if tps and graph else None, lambda v: v >= 0.9, lambda v: f"{v:.2f}x{note(bench)}")
    mem = RESULTS.get("memory")
    target("peak memory at T=4096 <= 1.5x torch SDPA's", memory_ratio(mem[1]) if mem else None,
           lambda v: v <= 1.5, lambda v: f"{v:.2f}x ({mem[0]} attention)")
    return out


def write_summary(path: Path, checks: list[dict], started: float) -> None:
    """summary.txt and summary.json beside each other, written whole (atomically) each time."""
    tgt = targets()
    figures = {k: v for k, v in RESULTS.items() if not isinstance(v, str)}
    lines = [f"gpu_check summary, {time.perf_counter() - started:.0f} s since the start"]
    lines += [f"{c['status']} {c['check']}: {c['detail']} ({c['seconds']:.0f} s)" for c in checks]
    lines += ["", "issue 39 targets:"] + [f"  {t['status']}: {t['target']} ({t['shown']})" for t in tgt]
    for key in [k for k in RESULTS if k.startswith("bench ")]:
        picked = [ln for ln in RESULTS[key].splitlines() if ln.startswith(("throughput vs torch", "peak device memory",
                                                                           "MFU against", "CUDA graph:", "torch "))
                  or "LOSS MISMATCH" in ln or "not in the table" in ln]
        lines += ["", f"{key}:"] + [f"  {ln}" for ln in picked]
    for key, value in (("memory", RESULTS.get("memory")), ("train tok/s", RESULTS.get("train tok/s"))):
        if value is not None:
            lines += ["", f"{key}: {value[1] if isinstance(value, tuple) else f'{value:,.0f}'}"]
    for suffix, text in ((".txt", "\n".join(lines) + "\n"),
                         (".json", json.dumps({"checks": checks, "targets": tgt, "figures": figures}, indent=1))):
        target_path = path.with_suffix(suffix)
        tmp = target_path.with_name(target_path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, target_path)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--stand-in", action="store_true", help="run on the CPU with the stand-in for CuPy (cupy_standin; CI)")
    ap.add_argument("--quick", action="store_true", help="fewer steps and notebooks, no benchmark")
    ap.add_argument("--only", default="", help=f"comma-separated checks, in this order, from {','.join(CHECKS)}; "
                    f"'lease' stands for {LEASE_PLAN} (default: {','.join(DEFAULT_CHECKS)})")
    ap.add_argument("--notebooks", default="",
                    help="comma-separated phases to execute, in this order; 'rest' adds the others (default: all)")
    ap.add_argument("--notebooks-kept", default="", help="phases whose executed notebooks --out keeps")
    ap.add_argument("--train-steps", type=int, default=0, help="steps of each train run (default 200; --quick 40)")
    ap.add_argument("--bench-against", default="sdpa,compile,cuda-graph",
                    help="torch twins of the float32 bench and bench-f32 (bf16 runs against amp)")
    ap.add_argument("--bench-flags", default="--cuda-graph", help="more flags for each `xtrain bench train` run")
    ap.add_argument("--bench-dtypes", default="float32,bf16", help="dtypes the bench times")
    ap.add_argument("--targets-against", default="sdpa,cuda-graph", help="the torch baselines of targets-bf16")
    ap.add_argument("--compiled-against", default="reduce-overhead",
                    help="the torch baselines of targets-compiled (compiled ones: minutes each)")
    ap.add_argument("--memory-attention", default="flash,composed",
                    help="the engine's attention for the memory check: the first that runs")
    ap.add_argument("--profile-dtypes", default="bf16,float32", help="dtypes the profile check profiles")
    ap.add_argument("--profile-flags", default="", help="more flags for scripts/gpu_profile.py (e.g. --python)")
    ap.add_argument("--profile-shapes", default="tiny,20m,gpt2-small",
                    help="the bench shapes the profile check profiles")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds: start nothing after this, kill what runs at it, report what ran (a lent GPU)")
    ap.add_argument("--step-timeout", type=float, default=1800, help="seconds at most for any one command")
    ap.add_argument("--out", type=Path, help="a folder for every command's full output and the executed notebooks")
    ap.add_argument("--summary", type=Path, default=None,
                    help="where summary.txt / summary.json go (default: --out's folder)")
    ap.add_argument("--dry-run", type=float, default=None, metavar="S",
                    help="every command prints itself and sleeps S seconds (the plan and its budget, no GPU)")
    args = ap.parse_args(argv)
    started = time.perf_counter()
    if args.budget:
        DEADLINE[0] = started + args.budget
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        OUT_DIR.append(args.out)
    if args.dry_run is not None:
        DRY_RUN.append(args.dry_run)
    summary = args.summary or (args.out / "summary" if args.out else None)
    chosen = [c.strip() for c in args.only.replace("lease", LEASE_PLAN).split(",") if c.strip()] or list(DEFAULT_CHECKS)
    unknown = sorted(set(chosen) - set(CHECKS))
    if unknown:
        print(f"gpu_check: error: unknown check(s) {unknown}; choose from {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    if not args.stand_in and not DRY_RUN:
        from xtrain_lessons.runtime import device  # noqa: PLC0415

        if not device.gpu_available():
            print("gpu_check: error: no usable GPU (CuPy and an NVIDIA GPU are needed); "
                  "--stand-in runs the CPU-side parts", file=sys.stderr)
            return 2
    failed, done = False, []
    with tempfile.TemporaryDirectory(prefix="xtrain-gpu-check-") as tmp:
        SCRATCH.append(Path(tmp))
        for name in chosen:
            t0 = time.perf_counter()
            try:
                status, detail = globals()[f"check_{name.replace('-', '_')}"](args, Path(tmp))
            except OutOfBudget as e:
                status, detail = "SKIP", str(e)
            except subprocess.TimeoutExpired as e:
                status, detail = "FAIL", f"timed out after {e.timeout:.0f} s (what it printed is in its log)"
            except Exception as e:  # noqa: BLE001 - one line per check, whatever happens
                status, detail = "FAIL", f"{type(e).__name__}: {e}"
            failed |= status == "FAIL"
            print(f"{status} {name}: {detail} ({time.perf_counter() - t0:.0f} s)", flush=True)
            done.append({"check": name, "status": status, "detail": detail, "seconds": time.perf_counter() - t0})
            if summary is not None:
                write_summary(summary, done, started)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
