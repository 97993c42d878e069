"""The engine's measurements on a real GPU that the course quotes, written down once.

CI has no GPU, so these are recorded results, not computed ones: T07 prints them and draws its
conclusions from them, the "what runs where" table (`phases.runs_where_markdown`, in T00 and the
book's course map) sums them up in one line, and tests/test_book_references.py checks that the
README quotes the same numbers. A new GPU run updates this file, and every one of them follows.
"""

from __future__ import annotations

CARD = "one H100, CuPy 14.2, torch 2.11, November 2026"

# The cost of one device call, from the tiny default run's float32 training step on CARD: the step's
# time over its device calls (the device's own work is well under a millisecond). `calls` is that
# engine's count; today's step may make a few more or fewer (T07 §7 counts them).
REFERENCE_RUN = {"card": CARD, "step_ms": 13.9, "calls": 326}
# The first GPU run, before T07's GPU engine: the CPU path's row blocks and matmul chunks, one launch each
FIRST_RUN = {"card": "one H200", "step_ms": 75.2, "calls": 3126}

# `xtrain bench train --device cuda --cuda-graph --against eager|amp` on CARD, the engine and torch
# timed in one run, ms per step: (engine eager, engine as a CUDA graph, torch: eager for float32,
# autocast for bf16)
GRAPH_RUN = {
    "tiny 16 x 128 float32": (16.4, 3.4, 14.6), "tiny 16 x 128 bf16": (33.3, 2.5, 24.9),
    "20m 32 x 512 float32": (73.5, 72.6, 93.4), "20m 32 x 512 bf16": (36.6, 22.8, 32.3),
    "gpt2-small 8 x 1024 float32": (169.3, 167.5, 213.5), "gpt2-small 8 x 1024 bf16": (89.7, 45.6, 66.4)}


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
