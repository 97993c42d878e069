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
import json
import shutil
import sys
import time
from pathlib import Path

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
    from xtrain_lessons.grpo import GRPOConfig  # noqa: PLC0415

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
    from xtrain_lessons.checkpoint import CheckpointError  # noqa: PLC0415
    from xtrain_lessons.grpo import GRPOConfig  # noqa: PLC0415
    from xtrain_lessons.rewards import RewardError, load_reward  # noqa: PLC0415
    from xtrain_lessons.train import load_run  # noqa: PLC0415

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
    from xtrain_lessons.rowwise import get_threads, set_blas_threads  # noqa: PLC0415

    threads_before = get_threads()
    set_blas_threads(args.threads)
    try:
        return _post_train(args, cfg, reward, prompts, model, tok, ck, out)
    except RewardError as e:
        return _fail(str(e))
    finally:
        set_blas_threads(threads_before)


def _post_train(args, cfg, reward, prompts, model, tok, ck, out: Path) -> int:
    """Evaluate, train, evaluate again, write everything."""
    from xtrain_lessons.tokenizer import atomic_write_bytes, eot_id  # noqa: PLC0415

    eos = eot_id(tok)
    encoded = [(p, tok.encode(p).ids or [eos]) for p in prompts]
    decode = _decoder(tok, eos)
    out.mkdir(parents=True, exist_ok=True)
    _write_run_files(args, cfg, model, tok, out)
    val = _val_dataset(Path(args.run_dir), tok) if args.eval_batches else None
    t0 = time.perf_counter()
    before = _evaluate(model, encoded, reward, cfg, decode, eos, args, val)
    history = _loop(args, cfg, reward, encoded, model, eos, decode, out / "metrics.jsonl")
    after = _evaluate(model, encoded, reward, cfg, decode, eos, args, val)
    _save(model, tok, out, ck.step + len(history), cfg, args)
    _plot(history, out / "reward.png", f"GRPO, reward {args.reward}")
    _write_samples(out / "samples.txt", before, after)
    summary = {"reward": args.reward, "steps": len(history), "seconds": round(time.perf_counter() - t0, 1),
               "reward_before": before["reward"], "reward_after": after["reward"],
               "val_loss_before": before["val_loss"], "val_loss_after": after["val_loss"],
               "kl_last": history[-1]["kl"] if history else None}
    atomic_write_bytes(out / "summary.json", (json.dumps(summary, indent=2) + "\n").encode("utf-8"))
    vl = ("" if before["val_loss"] is None else
          f"; validation loss {before['val_loss']:.4f} -> {after['val_loss']:.4f}")
    print(f"mean reward {before['reward']:.3f} -> {after['reward']:.3f} on {len(encoded)} prompts x "
          f"{args.eval_samples}{vl}; wrote {out}")
    return 0


