"""The GPU check: everything a contributor with an NVIDIA GPU runs before saying "it works on a GPU".

    python scripts/gpu_check.py                  # on a machine with a GPU and CuPy (about 10 minutes)
    python scripts/gpu_check.py --quick          # the same with fewer steps and no benchmark
    python scripts/gpu_check.py --stand-in       # the CPU-side parts, on the tests' CuPy stand-in (CI)
    python scripts/gpu_check.py --only train,launch
    python scripts/gpu_check.py --budget 500 --out results/ --notebooks T01,T03 --bench-against eager,sdpa
                                                 # a lent GPU's session: stop in time, keep every output

It prints one line per check — `PASS name: detail`, `FAIL name: reason` or `SKIP name: reason` —
and exits 1 when any check failed. The checks:

  gpu-tests   `pytest -m gpu`: every GPU kernel against its reference on the device, and the
              model's float32 / bf16 steps against the CPU's
  notebooks   every solution notebook, executed with the device set to cuda (to the end)
  train       `xtrain train` in float32, bf16 and fp16 on the GPU and on the CPU, same seed and
              data: the final train and validation losses agree within TRAIN_BOUND nats
  launch      `xtrain launch --nproc 2` with both ranks on one GPU (gloo through the host)
  bench       `xtrain bench train --device cuda` at the tiny, 20m and gpt2-small shapes: the
              engine in float32 against torch eager, sdpa and compile, and in bf16 against
              torch autocast bf16 (amp), on the same GPU
  profile     scripts/gpu_profile.py at the bench's shapes (--profile-dtypes): the step's wall time,
              the host's time to issue it, the GPU's busy time and the kernels that fill it

`--stand-in` runs the same commands on the CPU with cupy_standin as CuPy (what CI can do): the
notebooks, train and launch checks run; gpu-tests and bench are skipped (no GPU to measure).
"""

from __future__ import annotations

import argparse
import json
import os
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
CHECKS = ("gpu-tests", "notebooks", "train", "launch", "bench", "profile")
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


class OutOfBudget(Exception):
    """--budget ran out before this command could start."""


def remaining() -> float:
    return DEADLINE[0] - time.perf_counter()


def run(cmd, env, timeout=1800) -> subprocess.CompletedProcess:
    timeout = min(timeout, remaining())
    if timeout < 5:
        raise OutOfBudget(f"--budget ran out before: {' '.join(str(c) for c in cmd[-6:])}")
    try:
        p = subprocess.run([str(c) for c in cmd], env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired as e:
        _log(cmd, f"timed out after {timeout:.0f} s", e.stdout, e.stderr)
        raise
    _log(cmd, f"exit {p.returncode}", p.stdout, p.stderr)
    return p


def _log(cmd, status, stdout, stderr) -> None:
    if OUT_DIR:
        text = "".join(x.decode(errors="replace") if isinstance(x, bytes) else x or "" for x in (stdout, stderr))
        with open(OUT_DIR[0] / "commands.log", "a") as f:
            f.write(f"$ {' '.join(str(c) for c in cmd)}\n({status})\n{text}\n")


def xtrain(*args, env, timeout=1800):
    return run([sys.executable, "-m", "xtrain_lessons.cli.main", *args], env, timeout)


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
            timeout=args.step_timeout)
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
    names = args.notebooks.split(",") if args.notebooks else ["T01", "T05", "T06", "T12"] if args.quick else ["rest"]
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
                       timeout=args.step_timeout)
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
                    env_for("cuda", False),
                    timeout=args.step_timeout)
            if p.returncode != 0:
                failed.append(f"{name} {dtype}: {tail(p)}")
                continue
            done.append(p.stdout.strip().splitlines()[0])
            print("\n".join("       " + ln for ln in p.stdout.strip().splitlines()), flush=True)
    return ("FAIL" if failed else "PASS"), "; ".join(failed + done)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--stand-in", action="store_true", help="run on the CPU with the stand-in for CuPy (cupy_standin; CI)")
    ap.add_argument("--quick", action="store_true", help="fewer steps and notebooks, no benchmark")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(CHECKS)}")
    ap.add_argument("--notebooks", default="",
                    help="comma-separated phases to execute, in this order; 'rest' adds the others (default: all)")
    ap.add_argument("--notebooks-kept", default="", help="phases whose executed notebooks --out keeps")
    ap.add_argument("--train-steps", type=int, default=0, help="steps of each train run (default 200; --quick 40)")
    ap.add_argument("--bench-against", default="eager,sdpa,compile",
                    help="torch twins of the float32 bench (bf16 runs against amp)")
    ap.add_argument("--bench-flags", default="--cuda-graph", help="more flags for each `xtrain bench train` run")
    ap.add_argument("--bench-dtypes", default="float32,bf16", help="dtypes the bench times")
    ap.add_argument("--profile-dtypes", default="bf16,float32", help="dtypes the profile check profiles")
    ap.add_argument("--profile-flags", default="", help="more flags for scripts/gpu_profile.py (e.g. --python)")
    ap.add_argument("--profile-shapes", default="tiny,20m,gpt2-small", help="the bench shapes the profile check profiles")
    ap.add_argument("--budget", type=float, default=0,
                    help="seconds: start nothing after this, report what ran (a lent GPU's session)")
    ap.add_argument("--step-timeout", type=float, default=1800, help="seconds for the test run and each bench run")
    ap.add_argument("--out", type=Path, help="a folder for every command's full output and the executed notebooks")
    args = ap.parse_args(argv)
    if args.budget:
        DEADLINE[0] = time.perf_counter() + args.budget
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        OUT_DIR.append(args.out)
    chosen = [c.strip() for c in args.only.split(",") if c.strip()] or list(CHECKS)
    unknown = sorted(set(chosen) - set(CHECKS))
    if unknown:
        print(f"gpu_check: error: unknown check(s) {unknown}; choose from {', '.join(CHECKS)}", file=sys.stderr)
        return 2
    if not args.stand_in:
        from xtrain_lessons.runtime import device  # noqa: PLC0415

        if not device.gpu_available():
            print("gpu_check: error: no usable GPU (CuPy and an NVIDIA GPU are needed); "
                  "--stand-in runs the CPU-side parts", file=sys.stderr)
            return 2
    failed = False
    with tempfile.TemporaryDirectory(prefix="xtrain-gpu-check-") as tmp:
        for name in chosen:
            t0 = time.perf_counter()
            try:
                status, detail = globals()[f"check_{name.replace('-', '_')}"](args, Path(tmp))
            except OutOfBudget as e:
                status, detail = "SKIP", str(e)
            except Exception as e:  # noqa: BLE001 - one line per check, whatever happens
                status, detail = "FAIL", f"{type(e).__name__}: {e}"
            failed |= status == "FAIL"
            print(f"{status} {name}: {detail} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
