"""Benchmark of GRPO's scoring forwards (T21): one right-padded batch against a loop.

    xtrain bench grpo [--preset tiny] [--vocab-size 2048] [--batch-size 16] [--seq-len 48]
                      [--rounds 3] [--threads N]

GRPO runs two kinds of forwards over its rollouts besides sampling them: the *capture*
(no graph: the sampling policy's token log-probs, and the reference model's) and the
*training* forward + backward of the clipped loss, `inner_steps` times per batch. Both can
run one sequence at a time (the rollouts have different lengths) or as ONE right-padded
batch. This times both ways on `--batch-size` ragged rollouts (prompts of 2-8 tokens,
completions of 4 to `--seq-len` tokens, seeded), best of `--rounds` interleaved rounds, and
checks on the way that the two give the same loss. Last line:

    grpo scoring, batched vs looped: capture C.Cx, training step T.Tx (N rollouts)

Random weights: the speed of a forward does not depend on them.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from xtrain_lessons.autograd.tensor import no_grad
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.runtime.cpu_threads import get_threads, set_blas_threads
from xtrain_lessons.training.posttrain.grpo import (
    Rollout,
    clipped_pg_loss,
    clipped_pg_loss_looped,
    rollout_batch,
)
from xtrain_lessons.training.posttrain.logprobs import sequence_logprobs


def _rollouts(n: int, max_completion: int, vocab: int, seed: int = 0) -> list:

    rng = np.random.default_rng(seed)
    return [Rollout(0, list(rng.integers(0, vocab, rng.integers(2, 9))),
                    list(rng.integers(0, vocab, rng.integers(4, max_completion + 1))), False)
            for _ in range(n)]


def bench_grpo(config, n: int = 16, max_completion: int = 48, rounds: int = 3, seed: int = 0) -> dict:
    """Best-of-`rounds` seconds of the capture and of one training step, batched and looped."""
    model = Model(config, seed=seed)
    rs = _rollouts(n, max_completion, config.vocab_size, seed)
    ids, targets, mask = rollout_batch(rs)
    lens = [len(r.prompt_ids) + len(r.ids) - 1 for r in rs]
    adv = np.random.default_rng(seed).normal(size=n)

    def capture_batched():
        with no_grad():
            return sequence_logprobs(model, ids, targets).numpy()

    def capture_looped():
        with no_grad():
            return [sequence_logprobs(model, *rollout_batch([r])[:2]).numpy() for r in rs]

    old = capture_batched()
    olds = [old[b:b + 1, :lens[b]] for b in range(n)]

    def train_batched():
        model.zero_grad()
        loss, _ = clipped_pg_loss(sequence_logprobs(model, ids, targets), old, adv, mask)
        loss.backward()
        return float(loss.item())

    def train_looped():
        model.zero_grad()
        loss = clipped_pg_loss_looped(model, rs, olds, adv)
        loss.backward()
        return float(loss.item())

    best = {k: float("inf") for k in ("capture_batched", "capture_looped", "train_batched", "train_looped")}
    fns = {"capture_batched": capture_batched, "capture_looped": capture_looped,
           "train_batched": train_batched, "train_looped": train_looped}
    losses = {}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            losses[name] = fn()
            best[name] = min(best[name], time.perf_counter() - t0)
    best["loss_delta"] = abs(losses["train_batched"] - losses["train_looped"])
    best["padding"] = 1 - sum(lens) / ids.size
    best["tokens"] = int(sum(lens))
    return best


def run(args: argparse.Namespace) -> int:
    """`xtrain bench grpo`: uses bench.py's --preset, --vocab-size, --batch-size (rollouts),
    --seq-len (longest completion), --rounds and --threads."""

    if args.preset not in PRESETS:
        print(f"xtrain bench: unknown preset {args.preset!r}; choose one of {sorted(PRESETS)}")
        return 2
    n, max_c = args.batch_size, args.seq_len
    base = PRESETS[args.preset]
    config = base.replace(vocab_size=args.vocab_size, max_seq_len=max(base.max_seq_len, max_c + 8))
    if n < 1 or max_c < 4 or args.rounds < 1:
        print("xtrain bench grpo: --batch-size >= 1, --seq-len >= 4 and --rounds >= 1 please")
        return 2
    before = get_threads()
    threads = args.threads or 1
    set_blas_threads(threads)
    try:
        r = bench_grpo(config, n, max_c, args.rounds)
    finally:
        set_blas_threads(before)
    print(f"bench grpo: preset {args.preset} ({config.n_params() / 1e6:.2f}M params, vocab "
          f"{config.vocab_size}), {n} rollouts, {r['tokens']} scored tokens, {r['padding']:.0%} "
          f"padding in the batch, {threads} thread(s), best of {args.rounds}")
    for what, label in (("capture", "capture (no-grad log-probs)"), ("train", "training forward+backward")):
        b, lp = r[f"{what}_batched"], r[f"{what}_looped"]
        print(f"{label}: looped {lp * 1e3:7.1f} ms, batched {b * 1e3:7.1f} ms, {lp / b:.1f}x")
    print(f"loss batched vs looped: |Δ| {r['loss_delta']:.1e}")
    print(f"grpo scoring, batched vs looped: capture {r['capture_looped'] / r['capture_batched']:.1f}x, "
          f"training step {r['train_looped'] / r['train_batched']:.1f}x ({n} rollouts)")
    return 0
