"""The lent GPU's one prepared run (scripts/gpu_lease.sh -> scripts/gpu_check.py), its CPU-side
logic: a command killed at its timeout with its whole process group, its output kept; the budget
never overrun (nothing starts after it, what runs is killed at it); the summary rewritten after each
check; the bench's lines read back into issue 39's four targets; two runs compared bit for bit; and
the shell script's dry run (commands that sleep), which installs nothing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def gc():
    """scripts/gpu_check.py as a module, its globals fresh."""
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", REPO / "scripts" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_command_past_its_timeout_is_killed_with_its_children_and_keeps_its_output(gc, tmp_path):
    gc.OUT_DIR.append(tmp_path)
    pid_file = tmp_path / "child.pid"
    script = ("import subprocess, sys, time; print('partial result', flush=True); "
              f"c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
              f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(120)")
    t0 = time.perf_counter()
    with pytest.raises(subprocess.TimeoutExpired) as e:
        gc.run([sys.executable, "-c", script], dict(os.environ), timeout=6, label="slow")
    assert time.perf_counter() - t0 < 20
    assert "partial result" in e.value.output
    log = next(tmp_path.glob("*_slow.log")).read_text()
    assert "partial result" in log
    child = int(pid_file.read_text())
    time.sleep(0.5)
    assert _dead(child), "the grandchild outlived the kill"
    assert "timed out after 6 s" in (tmp_path / "commands.log").read_text()


def _dead(pid: int) -> bool:
    """Gone, or a zombie waiting for a parent (in a container, PID 1 may never reap it)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except (FileNotFoundError, ProcessLookupError):
        return True


def test_the_budget_is_never_overrun_and_the_summary_lists_every_check(gc, tmp_path, capsys):
    """Dry run: each command sleeps 30 s; the budget is 10 s. The first command is killed at the
    budget (its output kept), every later check is skipped, and the summary says so."""
    t0 = time.perf_counter()
    code = gc.main(["--only", "lease", "--dry-run", "30", "--budget", "10", "--out", str(tmp_path)])
    took = time.perf_counter() - t0
    assert took < 10 + 12, took  # the budget, the kill's grace, Python's start
    assert code == 1  # the killed command is a failure
    lines = capsys.readouterr().out.strip().splitlines()
    status = {ln.split()[1].rstrip(":"): ln.split()[0] for ln in lines if ln.split()[0] in ("PASS", "FAIL", "SKIP")}
    plan = gc.LEASE_PLAN.split(",")
    assert list(status) == plan
    assert status["targets-bf16"] == "FAIL" and all(status[c] == "SKIP" for c in plan[1:])
    first = next(tmp_path.glob("01_bench-20m.log")).read_text()
    assert "DRY RUN:" in first and "--preset 20m" in first
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [c["check"] for c in summary["checks"]] == plan
    assert all(t["status"] == "NOT MEASURED" for t in summary["targets"]) and len(summary["targets"]) == 5
    assert "issue 39 targets:" in (tmp_path / "summary.txt").read_text()


def test_a_dry_run_within_budget_runs_the_plan_in_order(gc, tmp_path, capsys):
    assert gc.main(["--only", "targets-bf16,train-speed,memory,targets-compiled", "--dry-run", "0.2", "--budget", "60",
                    "--out", str(tmp_path)]) == 0
    logs = sorted(p.name for p in tmp_path.glob("*.log") if p.name != "commands.log")
    assert logs == ["01_bench-20m.log", "02_bench-gpt2-small.log", "03_train-speed.log", "04_memory-flash.log",
                    "05_compiled-20m.log", "06_compiled-gpt2-small.log"]
    assert "--against reduce-overhead" in (tmp_path / "06_compiled-gpt2-small.log").read_text()
    assert "--seq-len 4096" in (tmp_path / "04_memory-flash.log").read_text()
    assert "--against sdpa,cuda-graph" in (tmp_path / "01_bench-20m.log").read_text()


