"""The GPU path end to end, on the CPU stand-in for CuPy (cupy_standin): every learner
notebook and every `xtrain` command run with the device set to "cuda", in new processes that take
the stand-in (`cupy_standin.subprocess_env`: a sitecustomize installs it as `cupy`). They must run
to the end on CuPy's rules; their numbers need not match the CPU run's (tests/test_fake_cupy.py
compares those). The step's row kernels run as their NumPy references (KERNELS below). This is
what would have caught the six failures the first real GPU run found: fp16 dying on a host
scalar, `xtrain launch` refusing device arrays, and notebooks handing the GPU host arrays (or the
reverse). What it cannot see is listed in the stand-in's doc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from xtrain_lessons import cupy_standin as fake_cupy
from test_train import small_corpus

REPO = Path(__file__).resolve().parents[1]
# The learner's notebooks, exercises unsolved, are what a learner on a GPU machine runs first: every
# check must say "not yet" on the GPU and hand on a reference that runs there. The solutions, their
# exercises solved, run on the CPU (under nbval, and in the mutation test). T19's study trains 15
# models for 3040 steps, about 12 minutes where every kernel is emulated on the CPU: its CUDA path is
# `xtrain study` below.
LEARNER = [p for p in sorted((REPO / "notebooks").glob("T*.ipynb")) if not p.stem.startswith("T19_")]
pytestmark = pytest.mark.standin
# The step's row kernels (RMSNorm, the softmaxes, the fused classifier) and elementwise kernels
# (residual add, SwiGLU, RoPE, AdamW, bf16's tensor-core flash attention) run as NumPy twins here (cupy_standin._reference_kernels): on
# the emulator every CUDA thread is a fiber and these kernels alone made the notebooks take ~17
# minutes; their CUDA source is tested on the emulator in tests/test_kernels_step.py, against the
# twins in tests/test_standin_references.py, and in the training runs of tests/test_fake_cupy.py.
KERNELS = "reference"


@pytest.mark.parametrize("path", LEARNER, ids=lambda p: p.stem)
def test_learner_notebook_runs_on_the_cuda_path(path):
    from nbclient import NotebookClient  # noqa: PLC0415

    nb = nbformat.read(path, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    client.execute(env=fake_cupy.subprocess_env(kernels=KERNELS))  # raises CellExecutionError naming the cell
    printed = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "device: cuda (CuPy" in printed and "stand-in" in printed, "the notebook did not run on the cuda device"
    assert "✅" not in printed, "a check passed with ✅ on code the learner has not written"


# ------------------------------------------------------------------ every command once, on cuda
def xtrain(*args, cwd=None, timeout=300) -> subprocess.CompletedProcess:
    """`xtrain ARGS --device cuda` in a new process on the stand-in; fails the test on a non-zero exit."""
    p = subprocess.run([sys.executable, "-m", "xtrain_lessons.cli.main", *map(str, args)], cwd=cwd,
                       env=fake_cupy.subprocess_env(kernels=KERNELS), capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"xtrain {' '.join(map(str, args[:2]))} exited {p.returncode}:\n{p.stderr[-3000:]}"
    return p


TINY_RUN = ["--preset", "test", "--vocab-size", "300", "--steps", "4", "--batch-size", "4", "--seq-len", "16",
            "--eval-every", "2", "--eval-batches", "1", "--sample-every", "0", "--sample-tokens", "4",
            "--checkpoint-every", "2", "--no-progress", "--no-hf-check", "--tokenizer-impl", "hf"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return small_corpus(tmp_path_factory.mktemp("corpus") / "small.txt")


@pytest.fixture(scope="module")
def cuda_run(corpus, tmp_path_factory):
    """A run trained on the cuda path: the other commands read it."""
    out = tmp_path_factory.mktemp("runs") / "run"
    xtrain("train", "--device", "cuda", "--data", corpus, "--out", out, *TINY_RUN)
    return out


TRAIN_VARIANTS = {
    "bf16": ["--dtype", "bf16"],
    "fp16": ["--dtype", "fp16"],
    "flash": ["--attention", "flash"],
    "dropout-recompute": ["--dropout", "0.1", "--recompute"],
    "accumulation": ["--accum-steps", "2"],
}


def test_train_float32_writes_a_run_on_cuda(cuda_run):
    summary = json.loads((cuda_run / "summary.json").read_text())
    assert summary["status"] == "done" and summary["step"] == 4, summary
    assert (cuda_run / "checkpoints" / "latest").exists()


@pytest.mark.parametrize("variant", sorted(TRAIN_VARIANTS))
def test_train_variant_on_cuda(variant, corpus, tmp_path):
    out = tmp_path / variant
    p = xtrain("train", "--device", "cuda", "--data", corpus, "--out", out, *TRAIN_VARIANTS[variant], *TINY_RUN)
    assert "on cuda" in p.stdout + p.stderr
    assert json.loads((out / "summary.json").read_text())["status"] == "done"


def test_launch_two_ranks_on_one_gpu(corpus, tmp_path):
    """`xtrain launch --nproc 2` with both ranks on the one (stand-in) GPU: gloo, through the host."""
    out = tmp_path / "two"
    xtrain("launch", "--nproc", "2", "--", sys.executable, "-m", "xtrain_lessons.cli.main", "train",
           "--device", "cuda", "--data", corpus, "--out", out, *TINY_RUN)
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["step"] == 4 and json.loads((out / "summary.json").read_text())["status"] == "done"


def test_sample_on_cuda(cuda_run):
    p = xtrain("sample", cuda_run, "--device", "cuda", "--prompt", "Once upon a time", "--max-new-tokens", "5")
    assert "Once upon a time" in p.stdout


def test_export_check_on_cuda(cuda_run, tmp_path):
    pytest.importorskip("transformers")
    xtrain("export", cuda_run, "--device", "cuda", "--out", tmp_path / "hf", "--check", "--tokens", "5")
    assert (tmp_path / "hf" / "model.safetensors").exists()


def test_eval_on_cuda(cuda_run, corpus):
    p = xtrain("eval", cuda_run, "--device", "cuda", "--data", corpus, "--seq-len", "16", "--json")
    assert json.loads(p.stdout.strip().splitlines()[-1])["bits_per_byte"] > 0


def test_study_micro_on_cuda(corpus, tmp_path):
    xtrain("study", "--device", "cuda", "--preset", "micro", "--data", corpus, "--out", tmp_path / "study",
           "--no-progress", timeout=600)
    assert (tmp_path / "study" / "results.csv").exists()


def test_sft_a_few_steps_on_cuda(cuda_run, tmp_path):
    pairs = tmp_path / "pairs.jsonl"  # short enough for the tiny run's 32 positions
    pairs.write_text("".join(json.dumps({"prompt": f"{a}+{b}=", "response": str(a + b), "answer": a + b}) + "\n"
                             for a, b in ((1, 2), (3, 4), (5, 6), (7, 8))))
    xtrain("sft", cuda_run, "--device", "cuda", "--data", pairs, "--heldout", pairs, "--steps", "2",
           "--batch-size", "2", "--micro-batch", "1", "--eval-every", "1", "--max-new-tokens", "4",
           "--no-progress", "--out", tmp_path / "sft")
    summary = json.loads((tmp_path / "sft" / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["heldout_accuracy_after"] is not None, summary


def test_grpo_a_few_steps_on_cuda(cuda_run, tmp_path):
    xtrain("grpo", cuda_run, "--device", "cuda", "--reward", "length:1-3", "--steps", "2", "--group", "2",
           "--prompts-per-step", "1", "--max-new-tokens", "4", "--out", tmp_path / "grpo")
    assert (tmp_path / "grpo").is_dir()


def test_the_gpu_check_runs_its_cpu_side_parts():
    """scripts/gpu_check.py, the one command a contributor with a GPU runs: on the stand-in its
    train (each dtype against the CPU run) and launch checks, one line each, exit 0 (12 steps a run
    here: the script's plumbing; on a GPU the runs are 200 steps)."""
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--stand-in", "--only",
                        "train,launch,bench", "--train-steps", "12"], capture_output=True, text=True, timeout=600)
    lines = p.stdout.strip().splitlines()
    assert p.returncode == 0, p.stdout + p.stderr
    assert [ln.split()[:2] for ln in lines] == [["PASS", "train:"], ["PASS", "launch:"], ["SKIP", "bench:"]], lines
    bad = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_check.py"), "--only", "nonsense"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "unknown check" in bad.stderr


def test_the_gpu_extra_installs_cupys_cuda_components():
    """`pip install -e ".[gpu]"` on a machine with only the NVIDIA driver: CuPy's [ctk] extra
    brings NVRTC and cuBLAS from PyPI."""
    import re  # noqa: PLC0415

    gpu = re.search(r"^gpu = \[(.*)\]$", (REPO / "pyproject.toml").read_text(), re.M)
    assert gpu and '"cupy-cuda12x[ctk]>=14' in gpu.group(1), gpu


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_bench_train_on_cuda(dtype):
    """`xtrain bench train --device cuda` runs the GPU engine's step (the numbers mean nothing on
    the stand-in; torch without CUDA is skipped with a message) and ends with its summary line."""
    p = xtrain("bench", "train", "--device", "cuda", "--dtype", dtype, "--preset", "test", "--vocab-size", "300",
               "--batch-size", "4", "--seq-len", "16", "--steps", "2", "--rounds", "1", "--peak-n", "512",
               "--against", "eager,amp")
    lines = p.stdout.strip().splitlines()
    assert "torch with CUDA is not available here" in p.stdout
    assert lines[-1].startswith("throughput vs torch: n/a") and f"({dtype})" in lines[-1]
