"""Benchmarks: `train` (the engine's training throughput against PyTorch eager, SDPA,
torch.compile and autocast bf16, MFU and step memory: measure/bench.py on the CPU,
measure/bench_gpu.py on a GPU), `grpo` (batched vs looped rollout scoring:
measure/grpo_bench.py), `tokenizer` (the course's BPE against `tokenizers`: measure/bench_tokenizer.py).

    xtrain bench train --against eager,sdpa,compile
    xtrain bench train --device cuda --dtype bf16 --cuda-graph --against sdpa,compile,reduce-overhead,cuda-graph \\
        --preset 20m --vocab-size 8192 --batch-size 32 --seq-len 512
    xtrain bench tokenizer --scale 100

`--device cuda` where no GPU answers, or `--dtype bf16` on a GPU without bf16 tensor cores, is
refused in one line before anything is measured.
"""

from __future__ import annotations

import argparse

from xtrain_lessons.cli.device_check import require_device
from xtrain_lessons.measure import grpo_bench
from xtrain_lessons.measure.bench import run_train_bench
from xtrain_lessons.measure.bench_gpu import DEFAULT_AGAINST, run_train_bench_gpu
from xtrain_lessons.measure.bench_tokenizer import bench_tokenizer, format_results
from xtrain_lessons.training.data import default_corpus_path


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", choices=["train", "grpo", "tokenizer"],
                        help="what to benchmark: train (engine vs torch), grpo (batched vs looped rollout "
                             "scoring; --batch-size = rollouts, --seq-len = longest completion) or tokenizer "
                             "(the course's BPE vs tokenizers: training, encode MB/s, streaming memory)")
    parser.add_argument("--preset", default="tiny", help="model preset (default: tiny, the model `xtrain train` trains)")
    parser.add_argument("--vocab-size", type=int, default=2048,
                        help="vocabulary (the default run's tokenizer size)")
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step (default: 16, as xtrain train)")
    parser.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (default: 128, as xtrain train)")
    parser.add_argument("--steps", type=int, default=3,
                        help="timed steps per engine and round (each block starts with 1 untimed step)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="rounds of (engine block, one block per baseline); the median is over all timed steps")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for both engines: NumPy's BLAS and the engine's row blocks, and "
                             "torch (default: the CPU count)")
    parser.add_argument("--against", default=None,
                        help="comma-separated torch baselines (measure/torch_twin.py): eager (composed "
                             "attention), sdpa (F.scaled_dot_product_attention; on a GPU with fused AdamW, "
                             "pinned non-blocking batches and autocast in --dtype bf16/fp16), compile "
                             "(torch.compile of forward+loss and, apart, of the optimizer step; compilation "
                             "excluded), reduce-overhead (the same with CUDA graphs; GPU), cuda-graph (the "
                             "whole step in torch.cuda.graph, AdamW(fused, capturable); GPU), amp (sdpa under "
                             f"autocast bf16). Default: eager on the CPU, {DEFAULT_AGAINST} on a GPU")
    parser.add_argument("--dtype", choices=["float32", "bf16", "fp16"], default="float32",
                        help="the engine's compute dtype (--device cuda; the CPU bench times float32)")
    parser.add_argument("--no-torch", action="store_true", help="engine only")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="--device cuda: also time the engine's step captured once as a CUDA graph and replayed "
                             "(float32, bf16)")
    parser.add_argument("--attention", choices=["composed", "flash"], default=None,
                        help="--device cuda: the engine's attention (default: the preset's)")
    parser.add_argument("--peak-n", type=int, default=None,
                        help="matrix size of the matmul peak measurement (default 1536 on the CPU, 8192 on a GPU)")
    parser.add_argument("--corpus", default=None,
                        help="tokenizer: the text to train on and encode (default: the shipped stories)")
    parser.add_argument("--scale", type=int, default=100,
                        help="tokenizer: the streaming test's file is the corpus repeated this often")


def run(args: argparse.Namespace) -> int:
    if args.target == "tokenizer":
        corpus = args.corpus or str(default_corpus_path())
        print(format_results(bench_tokenizer(corpus, args.vocab_size, args.rounds, args.scale)))
        return 0
    if args.target == "grpo":
        return grpo_bench.run(args)
    if require_device("bench", args.dtype) == "cuda":  # the GPU engine against torch on the same GPU
        return run_train_bench_gpu(args)
    if args.dtype != "float32":
        print("xtrain bench: --dtype bf16/fp16 is timed on a GPU (--device cuda); the CPU emulates them")
        return 2
    return run_train_bench(args)
