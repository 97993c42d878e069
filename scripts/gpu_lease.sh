#!/usr/bin/env bash
# One prepared call on a lent GPU, inside a hard time budget, every output kept under OUT_DIR.
#
#   bash scripts/gpu_lease.sh OUT_DIR [BUDGET_SECONDS [GPU_CHECK_ARGS...]]
#   bash scripts/gpu_lease.sh "$OUT" 450                          # issue 39's plan, below
#   bash scripts/gpu_lease.sh "$OUT" 500 --only gpu-tests,bench   # gpu_check.py with exactly these arguments
#   bash scripts/gpu_lease.sh /tmp/lease 12 --only lease --dry-run 2  # the plan on any machine: commands sleep
#
# Without GPU_CHECK_ARGS it runs `gpu_check.py --only lease`, most valuable first, so that a budget
# running out loses the least (seconds: each command's own timeout, never past the budget):
#   1 targets-bf16     the bench in bf16 at 20m and GPT-2-small (<=120 each) with --cuda-graph against torch
#                      sdpa and a whole-step torch.cuda.graph (nothing to compile): MFU against the card's
#                      dense spec peak, first losses checked equal, each step's peak memory
#   2 train-speed      xtrain train --device cuda --dtype bf16 at the 20m shape, 80 steps: tokens/s against
#                      the bench's graphed step (<=120)
#   3 memory           peak device memory at T = 4096 (B x T = 8192), GPT-2-small bf16, the engine (flash
#                      attention, else composed) against torch SDPA (<=100 per attention tried)
#   4 targets-compiled the bench again at both shapes against torch.compile(mode="reduce-overhead")
#                      (<=200, <=230: compiling takes minutes, so it comes after the quick figures)
#   5 graph-loop       float32, the loop with its step as a graph (stopped at 30, resumed to 60) against the
#                      eager loop: losses and final weights bit for bit (3 runs, <=60 each; skipped while
#                      `xtrain train` has no --no-...graph switch)
#   6 gpu-tests-quick  pytest -m gpu on the GPU engine's, graphs', flash-attention's, cuBLAS's and the
#                      baselines' tests, -v (<=110)
#   7 bench-f32        the bench in float32 at 20m against sdpa, compile, cuda-graph (<=180)
#   8 gpu-tests        every -m gpu test, in what time is left
# Each command runs in its own process group, killed at its timeout or at the budget; nothing starts
# after the budget; a backstop `timeout` ends gpu_check itself at BUDGET + 30 s.
#
# OUT_DIR gets: env.txt (GPU, driver, CUDA, CuPy, cuBLAS, torch), gpu_check.txt (one line per check,
# the bench tables), summary.txt and summary.json (each check's status and time, the measured figures
# and issue 39's four targets, MET / NOT MET / NOT MEASURED; rewritten after every check), and r/:
# NN_<step>.log (each command's whole output, written as it runs: a killed command keeps what it
# printed), commands.log, train_metrics.jsonl (the train check), the notebooks --notebooks-kept names.
# Give the session's run call a timeout of at least BUDGET + 60 s (install, env, the backstop's grace).
#
# The machine has torch, CuPy (CUDA 13), pytest, matplotlib, ml_dtypes, tokenizers and safetensors,
# but no Jupyter: the notebook stack travels as wheels in .whl/ (ignored by git), made here with
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 ... \
#       -d .whl nbclient nbformat ipykernel      (then drop what the machine has: packaging, psutil, ...)
set -uo pipefail
out=${1:?usage: gpu_lease.sh OUT_DIR [BUDGET_SECONDS [GPU_CHECK_ARGS...]]}
budget=${2:-450}
shift $(( $# < 2 ? $# : 2 ))
if [ $# -eq 0 ]; then
    set -- --only lease
fi
dry=0
for a in "$@"; do [ "$a" = "--dry-run" ] && dry=1; done
mkdir -p "$out/r"
export PYTHONUNBUFFERED=1
if [ "$dry" = 0 ]; then  # a dry run installs nothing: it may run beside a developer's environment
    if [ -d .whl ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
            && export PYTHONPATH=/tmp/site
    fi
    python3 -m pip install -q --no-deps --no-build-isolation -e . > "$out/install.txt" 2>&1
fi
{
    date -u
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,compute_cap --format=csv 2>&1 || true
    timeout 120 python3 - <<'EOF' 2>&1
import sys
print("python", sys.version.split()[0])
for mod in ("numpy", "cupy", "torch", "ml_dtypes"):
    try:
        m = __import__(mod)
        print(mod, m.__version__)
    except Exception as e:  # noqa: BLE001
        print(mod, "not available:", type(e).__name__, e)
try:
    import torch
    if torch.cuda.is_available():
        print("torch CUDA", torch.version.cuda, torch.cuda.get_device_name(0), "sm", torch.cuda.get_device_capability(0))
    from xtrain_lessons.runtime import cublas_direct, device
    print(device.describe())
    if device.get_device() == "cuda":
        cp = device.import_cupy()
        print("CUDA runtime (CuPy)", cp.cuda.runtime.runtimeGetVersion(), "driver", cp.cuda.runtime.driverGetVersion())
        cublas_direct.direct_cublas(cp)  # loads, checks and describes the libcublas the products will call
        print("matmuls:", cublas_direct.describe())
except Exception as e:  # noqa: BLE001
    print("environment check:", type(e).__name__, e)
EOF
    nproc
    uptime
} > "$out/env.txt" 2>&1
timeout -k 10 $(( ${budget%.*} + 30 )) python3 scripts/gpu_check.py --budget "$budget" --out "$out/r" --summary "$out/summary" "$@" \
    2>&1 | tee "$out/gpu_check.txt"
status=${PIPESTATUS[0]}
[ -f "$out/summary.txt" ] && cat "$out/summary.txt"
exit "$status"