BENCH_20M = """\
bench train on the GPU: device: cuda (CuPy 14.2.0, NVIDIA H100 80GB HBM3, 80 GB); preset 20m (30.1M params, vocab 8192, composed attention), bf16, batch 32 x 512 = 16384 tokens/step, 3 rounds x 6 timed steps
MFU against the H100 SXM's dense bf16 peak, 989.4 TFLOP/s (NVIDIA H100 data sheet (SXM))
CUDA graph: the step is captured and replayed (checked bit for bit against the eager step)
engine: 36.6 ms/step (host 30.1 ms to issue one), 447,650 tok/s, 80.6 TFLOP/s, MFU 8.1%, first loss 9.0123, step peak memory 6.10 GiB
engine+graph: 22.8 ms/step (host 0.5 ms to issue one), 718,596 tok/s, 129.4 TFLOP/s, MFU 13.1%, first loss 9.0123 (|Δ| 0.0e+00), step peak memory 7.20 GiB
torch sdpa: 32.3 ms/step (host 20.0 ms to issue one), 507,245 tok/s, 91.3 TFLOP/s, MFU 9.2%, first loss 9.0131 (|Δ| 8.0e-04), step peak memory 4.10 GiB
torch reduce-overhead: 21.0 ms/step (host 0.4 ms to issue one), 780,190 tok/s, 140.5 TFLOP/s, MFU 14.2%, first loss 9.0130 (|Δ| 7.0e-04), step peak memory 5.00 GiB
peak device memory of one step: engine 6.10 GiB, engine+graph 7.20 GiB, torch sdpa 4.10 GiB, torch reduce-overhead 5.00 GiB (engine / torch sdpa 1.49x, torch reduce-overhead 1.22x)
throughput vs torch (CUDA graph): sdpa 1.42x, reduce-overhead 0.92x (engine+graph 718,596 tok/s, 129.4 TFLOP/s, MFU 13.1% of 989.4 TFLOP/s (bf16), dense spec of the H100 SXM)
throughput vs torch: sdpa 0.88x, reduce-overhead 0.57x (engine 447,650 tok/s, 80.6 TFLOP/s, MFU 8.1% of 989.4 TFLOP/s (bf16), dense spec of the H100 SXM)
"""


def test_the_targets_are_read_from_the_benchs_lines(gc):
    line = gc.summary_line(BENCH_20M, graph=True)
    assert gc.ratio(line, "reduce-overhead") == 0.92 and gc.ratio(line, "sdpa") == 1.42 and gc.mfu(line) == 13.1
    assert gc.ratio(gc.summary_line(BENCH_20M, graph=False), "sdpa") == 0.88
    assert gc.stepper_rate(BENCH_20M, "engine+graph") == 718596 and gc.stepper_rate(BENCH_20M, "engine") == 447650
    mem = next(ln for ln in BENCH_20M.splitlines() if ln.startswith("peak device memory"))
    assert gc.memory_ratio(mem) == 1.49
    assert gc.memory_ratio("peak device memory of one step: engine 0.6 MiB") is None
    gc.RESULTS.update({"bench 20m bf16": BENCH_20M, "bench gpt2-small bf16": BENCH_20M.replace("0.92x", "1.07x")
                       .replace("MFU 13.1% of", "MFU 36.2% of"), "train tok/s": 0.95 * 718596.0,
                       "memory": ("flash", mem)})
    assert [(t["status"], t["shown"]) for t in gc.targets()] == [
        ("NOT MET", "0.92x"),  # bf16 20m: the engine's graph against reduce-overhead
        ("MET", "1.07x"),  # bf16 gpt2-small
        ("MET", "36.2%"),  # MFU at gpt2-small against the dense spec peak
        ("MET", "0.95x"),  # xtrain train against the bench's graphed step
        ("MET", "1.49x (flash attention)")]  # memory at T = 4096 against torch SDPA
    fallback = BENCH_20M.replace("CUDA graph: the step is captured and replayed", "CUDA graph: not used, the capture failed")
    gc.RESULTS["bench 20m bf16"] = fallback
    assert "NOT used" in gc.targets()[0]["shown"]
    gc.RESULTS["bench gpt2-small bf16"] = BENCH_20M.replace("dense spec of the H100 SXM", "measured")
    assert gc.targets()[2]["status"] == "NOT MEASURED"  # MFU against a measured peak is not the target's
    gc.RESULTS["bench 20m bf16"] = BENCH_20M.replace(", reduce-overhead 0.92x", "")  # targets-bf16: no compile
    gc.RESULTS["bench 20m bf16 compiled"] = BENCH_20M.replace("sdpa 1.42x, reduce-overhead 0.92x", "reduce-overhead 1.10x")
    assert gc.targets()[0]["shown"] == "1.10x"  # read from the compiled run


