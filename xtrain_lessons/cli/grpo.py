"""Post-train a run with GRPO towards a reward (T20): sample groups, score, reinforce.

    xtrain grpo runs/mine --reward word:dog                    # mention "dog"
    xtrain grpo runs/mine --reward eos:40 --steps 60           # finish the story within 40 tokens
    xtrain grpo runs/mine --reward length:20-40 --kl-coef 0.05
    xtrain grpo runs/mine --reward my_rewards.py:score --prompts prompts.txt --out runs/mine-rl

Rewards (SPEC): word:WORD, eos:N, length:LO-HI, path/to/file.py:function (called as
function(prompt, completion) -> float; the completion ends with "<|endoftext|>" when the
model stopped there), or several joined by '+'. Prompts: one per line of --prompts FILE
(default: a few story openings). Each step samples --group completions for each of
--prompts-per-step prompts, and takes --inner-steps AdamW steps on the clipped GRPO loss.

OUT (default RUN_DIR-grpo) is a run directory like the one `xtrain train` writes, so
`xtrain sample OUT` and `xtrain export OUT` take it: config.json, tokenizer.json, data/ (the
base run's, for evaluation), checkpoints/, metrics.jsonl (per step: reward_mean, kl,
clip_frac, entropy, ...), reward.png, samples.txt (before and after), summary.json (the
mean reward on fixed evaluation prompts and the validation loss, before and after).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xtrain_lessons.runtime.cpu_threads import get_threads, set_blas_threads
from xtrain_lessons.training.checkpoint import CheckpointError
from xtrain_lessons.training.posttrain.grpo import GRPOConfig
from xtrain_lessons.training.posttrain.post_train import post_train
from xtrain_lessons.training.posttrain.rewards import RewardError, load_reward
from xtrain_lessons.training.rundir import load_run

DEFAULT_PROMPTS = ["Once upon a time", "One day, a little", "The cat", "Tom and his mom",
                   "There was a girl named Lily", "In the park,", "The sun was", "A big dog"]

# flag -> (GRPOConfig field, type, help)
_FLAGS = [
    ("--steps", "steps", int, "GRPO steps"),
    ("--group", "group", int, "completions per prompt (G)"),
    ("--prompts-per-step", "prompts_per_step", int, "prompts per step"),
    ("--max-new-tokens", "max_new_tokens", int, "completion length limit"),
    ("--temperature", "temperature", float, "sampling temperature of the rollouts"),
    ("--top-p", "top_p", float, "nucleus sampling of the rollouts (default off)"),
    ("--clip-eps", "clip_eps", float, "PPO clip range of the ratio"),
    ("--kl-coef", "kl_coef", float, "weight of the k3 KL penalty to the start model (0: off, "
     "the KL is still measured)"),
    ("--inner-steps", "inner_steps", int, "optimizer steps per batch of rollouts"),
    ("--lr", "lr", float, "AdamW learning rate"),
    ("--grad-clip", "grad_clip", float, "global gradient-norm clip (0: off)"),
    ("--seed", "seed", int, "seed of the sampling and the prompt order"),
]


def configure_parser(parser: argparse.ArgumentParser) -> None:

    d = GRPOConfig()
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `xtrain train`")
    parser.add_argument("--reward", required=True, metavar="SPEC",
                        help="word:WORD, eos:N, length:LO-HI, path/file.py:function, or a sum A+B")
    parser.add_argument("--prompts", metavar="FILE", help="prompts, one per line (default: story openings)")
    parser.add_argument("--out", metavar="DIR", help="run directory to write (default RUN_DIR-grpo)")
    for flag, field, typ, hlp in _FLAGS:
        parser.add_argument(flag, dest=field, type=typ, default=getattr(d, field),
                            help=f"{hlp} (default {getattr(d, field)})")
    parser.add_argument("--eval-samples", type=int, default=4,
                        help="completions per prompt for the before/after mean reward (default 4)")
    parser.add_argument("--eval-batches", type=int, default=8,
                        help="validation batches (16 x 128 tokens) before and after (0: skip)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the engine (default 1)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="tqdm progress bar")


def _fail(msg: str) -> int:
    print(f"xtrain grpo: error: {msg}", file=sys.stderr)
    return 2


def _read_prompts(path) -> list[str]:
    if path is None:
        return list(DEFAULT_PROMPTS)
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"prompts file not found: {path}")
    prompts = [line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"{path} holds no prompt (one per line)")
    return prompts


def run(args: argparse.Namespace) -> int:
    try:
        cfg = GRPOConfig(**{f: getattr(args, f) for _, f, _, _ in _FLAGS}).validate()
        reward = load_reward(args.reward)
        prompts = _read_prompts(args.prompts)
        model, tok, ck = load_run(args.run_dir)
    except (RewardError, ValueError, FileNotFoundError, CheckpointError) as e:
        return _fail(str(e))
    out = Path(args.out or str(Path(args.run_dir)).rstrip("/") + "-grpo")
    if (out / "checkpoints").exists():
        return _fail(f"{out} already holds checkpoints: choose another --out")

    threads_before = get_threads()
    set_blas_threads(args.threads)
    try:
        return post_train(args, cfg, reward, prompts, model, tok, ck, out)
    except RewardError as e:
        return _fail(str(e))
    finally:
        set_blas_threads(threads_before)
