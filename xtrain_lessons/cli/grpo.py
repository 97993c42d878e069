"""Post-train a run with GRPO towards a reward (T21): sample groups, score, reinforce.

    xtrain grpo runs/mine --reward word:dog                    # mention "dog"
    xtrain grpo runs/mine --reward eos:40 --steps 60           # finish the story within 40 tokens
    xtrain grpo runs/mine --reward length:20-40 --kl-coef 0.05
    xtrain grpo runs/arith-sft --reward arith --group 4 --prompts-per-step 64 --lr 1e-3 --warmup 3
                                                               # the arithmetic task, after `xtrain sft`
    xtrain grpo runs/mine --reward my_rewards.py:score --prompts prompts.txt --out runs/mine-rl

Rewards (SPEC): word:WORD, eos:N, length:LO-HI, arith (1 when the parsed answer is right and
every equation written before it holds), format (1 when the completion ends with one
<answer>N</answer>), path/to/file.py:function (called as function(prompt, completion) -> float;
the completion ends with "<|endoftext|>" when the model stopped there), or several joined by '+'.

Prompts: one per line of --prompts FILE, or a .jsonl file with {"prompt": ..., "answer": N}
per line (the answers the arith reward grades against). Default: a few story openings, or
with the arith reward the arithmetic task's train split, measured on its held-out split
(--heldout FILE.jsonl gives other held-out prompts with answers). Each step samples --group
completions for each of --prompts-per-step prompts and takes --inner-steps AdamW steps on the
loss: --loss grpo_clip (the clipped ratio), reinforce or no_baseline; advantages divided by
the group's std (sample std, --ddof 1) unless --no-std; per-token losses aggregated by
--aggregation sequence_mean (GRPO), constant (Dr. GRPO) or token_mean.

The mean reward of --eval-samples completions per evaluation prompt (and, where the prompts
have answers, the greedy accuracy) is printed before, every --eval-every steps, and after.
OUT (default RUN_DIR-grpo) is a run directory like the one `xtrain train` writes, so
`xtrain sample OUT` and `xtrain export OUT` take it: config.json, tokenizer.json, data/ (the
base run's, for evaluation), checkpoints/, metrics.jsonl (per step: reward_mean, kl,
clip_frac, entropy, ...), reward.png, samples.txt (before and after), summary.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from xtrain_lessons.runtime.cpu_threads import get_threads, set_blas_threads
from xtrain_lessons.training.checkpoint import CheckpointError
from xtrain_lessons.training.posttrain.aggregate import AGGREGATIONS
from xtrain_lessons.training.posttrain.arith import make_task
from xtrain_lessons.training.posttrain.grpo import GRPOConfig
from xtrain_lessons.training.posttrain.pairs import PairsError, read_pairs
from xtrain_lessons.training.posttrain.pg_loss import PG_METHODS
from xtrain_lessons.training.posttrain.post_train import post_train
from xtrain_lessons.training.posttrain.rewards import RewardError, load_reward
from xtrain_lessons.training.posttrain.run_files import check_out
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
    ("--warmup", "warmup", int, "steps of linear learning-rate warmup"),
    ("--ddof", "ddof", int, "the std of the advantages: 1 sample std (torch.std), 0 population"),
    ("--grad-clip", "grad_clip", float, "global gradient-norm clip (0: off)"),
    ("--seed", "seed", int, "seed of the sampling and the prompt order"),
]


def configure_parser(parser: argparse.ArgumentParser) -> None:

    d = GRPOConfig()
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory written by `xtrain train`")
    parser.add_argument("--reward", required=True, metavar="SPEC",
                        help="word:WORD, eos:N, length:LO-HI, arith, format, path/file.py:function, or a sum A+B")
    parser.add_argument("--prompts", metavar="FILE", help="prompts, one per line, or .jsonl with prompt and "
                        "answer (default: story openings; with arith, the task's train split)")
    parser.add_argument("--heldout", metavar="FILE.jsonl", help="held-out prompts with answers to measure on "
                        "(default: with arith, the task's held-out split; else the training prompts)")
    parser.add_argument("--loss", choices=PG_METHODS, default=d.loss,
                        help=f"the policy-gradient loss (default {d.loss})")
    parser.add_argument("--aggregation", choices=AGGREGATIONS, default=d.aggregation,
                        help=f"how per-token losses become one (default {d.aggregation})")
    parser.add_argument("--no-std", dest="normalize_by_std", action="store_false",
                        help="advantages r - mean, not divided by the group's std (Dr. GRPO)")
    parser.add_argument("--out", metavar="DIR", help="run directory to write (default RUN_DIR-grpo)")
    for flag, field, typ, hlp in _FLAGS:
        parser.add_argument(flag, dest=field, type=typ, default=getattr(d, field),
                            help=f"{hlp} (default {getattr(d, field)})")
    parser.add_argument("--eval-samples", type=int, default=4,
                        help="completions per evaluation prompt for the mean reward (default 4)")
    parser.add_argument("--eval-every", type=int, default=10,
                        help="measure every N steps (0: before and after only; default 10)")
    parser.add_argument("--eval-batches", type=int, default=8,
                        help="validation batches (16 x 128 tokens) before and after (0: skip)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads of the engine (default 1)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                        help="tqdm progress bar")


def _fail(msg: str) -> int:
    print(f"xtrain grpo: error: {msg}", file=sys.stderr)
    return 2


def _read_prompts(path) -> tuple[list[str], dict]:
    """(prompts, {prompt: answer}) of a --prompts file: text lines, or JSONL rows."""
    p = Path(path)
    if p.suffix == ".jsonl":
        rows = read_pairs(p, need_response=False)
        return [r["prompt"] for r in rows], {r["prompt"]: r["answer"] for r in rows if "answer" in r}
    if not p.is_file():
        raise FileNotFoundError(f"prompts file not found: {path}")
    prompts = [line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not prompts:
        raise ValueError(f"{path} holds no prompt (one per line)")
    return prompts, {}


def _prompts(args) -> tuple[list[str], list, dict]:
    """(training prompts, held-out [(prompt, answer)], {prompt: answer} for the arith reward)."""
    uses_task = any(part.strip() == "arith" for part in args.reward.split("+"))
    train, heldout = make_task() if uses_task else ([], [])
    if args.prompts:
        prompts, answers = _read_prompts(args.prompts)
    elif uses_task:
        prompts, answers = [p.prompt for p in train], {p.prompt: p.answer for p in train + heldout}
    else:
        prompts, answers = list(DEFAULT_PROMPTS), {}
    evals = [(p.prompt, p.answer) for p in heldout] if uses_task and not args.prompts else []
    if args.heldout:
        rows = read_pairs(args.heldout, need_response=False)
        missing = [i + 1 for i, r in enumerate(rows) if "answer" not in r]
        if missing:
            raise PairsError(f"{args.heldout}: pair {missing[0]} has no \"answer\" (held-out prompts are graded)")
        evals = [(r["prompt"], r["answer"]) for r in rows]
    return prompts, evals, {**answers, **dict(evals)}


def run(args: argparse.Namespace) -> int:
    try:
        cfg = GRPOConfig(**{f: getattr(args, f) for _, f, _, _ in _FLAGS}, loss=args.loss,
                         aggregation=args.aggregation, normalize_by_std=args.normalize_by_std).validate()
        if args.eval_every < 0 or args.eval_samples < 1:
            raise ValueError("--eval-every must be >= 0 and --eval-samples >= 1")
        prompts, heldout, answers = _prompts(args)
        reward = load_reward(args.reward, answers)
        model, tok, ck = load_run(args.run_dir)
        out = Path(args.out or str(Path(args.run_dir)).rstrip("/") + "-grpo")
        check_out(out)
    except (RewardError, PairsError, ValueError, FileNotFoundError, CheckpointError) as e:
        return _fail(str(e))

    threads_before = get_threads()
    set_blas_threads(args.threads)
    try:
        return post_train(args, cfg, reward, prompts, heldout, model, tok, ck, out)
    except RewardError as e:
        return _fail(str(e))
    finally:
        set_blas_threads(threads_before)
