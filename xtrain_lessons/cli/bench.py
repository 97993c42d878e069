"""Benchmarks: training throughput of the engine against PyTorch eager, and MFU.

    xtrain bench train [--preset tiny] [--batch-size 16] [--seq-len 128] [--steps 3] [--rounds 3]

Times full training steps (forward, backward, gradient clipping, AdamW) of the engine's
model and of an equivalent PyTorch eager model (same config, same weights, same batch and
sequence length, same thread count, attention composed from matmul + mask + softmax as in
the engine) in one run: `--rounds` rounds of a block of engine steps then a block of torch
steps (`--steps` timed steps each, after one untimed step), so that both see the same
machine load without one's idle worker threads slowing the other's step. Reports the median tokens/s of both, the achieved FLOP/s of the engine
against the machine's measured float32 matmul peak (the best of a large ``np.matmul``
before and after), i.e. the model FLOPs utilisation (MFU). Last line:

    throughput vs torch: R.RRx (engine E tok/s, torch T tok/s, MFU M%)

FLOPs per trained token = 6 × (matmul parameters: every weight matrix except the
embedding, whose forward is a gather) + 12 × n_layers × T × n_heads × head_dim (scores
and weighted sum, forward 2×, backward 4×, over the full T×T square the composed
attention computes).

Threads: ``--threads N`` sets the engine's threads (``cpu_threads.set_blas_threads``: its
matmuls and row blocks are split over them, OpenBLAS single-threaded inside), NumPy's
OpenBLAS for the sgemm peak, and torch's; default: the CPU count.
"""

from __future__ import annotations

import argparse

from xtrain_lessons.measure import grpo_bench
from xtrain_lessons.measure.bench import run_train_bench


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", choices=["train", "grpo"],
                        help="what to benchmark: train (engine vs torch) or grpo (batched vs looped "
                             "rollout scoring; --batch-size = rollouts, --seq-len = longest completion)")
    parser.add_argument("--preset", default="tiny", help="model preset (default: tiny, the model `xtrain train` trains)")
    parser.add_argument("--vocab-size", type=int, default=2048,
                        help="vocabulary (the default run's tokenizer size)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step (default: 16, as xtrain train)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default: 128, as xtrain train)")
    parser.add_argument("--steps", type=int, default=3,
                        help="timed steps per engine and round (each block starts with 1 untimed step)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of (engine block, torch block); the median is over all timed steps")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for both engines: NumPy's BLAS and the engine's row blocks, and "
                             "torch (default: the CPU count)")
    parser.add_argument("--no-torch", action="store_true", help="engine only")
    parser.add_argument("--peak-n", type=int, default=1536,
                        help="matrix size of the sgemm peak measurement")


def run(args: argparse.Namespace) -> int:
    return grpo_bench.run(args) if args.target == "grpo" else run_train_bench(args)
