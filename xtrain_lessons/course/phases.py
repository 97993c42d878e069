"""The phase table of the course: one row per phase (T00 … T21, with T05b, T07b and T12b inserted) with
what it builds, the package modules and tests it owns, whether a learner may skip it, and what the
reference engine measured.

Everything that lists the phases is generated from this table:

- `tests/phase_map.py` (CONTRIBUTING.md's map: modules and tests per phase; `pytest -m t05`);
- T00's roadmap (`roadmap_markdown`), with each notebook's measured run time;
- the book's first chapter, `book/course_map.md` (`course_map_markdown`; `write_course_map`,
  called by `xtrain notebooks build` and after `xtrain notebooks run`; tests/test_book.py
  checks it is fresh);
- the "what runs where" table (`RUNS_WHERE`, `runs_where_markdown`): what the CPU and the GPU
  path compute for real and what they emulate, the GPU column headed by the engine's last run on a
  real GPU against torch (`gpu_runs.py`, the one place those figures are written).

Run times are measured, never typed: `xtrain notebooks run` records how long each solution
notebook took (and on how many cores) in `run_times.json` beside this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from xtrain_lessons.course import gpu_runs

RUN_TIMES = Path(__file__).with_name("run_times.json")
REPO = Path(__file__).resolve().parents[2]
COURSE_MAP = REPO / "book" / "course_map.md"
REFERENCE_CORES = 2  # the machine the course is sized for: each notebook in about a minute


@dataclass(frozen=True)
class Phase:
    id: str  # "T05"
    topic: str  # the notebook is f"{id}_{topic}.ipynb"
    title: str
    builds: str  # what the learner builds, one line
    modules: list[str] = field(default_factory=list)  # under xtrain_lessons/
    tests: list[str] = field(default_factory=list)  # under tests/
    core: bool = False  # on the main path to a trained model; the others may be skipped
    needs: tuple[str, ...] = ()  # optional phases it builds on (beyond the core path)
    reference: str = ""  # what the reference engine measured

    @property
    def notebook(self) -> str:
        return f"{self.id}_{self.topic}"


TABLE: list[Phase] = [
    Phase("T00", "welcome", "Welcome: how the course works",
          "how exercises and checks work, CPU or GPU, `xtrain doctor`, this machine's matmul speed",
          ["course/checks.py", "course/failures.py", "course/array_watch.py", "course/deps.py",
           "course/notebooks.py", "course/doctor.py", "course/phases.py",
           "cli/main.py", "cli/errors.py", "cli/notebooks.py", "cli/doctor.py"],
          ["test_course.py", "test_mutants.py", "test_notebook_pipeline.py", "test_notebook_outputs.py",
           "test_doctor.py", "test_cli.py", "test_packaging.py", "test_book.py", "test_book_references.py", "test_layers.py",
           "test_phase_map.py"], core=True),
    Phase("T01", "devices_and_kernels", "Devices and the build chain",
          "host and device memory, NumPy vs CuPy, a vector-add CUDA C kernel on a GPU and on the CPU "
          "emulator, compile checks, timing with syncs",
          ["runtime/device.py", "runtime/cuda/", "runtime/kernels/vector_add.py", "cupy_standin/",
           "course/kernel_trace.py"],
          ["test_device.py", "test_cuda_emulator.py", "test_nvcc_compile.py", "test_nvrtc_compile.py",
           "test_emulator_features.py", "test_emulator_sanitizer.py", "test_fake_cupy.py", "test_standin_references.py",
           "test_gpu_path.py", "test_book_kernel_trace.py"],
          core=True, reference="vector add verified against the host"),
    Phase("T02", "tensors", "Tensors",
          "dtype, shape, strides, storage; views vs copies; broadcasting; elementwise, transpose and "
          "embedding-gather kernels",
          ["runtime/kernels/elementwise.py", "runtime/kernels/transpose.py", "runtime/kernels/embedding.py"],
          ["test_kernels_t02.py"], core=True),
    Phase("T03", "gemm", "GEMM by hand",
          "naive and shared-memory tiled matmul kernels; dA = dC·Bᵀ, dB = Aᵀ·dC; finite differences; "
          "BLAS comparison",
          ["runtime/kernels/gemm.py"], ["test_kernels_gemm.py"],
          reference="hand GEMM grads match cuBLAS to 1e-7"),
    Phase("T04", "autograd", "Tape autograd",
          "a Tensor that records a tape, topological backward, fan-out accumulation, op backwards, "
          "gradcheck, agreement with torch.autograd",
          ["autograd/tensor.py", "autograd/ops.py", "autograd/shape.py", "autograd/fused.py", "autograd/gradcheck.py"],
          ["test_autograd.py", "test_gradcheck.py", "test_ops_torch_parity.py"], core=True),
    Phase("T05", "transformer", "A tiny Qwen3-style transformer",
          "RMSNorm, RoPE, causal attention step by step, SwiGLU, the block, cross-entropy; PyTorch "
          "parity of logits and every gradient; overfit one batch",
          ["model/layers.py", "model/qwen3.py"], ["test_model_parity.py"], core=True),
    Phase("T05b", "bpe_tokenizer", "A byte-level BPE tokenizer",
          "GPT-2 pre-tokenization, merges with incremental pair counts, encode/decode, streaming, "
          "a Hugging Face tokenizer.json",
          ["training/tokenizer/bpe_pretokenize.py", "training/tokenizer/bpe_train.py", "training/tokenizer/bpe_tokenizer.py",
           "training/tokenizer/bpe_hf.py", "measure/bench_tokenizer.py"], ["test_bpe.py"],
          reference="the CS336 walk-through's first part"),
    Phase("T06", "training", "The training stack",
          "AdamW, warmup + cosine, clipping, data windows, checkpoints with exact resume, decoding, "
          "resource accounting, a real run",
          ["training/config.py", "training/loop/", "training/optim/", "training/data/", "training/tokenizer/__init__.py",
           "training/checkpoint/", "training/rundir.py", "training/metrics.py", "training/validation.py",
           "model/generate.py", "cli/train.py", "cli/sample.py", "cli/data.py"],
          ["test_train.py", "test_cli_train.py", "test_optim.py", "test_schedule.py", "test_data.py",
           "test_data_fetch.py", "test_tokenizer.py", "test_checkpoint.py", "test_generate.py",
           "test_corpus.py", "test_faults.py"], core=True,
          reference="5M params, 1200 steps on TinyStories: loss 10.84 → 3.59, coherent sentences"),
    Phase("T07", "performance", "Performance on the CPU",
          "profiling with exclusive times, BLAS matmuls, fused row kernels and row blocks, tokens/s and MFU, "
          "the CPU's threads",
          ["runtime/cpu_threads.py", "runtime/blas.py", "runtime/host/fused_rows.py", "runtime/opset/",
           "measure/bench.py", "measure/torch_twin.py", "measure/profiler.py", "cli/bench.py", "model/inputs.py"],
          ["test_cpu_threads.py", "test_blas.py", "test_fused_rows.py", "test_opset.py", "test_profiler.py",
           "test_torch_baselines.py"],
          reference="~3×, 2.7K → 8.5K tok/s"),
    Phase("T07b", "gpu_performance", "Performance on the GPU",
          "launch-bound or compute-bound, a fused AdamW kernel, no host sync inside a step, a step's device "
          "calls and bytes counted, the step estimated and measured as a CUDA graph",
          ["runtime/kernels/adamw.py", "course/gpu_runs.py", "runtime/kernels/_common.py",
           "runtime/kernels/rmsnorm.py", "runtime/kernels/swiglu.py", "runtime/kernels/rope.py",
           "runtime/kernels/softmax.py", "runtime/kernels/cross_entropy.py", "runtime/kernels/residual.py",
           "runtime/kernels/grad_norm.py", "measure/bench_gpu.py", "measure/device_calls.py",
           "measure/launch_timeline.py", "training/loop/cuda_graph.py", "runtime/cublas_direct.py",
           "measure/gpu_specs.py", "cli/device_check.py"],
          ["test_launch_timeline.py", "test_kernels_adamw.py", "test_kernels_step.py", "test_gpu_engine.py",
           "test_cuda_graph.py", "test_cublas_direct.py", "test_device_refusal.py", "test_gpu_lease.py"],
          needs=("T07",)),
    Phase("T08", "data_parallel", "Data parallelism",
          "a ring all-reduce by hand, DDP, weak vs strong scaling",
          ["parallel/collectives.py", "parallel/ring.py", "parallel/ddp.py", "measure/ddp_experiments.py"],
          ["test_distributed.py"]),
    Phase("T09", "export", "Interop: export to Hugging Face",
          "QK-norm, the Hugging Face layout, token-identical generation in transformers, bf16 drift",
          ["interop/hf.py", "cli/export.py", "cli/import_hf.py"], ["test_export_hf.py"],
          reference="47 tensors for 4 layers; top-11 order identical; bf16 logits within ~1e-2"),
    Phase("T10", "batching", "Batched forward",
          "from a per-sequence loop to a [B, T] batch; right padding under a causal mask",
          ["model/batching.py"], ["test_batching.py"],
          reference="1524× on one GPU; ragged batched == looped, max |Δlogit| 3.7e-7"),
    Phase("T11", "memory", "Memory allocator",
          "a caching allocator with size classes and free lists; CuPy's pool; buffer reuse",
          ["runtime/allocator.py", "measure/memory_report.py"], ["test_memory.py"], reference="2.3×"),
    Phase("T12", "bf16", "bf16 mixed precision",
          "fp32 master weights, bf16 compute, round-to-nearest-even, the spacing of bf16 values, what stays fp32",
          ["model/precision.py", "runtime/kernels/bf16.py", "runtime/gpu_blas.py"],
          ["test_amp.py", "test_kernels_bf16.py"], reference="29% less memory"),
    Phase("T12b", "fp16", "fp16 and dynamic loss scaling",
          "fp16's range against bf16's, the scale's update rule as a one-thread kernel, unscaling with the "
          "overflow check, which gradients fp16 loses, fp16 training with and without a scale",
          ["training/optim/grad_scaler.py", "runtime/kernels/grad_scaler.py"], ["test_grad_scaler.py"],
          needs=("T12",)),
    Phase("T13", "recompute", "Activation recompute",
          "keep a block's input, recompute its inside in backward; bit-identical gradients",
          ["model/recompute.py"], ["test_recompute.py"]),
    Phase("T14", "flash_attention", "Flash-attention",
          "online softmax, a tiled forward keeping output and logsumexp, a recomputing backward, a CUDA kernel",
          ["model/flash_attention.py", "runtime/kernels/flash_attention.py", "runtime/kernels/flash_attention_tc.py"],
          ["test_flash_attention.py", "test_flash_attention_tc.py"],
          reference="peak memory 16% at seq 1024, 23% at 2048"),
    Phase("T15", "gqa", "Grouped-query attention",
          "repeat_kv with a summing backward; group size 1 equals multi-head attention",
          ["model/gqa.py"], ["test_gqa.py"]),
    Phase("T16", "grad_accumulation", "Gradient accumulation",
          "N micro-steps scaled by 1/N equal one N× batch; all-reduce only at the boundary",
          ["parallel/ddp.py"], ["test_accumulation.py"], needs=("T08",),
          reference="27.7 GB → 7.2 GB at the same effective batch"),
    Phase("T17", "launcher", "One process per device",
          "a torchrun-style launcher and rendezvous",
          ["parallel/launch.py", "cli/launch.py"], ["test_launcher.py", "test_faults_signals.py"],
          needs=("T08",), reference="process == thread to 1.5e-7 in loss"),
    Phase("T18", "dropout", "Dropout",
          "a counter-based RNG for the mask, inverted scaling, recompute-safe",
          ["model/dropout.py", "runtime/rng.py", "runtime/kernels/philox.py"],
          ["test_dropout.py", "test_rng.py"], needs=("T13",), reference="p = 0 bit-identical"),
    Phase("T19", "capstone", "Capstone: a scaling study",
          "model sizes × token budgets, bits per byte on one fixed eval set, a fitted scaling law",
          ["measure/evaluate.py", "measure/study.py", "measure/scaling_law.py", "measure/study_plots.py",
           "cli/eval.py", "cli/study.py"], ["test_eval.py", "test_study.py", "test_mutants_T19.py"],
          reference="the v0–v10 study: data saturates; more data, then capacity, help most together"),
    Phase("T20", "sft", "Supervised fine-tuning",
          "prompt + response batches with a response mask, the masked NLL over a constant, gradient "
          "accumulation, an arithmetic task with an answer parser; held-out accuracy that rises",
          ["training/posttrain/batch.py", "training/posttrain/logprobs.py", "training/posttrain/aggregate.py",
           "training/posttrain/sft.py", "training/posttrain/sft_run.py", "training/posttrain/arith.py",
           "training/posttrain/arith_base.py", "training/posttrain/answers.py", "training/posttrain/accuracy.py",
           "training/posttrain/pairs.py", "training/posttrain/run_files.py", "cli/sft.py"],
          ["test_sft.py", "test_posttrain_losses.py"], needs=("T10",),
          reference="pretrain → SFT → RL, as the standard pipeline runs it"),
    Phase("T21", "grpo", "Post-training with GRPO",
          "REINFORCE, group-normalised advantages, the policy-gradient family, the clipped surrogate with "
          "a KL term, the aggregation choices, a held-out accuracy that GRPO raises",
          ["training/posttrain/grpo.py", "training/posttrain/rollouts.py", "training/posttrain/rewards.py",
           "training/posttrain/post_train.py", "training/posttrain/advantages.py", "training/posttrain/pg_loss.py",
           "cli/grpo.py", "measure/grpo_bench.py"], ["test_grpo.py", "test_mutants_T21.py"], needs=("T20",),
          reference="batched clipped-PG loss == looped to 1.5e-8"),
]

BY_ID = {p.id: p for p in TABLE}
# The map tests/phase_map.py and the pytest markers use: phase -> (topic, modules, tests).
PHASES = {p.id: (p.topic, p.modules, p.tests) for p in TABLE}


# ---- what runs where ----------------------------------------------------------------------------
# (what, on the CPU (NumPy), on a GPU (CuPy)). The GPU column is what the GPU path computes; its
# heading, the engine against torch on a real GPU, is computed from the recorded run (gpu_runs.py).
GPU_STATUS = gpu_runs.gpu_status()
RUNS_WHERE: list[tuple[str, str, str]] = [
    ("float32", "real: NumPy float32, matmuls through MKL or OpenBLAS",
     "real: CuPy float32, every product one cuBLAS GEMM (no TF32)"),
    ("bf16", "real bf16 storage (ml_dtypes), float32 arithmetic: the values and rounding of bf16, not its speed",
     "real bf16 arrays (CuPy 14 + ml_dtypes); every product, attention's too, one cuBLAS GEMM on the "
     "tensor cores with float32 accumulation; the course's kernels compute in float32 inside"),
    ("fp16", "real float16 storage, float32 arithmetic, dynamic loss scaling",
     "real float16 storage; cuBLAS matmuls on float16 operands with float32 accumulation, loss scaling"),
    ("CUDA C kernels", "the same .cu source compiled by the C++ compiler and run on the emulator: "
     "correct values, slow (for learning and tests, not speed)",
     "compiled by CuPy (NVRTC) and run on the GPU"),
    ("memory", "host RAM; the notebooks measure NumPy's allocations (tracemalloc)",
     "device memory through CuPy's memory pool"),
    ("speed", "the CPU's float32 matmul peak (T00 measures it); the course's models are sized to train in minutes",
     "one launch per op (a few hundred per step of the tiny model), no host synchronisation in a step, "
     "or the whole step as one CUDA graph (`xtrain bench train --cuda-graph`); T07b counts the launches and "
     "estimates the step on a named GPU"),
]


def runs_where_markdown() -> str:
    rows = ["| | on the CPU (NumPy) | on a GPU (CuPy) — " + GPU_STATUS + " |", "|---|---|---|"]
    rows += [f"| {what} | {cpu} | {gpu} |" for what, cpu, gpu in RUNS_WHERE]
    return "\n".join(rows)


# ---- measured run times -------------------------------------------------------------------------
def run_times() -> dict[str, dict]:
    """{notebook stem: {"seconds": s, "cores": n}} as `xtrain notebooks run` last measured them."""
    try:
        return json.loads(RUN_TIMES.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def record_run_time(stem: str, seconds: float, cores: int | None = None) -> None:
    """Store one solution notebook's run time (read-modify-write under a lock: runs may overlap)."""
    import fcntl  # noqa: PLC0415  (POSIX; the course's notebooks run there)

    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    with open(Path(tempfile.gettempdir()) / "xtrain-run-times.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        times = run_times()
        times[stem] = {"seconds": round(float(seconds), 1), "cores": int(cores)}
        text = json.dumps(dict(sorted(times.items())), indent=1) + "\n"
        fd, tmp = tempfile.mkstemp(dir=RUN_TIMES.parent, prefix=".run_times.", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, RUN_TIMES)


def minutes(phase: Phase, times: dict[str, dict] | None = None) -> str:
    """The measured run time of a phase's solution notebook, in minutes ("—" if never measured;
    marked with the core count when it was measured on another machine)."""
    times = run_times() if times is None else times
    t = times.get(phase.notebook)
    if not t:
        return "—"
    text = f"{max(0.1, round(t['seconds'] / 60, 1)):.1f}"  # to a tenth of a minute
    return text if t.get("cores") == REFERENCE_CORES else f"{text} ({t.get('cores')} cores)"


def _skip(phase: Phase) -> str:
    if phase.core:
        return "core"
    needed_by = [p.id for p in TABLE if phase.id in p.needs]
    text = "may skip"
    if phase.needs:
        text += "; after " + ", ".join(phase.needs)
    if needed_by:
        text += "; " + ", ".join(needed_by) + " build" + ("s" if len(needed_by) == 1 else "") + " on it"
    return text


# ---- the generated pages ------------------------------------------------------------------------
def roadmap_markdown(times: dict[str, dict] | None = None, reference: bool = False) -> str:
    """The roadmap: every phase, what it builds, minutes on 2 cores, whether it may be skipped."""
    times = run_times() if times is None else times
    head = "| phase | what you build | minutes (2 cores) | skip? |"
    rule = "|---|---|---|---|"
    if reference:
        head, rule = head + " the reference engine measured |", rule + "---|"
    rows = [head, rule]
    for p in TABLE:
        row = f"| **{p.id}** {p.title} | {p.builds} | {minutes(p, times)} | {_skip(p)} |"
        rows.append(row + (f" {p.reference} |" if reference else ""))
    return "\n".join(rows)


def total_minutes(times: dict[str, dict] | None = None, core_only: bool = False) -> float:
    times = run_times() if times is None else times
    return sum(times[p.notebook]["seconds"] for p in TABLE
               if p.notebook in times and (p.core or not core_only)) / 60


def course_map_markdown() -> str:
    """book/course_map.md, the book's first chapter (generated: edit this module, not the page)."""
    times = run_times()
    measured = sum(p.notebook in times for p in TABLE)
    core = ", ".join(p.id for p in TABLE if p.core)
    so_far = (f"all {len(TABLE)} measured: {total_minutes(times):.0f} minutes in all" if measured == len(TABLE) else
              f"{measured} of {len(TABLE)} measured so far, `xtrain notebooks run` adds the others")
    return f"""<!-- generated by xtrain_lessons/course/phases.py (`xtrain notebooks build`): do not edit -->
# The course map

The course has {len(TABLE)} phases, one notebook each. The core path — {core} — takes you from
arrays to a trained model; every other phase may be skipped, since each notebook imports what
earlier phases built from the package, never from your answers (the "skip?" column says which
later phases build on one). Minutes are each solved notebook's measured run time on 2 CPU
cores ({so_far}), not counting your reading and exercises. The last column holds results of the reference engine, written
in Rust and CUDA, that the course retraces; each phase measures its own version of them.

{roadmap_markdown(times, reference=True)}

## What runs where

Two execution paths, one engine: array code is written once against the array module `xp`
(NumPy or CuPy), and the CUDA C kernels run on a GPU or, through the course's emulator, on the CPU.

{runs_where_markdown()}
"""


def write_course_map(path: Path = COURSE_MAP) -> bool:
    """Write book/course_map.md when it differs from the table; return whether it was written."""
    text = course_map_markdown()
    with contextlib.suppress(OSError):
        if path.read_text(encoding="utf-8") == text:
            return False
    if not path.parent.is_dir():
        return False
    path.write_text(text, encoding="utf-8")
    return True


def plot_roadmap(times: dict[str, dict] | None = None):
    """The roadmap as a picture: the core path on the top lane, the phases one may skip below it,
    an arrow from each phase a skippable one builds on; each box says its measured minutes."""
    import matplotlib.pyplot as plt  # noqa: PLC0415

    times = run_times() if times is None else times
    fig, ax = plt.subplots(figsize=(11, 3.2))
    pos = {p.id: (i, 1.0 if p.core else 0.0) for i, p in enumerate(TABLE)}
    for p in TABLE:
        x, y = pos[p.id]
        m = minutes(p, times)
        ax.add_patch(plt.Rectangle((x - 0.42, y - 0.3), 0.84, 0.6, lw=1.2, ec="#334",
                                   fc="#9ecae1" if p.core else "#f0f0f0"))
        ax.text(x, y + 0.08, p.id, ha="center", va="center", fontsize=9, weight="bold")
        ax.text(x, y - 0.15, f"{m.split()[0]} min" if m != "—" else "—", ha="center", va="center", fontsize=7)
        for need in p.needs:
            (x0, y0) = pos[need]
            ax.annotate("", xy=(x, y - 0.3), xytext=(x0, y0 - 0.3),  # under the lane
                        arrowprops=dict(arrowstyle="->", color="#777", connectionstyle="arc3,rad=0.35"))
    core = [pos[p.id] for p in TABLE if p.core]
    for (x0, _), (x1, _) in zip(core, core[1:]):
        ax.annotate("", xy=(x1 - 0.42, 1.0), xytext=(x0 + 0.42, 1.0), arrowprops=dict(arrowstyle="->", color="#234"))
    ax.text(-0.6, 1.0, "core", ha="right", va="center", fontsize=9)
    ax.text(-0.6, 0.0, "may skip", ha="right", va="center", fontsize=9)
    ax.set_xlim(-1.6, len(TABLE) - 0.4)
    ax.set_ylim(-1.25, 1.45)
    ax.axis("off")
    ax.set_title("the course: the core path to a trained model, and the phases you may skip "
                 "(minutes: each notebook's measured run time on 2 cores)", fontsize=9)
    fig.tight_layout()
    return fig