def test_the_train_runs_steady_tokens_per_second(gc):
    recs = [{"step": s, "tokens": s * 1000, "elapsed_s": 5.0 + 0.01 * s, "tokens_per_s": 1.0} for s in range(1, 81)]
    recs[0]["elapsed_s"] = 4.0  # the first step: capture and compilation, left out
    assert gc.steady_tokens_per_s(recs) == pytest.approx(1000 / 0.01)


def _run_dir(root: Path, weights: dict, losses: list[float]) -> Path:
    from safetensors.numpy import save_file  # noqa: PLC0415

    step = root / "checkpoints" / "step_00000060"
    step.mkdir(parents=True)
    (root / "checkpoints" / "latest").write_text("step_00000060\n")
    save_file(weights, str(step / "model.safetensors"))
    save_file({k + ".exp_avg": v * 0.5 for k, v in weights.items()}, str(step / "optimizer.safetensors"))
    (root / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "train_loss": x, "grad_norm": 1.0,
                                                            "tokens_per_s": 5.0}) + "\n" for i, x in enumerate(losses)))
    return root


def test_two_runs_are_compared_bit_for_bit(gc, tmp_path):
    w = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, np.float32)}
    a = _run_dir(tmp_path / "a", w, [3.0, 2.5])
    b = _run_dir(tmp_path / "b", {k: v.copy() for k, v in w.items()}, [3.0, 2.5])
    status, detail = gc.compare_runs(a, b)
    assert status == "PASS" and "4 weight and moment tensors identical" in detail
    w2 = {k: v.copy() for k, v in w.items()}
    w2["b"][2] = np.nextafter(np.float32(1), np.float32(2))  # one ulp
    assert gc.compare_runs(a, _run_dir(tmp_path / "c", w2, [3.0, 2.5]))[0] == "FAIL"
    assert gc.compare_runs(a, _run_dir(tmp_path / "d", w, [3.0, 2.500001]))[0] == "FAIL"


@pytest.mark.slow
def test_the_lease_script_dry_run_keeps_everything_and_installs_nothing(tmp_path):
    out = tmp_path / "lease"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    t0 = time.perf_counter()
    p = subprocess.run(["bash", str(REPO / "scripts" / "gpu_lease.sh"), str(out), "12", "--only", "lease", "--dry-run", "2"],
                       cwd=REPO, env={**env, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}"},
                       capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout + p.stderr
    assert time.perf_counter() - t0 < 150
    for name in ("env.txt", "gpu_check.txt", "summary.txt", "summary.json", "r/01_bench-20m.log", "r/commands.log"):
        assert (out / name).is_file(), name
    assert not (out / "install.txt").exists()  # a dry run installs nothing
    assert "numpy" in (out / "env.txt").read_text()
    assert p.stdout.rstrip().endswith((out / "summary.txt").read_text().rstrip())  # the summary closes the output
    assert "SKIP gpu-tests: --budget ran out" in (out / "gpu_check.txt").read_text()
