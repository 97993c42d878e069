#!/usr/bin/env bash
# The GPU check on a lent machine with a time budget (a session's 15 minutes, start included).
#
#   bash scripts/gpu_lease.sh OUT_DIR [BUDGET_SECONDS [GPU_CHECK_ARGS...]]
#
# Without GPU_CHECK_ARGS it runs the tests, the bench, train, launch and the notebooks; with them,
# gpu_check.py runs with exactly those (e.g. --only gpu-tests,profile,bench --bench-against eager).
#
# The machine has torch, CuPy (CUDA 13), pytest, matplotlib, ml_dtypes, tokenizers and safetensors,
# but no Jupyter: the notebook stack travels as wheels in .whl/ (ignored by git), made here with
#   pip download --only-binary=:all: --python-version 3.12 --platform manylinux_2_28_x86_64 ... \
#       -d .whl nbclient nbformat ipykernel      (then drop what the machine has: packaging, psutil, ...)
# Every output lands in OUT_DIR: env.txt, gpu_check.txt (one line per check, the bench tables),
# r/commands.log (each command's full output), r/train_metrics.jsonl (every step of the train runs) and
# r/T07*.ipynb, r/T12*.ipynb (the notebooks as executed on the GPU).
set -uo pipefail
out=${1:?usage: gpu_lease.sh OUT_DIR [BUDGET_SECONDS]}
budget=${2:-560}
shift $(( $# < 2 ? $# : 2 ))
if [ $# -eq 0 ]; then
    set -- --only gpu-tests,bench,train,launch,notebooks --step-timeout 150 --notebooks T01,T03,T07,T12,rest \
        --notebooks-kept T07,T12 --train-steps 15 --bench-against eager,sdpa
fi
export PYTHONUNBUFFERED=1
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
{
    python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -3
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
    python3 -c "import sys, cupy, numpy, torch, ml_dtypes; print(sys.version.split()[0], 'cupy', cupy.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__, 'ml_dtypes', ml_dtypes.__version__)"
    nproc; uptime
} > "$out/env.txt" 2>&1
python3 scripts/gpu_check.py --budget "$budget" --out "$out/r" "$@" 2>&1 | tee "$out/gpu_check.txt"
