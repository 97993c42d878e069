"""The engine's measurements on a real GPU that the course quotes, written down once.

CI has no GPU, so these are recorded results, not computed ones: T07b prints them and draws its
conclusions from them, the "what runs where" table (`phases.runs_where_markdown`, in T00 and the
book's course map) sums them up in one line, and tests/test_book_references.py checks that the
README quotes the same numbers. A new GPU run updates this file, and every one of them follows.
"""

from __future__ import annotations

CARD = "one H100, CuPy 14.2, torch 2.11, November 2026"

# The cost of one device call, from the tiny default run's float32 training step on CARD: the step's
# time over its device calls (the device's own work is well under a millisecond). `calls` is that
# engine's count; today's step may make a few more or fewer (T07b §4 counts them).
REFERENCE_RUN = {"card": CARD, "step_ms": 13.9, "calls": 326}
# The first GPU run, before T07b's GPU engine: the CPU path's row blocks and matmul chunks, one launch each
FIRST_RUN = {"card": "one H200", "step_ms": 75.2, "calls": 3126}

# `xtrain bench train --device cuda --cuda-graph --against eager|amp` on CARD, the engine and torch
# timed in one run, ms per step: (engine eager, engine as a CUDA graph, torch: eager for float32,
# autocast for bf16)
GRAPH_RUN = {
    "tiny 16 x 128 float32": (16.4, 3.4, 14.6), "tiny 16 x 128 bf16": (33.3, 2.5, 24.9),
    "20m 32 x 512 float32": (73.5, 72.6, 93.4), "20m 32 x 512 bf16": (36.6, 22.8, 32.3),
    "gpt2-small 8 x 1024 float32": (169.3, 167.5, 213.5), "gpt2-small 8 x 1024 bf16": (89.7, 45.6, 66.4)}

# `bash scripts/gpu_lease.sh` (issue 39's targets) on one H200: bf16, ms per step, the engine's step
# as a CUDA graph against PyTorch's strongest baselines on the same GPU, weights and batches: eager
# with SDPA and fused AdamW, the eager step in one torch.cuda.graph, and
# torch.compile(mode="reduce-overhead"); with the engine's MFU against the dense bf16 spec peak
STRONG_CARD = "one H200, CuPy 14.2, torch 2.11, November 2026"
STRONG_RUN = {
    "20m 32 x 512": {"engine graph": 19.4, "torch sdpa": 26.2, "torch cuda-graph": 23.6,
                     "torch reduce-overhead": 8.5, "engine mfu": 13.5, "torch mfu": 30.9},
    "gpt2-small 8 x 1024": {"engine graph": 40.1, "torch sdpa": 43.9, "torch cuda-graph": 40.1,
                            "torch reduce-overhead": 17.8, "engine mfu": 16.0, "torch mfu": 35.9}}


def strong_sentence() -> str:
    """What the README says of the engine against torch's strongest baselines (STRONG_RUN)."""
    a, b = STRONG_RUN["20m 32 x 512"], STRONG_RUN["gpt2-small 8 x 1024"]

    def x(run, baseline):
        return f"{run[baseline] / run['engine graph']:.2f}x"

    return (f"the bf16 step as a CUDA graph runs at {x(a, 'torch reduce-overhead')} / "
            f"{x(b, 'torch reduce-overhead')} the speed of torch.compile(mode=\"reduce-overhead\") at 20m / "
            f"GPT-2-small (MFU {a['engine mfu']}% / {b['engine mfu']}% of the dense bf16 peak, torch's "
            f"{a['torch mfu']}% / {b['torch mfu']}%), {x(a, 'torch sdpa')} / {x(b, 'torch sdpa')} torch eager "
            f"with SDPA and {x(a, 'torch cuda-graph')} / {x(b, 'torch cuda-graph')} the eager torch step in one "
            f"torch.cuda.graph")


def speedups(dtype: str, which: int) -> dict[str, float]:
    """{shape: torch's ms / the engine's ms} for one dtype; which = 0 (eager) or 1 (CUDA graph)."""
    return {shape.rsplit(" ", 1)[0]: run[2] / run[which] for shape, run in GRAPH_RUN.items()
            if shape.endswith(" " + dtype)}


def _span(values) -> str:
    lo, hi = min(values), max(values)
    return f"{lo:.2f}x" if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"


def gpu_status() -> str:
    """The GPU column's heading: how the engine compared with torch on the GPU it last ran on."""
    eager32 = speedups("float32", 0)
    big = [v for shape, v in eager32.items() if not shape.startswith("tiny")]
    return (f"run on {CARD.split(', ')[0]} ({CARD.rsplit(', ', 1)[1]}), against torch in the same run: float32 "
            f"{_span(big)} torch eager at the 20m and GPT-2-small shapes ({_span([eager32['tiny 16 x 128']])} at "
            f"the launch-bound tiny one); the step as a CUDA graph {_span(speedups('float32', 1).values())} torch "
            f"eager in float32 and {_span(speedups('bf16', 1).values())} torch autocast in bf16 (eager: "
            f"{_span(speedups('bf16', 0).values())})")