def _loop(args, cfg, reward, encoded, model, eos, decode, metrics_path: Path) -> list:
    """The GRPO steps, a bar and one metrics line each; Ctrl-C stops after the current step."""
    import numpy as np  # noqa: PLC0415
    from tqdm.auto import tqdm  # noqa: PLC0415

    from xtrain_lessons.grpo import grpo_step  # noqa: PLC0415
    from xtrain_lessons.optim import AdamW  # noqa: PLC0415

    ref = type(model)(model.config, seed=0)  # the frozen start model: KL measured even unpenalised
    ref.load_state_dict(model.state_dict())
    ref.eval()
    opt = AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.99), weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(cfg.seed)
    metrics_path.write_text("", encoding="utf-8")
    history, step = [], 0
    bar = tqdm(range(1, cfg.steps + 1), desc="grpo", disable=not args.progress, dynamic_ncols=True)
    try:
        for step in bar:
            batch = [encoded[i] for i in rng.choice(len(encoded), cfg.prompts_per_step,
                                                   replace=len(encoded) < cfg.prompts_per_step)]
            m = grpo_step(model, ref, opt, batch, reward, cfg, rng, eos, decode)
            row = {"step": step, **{k: v for k, v in m.items() if not k.startswith("_")}}
            history.append(row)
            with open(metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
            bar.set_postfix(reward=f"{m['reward_mean']:.2f}", kl=f"{m['kl']:.3f}",
                            clip=f"{m['clip_frac']:.2f}", H=f"{m['entropy']:.2f}")
    except KeyboardInterrupt:
        print(f"interrupted at step {step}: saving what was learned so far", file=sys.stderr)
    finally:
        bar.close()
    return history


def _decoder(tok, eos: int):
    from xtrain_lessons.rewards import EOT  # noqa: PLC0415

    def decode(ids) -> str:
        ended = bool(ids) and ids[-1] == eos
        return tok.decode([i for i in ids if i != eos]) + (EOT if ended else "")
    return decode


def _val_dataset(run_dir: Path, tok):
    from xtrain_lessons.data import TokenDataset  # noqa: PLC0415

    try:
        return TokenDataset(run_dir / "data", "val", tokenizer=tok)
    except (FileNotFoundError, ValueError):
        return None


def _evaluate(model, encoded, reward, cfg, decode, eos, args, val) -> dict:
    """Mean reward of --eval-samples completions of every prompt (a fixed seed) and the
    validation loss: the same measurement before and after."""
    import numpy as np  # noqa: PLC0415

    from xtrain_lessons.grpo import sample_group  # noqa: PLC0415
    from xtrain_lessons.train import evaluate  # noqa: PLC0415

    rng = np.random.default_rng(12345)
    model.eval()
    samples, scores = [], []
    for text, ids in encoded:
        for comp, _ in sample_group(model, ids, max(args.eval_samples, 1), cfg.max_new_tokens,
                                    cfg.temperature, cfg.top_p, eos, rng):
            s = decode(comp)
            r = reward(text, s, len(comp))
            scores.append(r)
            samples.append((r, text + s))
    val_loss = None
    if val is not None and args.eval_batches:
        val_loss = evaluate(model, val, 16, min(128, model.config.max_seq_len), args.eval_batches)
    model.train()
    return {"reward": float(np.mean(scores)), "samples": samples, "val_loss": val_loss}


def _write_run_files(args, cfg, model, tok, out: Path) -> None:
    from xtrain_lessons.tokenizer import atomic_write_bytes, tokenizer_hash  # noqa: PLC0415

    atomic_write_bytes(out / "tokenizer.json", tok.to_str(pretty=True).encode("utf-8"))
    conf = {"model": model.config.to_dict(), "tokenizer_hash": tokenizer_hash(tok),
            "n_params": model.n_params(), "grpo": cfg.to_dict(), "reward": args.reward,
            "base_run": str(args.run_dir)}
    atomic_write_bytes(out / "config.json", (json.dumps(conf, indent=2) + "\n").encode("utf-8"))
    src = Path(args.run_dir) / "data"
    if src.is_dir() and not (out / "data").exists():  # the validation split, for evaluating
        shutil.copytree(src, out / "data")


def _save(model, tok, out: Path, step: int, cfg, args) -> None:
    from xtrain_lessons.checkpoint import save_checkpoint  # noqa: PLC0415
    from xtrain_lessons.tokenizer import tokenizer_hash  # noqa: PLC0415

    save_checkpoint(out / "checkpoints", step, model, tokenizer_hash=tokenizer_hash(tok),
                    extra={"grpo": cfg.to_dict(), "reward": args.reward, "base_run": str(args.run_dir)})


def _write_samples(path: Path, before: dict, after: dict) -> None:
    lines = []
    for name, ev in (("before", before), ("after", after)):
        lines.append(f"===== {name}: mean reward {ev['reward']:.3f}")
        for r, text in ev["samples"]:
            lines.append(f"[reward {r:g}] {text}")
    from xtrain_lessons.tokenizer import atomic_write_bytes  # noqa: PLC0415

    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))


def _plot(history: list, path: Path, title: str) -> None:
    """Mean reward per step (and its running mean) over entropy and KL."""
    import numpy as np  # noqa: PLC0415
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(7, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax, ax2 = fig.subplots(2, 1, sharex=True)
    steps = [h["step"] for h in history]
    r = [h["reward_mean"] for h in history]
    ax.plot(steps, r, color="tab:green", alpha=0.35, lw=0.9, label="mean reward (per step)")
    k = max(1, len(r) // 10)
    if k > 1:
        ax.plot(steps[k - 1:], np.convolve(r, np.ones(k) / k, mode="valid"), color="tab:green",
                lw=1.8, label=f"mean of {k}")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    ax2.plot(steps, [h["entropy"] for h in history], color="tab:blue", label="entropy (nats)")
    ax2.plot(steps, [h["kl"] or 0.0 for h in history], color="tab:red", label="KL to start")
    ax2.set_xlabel("GRPO step")
    ax2.grid(alpha=0.3)
    ax2.legend()
    fig.tight_layout()
    fig.savefig(str(path))
