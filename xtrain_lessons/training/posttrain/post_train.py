"""GRPO post-training of a run directory (the engine of `xtrain grpo`, cli/grpo.py): measure,
sample groups and reinforce, measure again, write the post-trained run (run_files.py).

What is measured on the evaluation prompts (the held-out ones when there are any, else the
training prompts), before, every `eval_every` steps and after, with a fixed seed:
the mean reward of `eval_samples` completions per prompt (sampled as the rollouts are), the
greedy accuracy when the prompts have answers (answers.parse_answer), and the validation loss
of the base run's data.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from xtrain_lessons.model.qwen3 import Model
from xtrain_lessons.training.data import TokenDataset
from xtrain_lessons.training.optim import AdamW
from xtrain_lessons.training.posttrain.accuracy import heldout_accuracy
from xtrain_lessons.training.posttrain.grpo import grpo_step
from xtrain_lessons.training.posttrain.rollouts import sample_batch
from xtrain_lessons.training.posttrain.run_files import (
    append_metrics,
    decoder,
    save_weights,
    write_run_files,
    write_samples,
)
from xtrain_lessons.training.rundir import write_json_atomic
from xtrain_lessons.training.tokenizer import eot_id
from xtrain_lessons.training.validation import evaluate

__all__ = ["post_train", "evaluate_prompts"]


def post_train(args, cfg, reward, prompts, heldout, model, tok, ck, out: Path) -> int:
    """Evaluate, train, evaluate again, write everything. `prompts`: the training prompts (str);
    `heldout`: [(prompt, answer or None)] to evaluate on (empty: the training prompts).
    `args` holds the options of `xtrain grpo`: run_dir, reward, eval_samples, eval_batches,
    eval_every, progress."""
    eos = eot_id(tok)
    encoded = [(p, tok.encode(p).ids or [eos]) for p in prompts]
    evals = heldout or [(p, None) for p in prompts]
    decode = decoder(tok, eos)
    write_run_files(out, model, tok, args.run_dir, "grpo", cfg.to_dict(), reward=args.reward)
    val = _val_dataset(Path(args.run_dir), tok) if args.eval_batches else None
    t0 = time.perf_counter()
    measure = lambda: evaluate_prompts(model, tok, evals, reward, cfg, decode, eos,  # noqa: E731
                                       args.eval_samples, val, args.eval_batches)
    before = measure()
    print(f"before: {_describe(before)}")
    history = _loop(args, cfg, reward, encoded, model, eos, decode, out / "metrics.jsonl", measure)
    after = measure()
    save_weights(out, model, tok, ck.step + len(history),
                 {"grpo": cfg.to_dict(), "reward": args.reward, "base_run": str(args.run_dir)})
    _plot(history, out / "reward.png", f"GRPO, reward {args.reward}")
    write_samples(out / "samples.txt", [(f"{name}: {_describe(ev)}", [(f"reward {r:g}", t) for r, t in ev["samples"]])
                                        for name, ev in (("before", before), ("after", after))])
    summary = {"reward": args.reward, "steps": len(history), "seconds": round(time.perf_counter() - t0, 1),
               "eval_prompts": len(evals), "heldout": bool(heldout),
               "reward_before": before["reward"], "reward_after": after["reward"],
               "accuracy_before": before["accuracy"], "accuracy_after": after["accuracy"],
               "val_loss_before": before["val_loss"], "val_loss_after": after["val_loss"],
               "kl_last": history[-1]["kl"] if history else None}
    write_json_atomic(out / "summary.json", summary)
    where = f"{len(evals)} held-out prompts" if heldout else f"{len(evals)} prompts"
    acc = ("" if before["accuracy"] is None else
           f"; greedy accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f}")
    vl = ("" if before["val_loss"] is None else
          f"; validation loss {before['val_loss']:.4f} -> {after['val_loss']:.4f}")
    print(f"mean reward {before['reward']:.3f} -> {after['reward']:.3f} on {where} x "
          f"{args.eval_samples}{acc}{vl}; wrote {out}")
    return 0


def _describe(ev: dict) -> str:
    acc = "" if ev["accuracy"] is None else f", greedy accuracy {ev['accuracy']:.3f}"
    return f"mean reward {ev['reward']:.3f}{acc}"


def _loop(args, cfg, reward, encoded, model, eos, decode, metrics_path: Path, measure) -> list:
    """The GRPO steps, a bar and one metrics line each; Ctrl-C stops after the current step."""
    ref = Model(model.config, seed=0)  # the frozen start model: KL measured even unpenalised
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
            opt.set_lr(cfg.lr_at(step))
            m = grpo_step(model, ref, opt, batch, reward, cfg, rng, eos, decode)
            row = {"step": step, "lr": opt.lr, **{k: v for k, v in m.items() if not k.startswith("_")}}
            if args.eval_every and step % args.eval_every == 0 and step < cfg.steps:
                ev = measure()
                row.update(eval_reward=ev["reward"], eval_accuracy=ev["accuracy"])
                tqdm.write(f"step {step}: {_describe(ev)}", file=sys.stdout)
            history.append(row)
            append_metrics(metrics_path, row)
            bar.set_postfix(reward=f"{m['reward_mean']:.2f}", kl=f"{m['kl']:.3f}",
                            clip=f"{m['clip_frac']:.2f}", H=f"{m['entropy']:.2f}")
    except KeyboardInterrupt:
        print(f"interrupted at step {step}: saving what was learned so far", file=sys.stderr)
    finally:
        bar.close()
    return history


def _val_dataset(run_dir: Path, tok):
    try:
        return TokenDataset(run_dir / "data", "val", tokenizer=tok)
    except (FileNotFoundError, ValueError):
        return None


def evaluate_prompts(model, tok, evals, reward, cfg, decode, eos, n_samples: int, val=None,
                     val_batches: int = 0) -> dict:
    """{"reward": mean reward of n_samples sampled completions per prompt (seed 12345),
    "accuracy": greedy accuracy of the prompts with answers (else None), "samples",
    "val_loss"}: the same measurement before, during and after."""
    rng = np.random.default_rng(12345)
    model.eval()
    ids = [tok.encode(p).ids or [eos] for p, _ in evals]
    scores, samples = [], []
    by_length = {}
    for i, p in enumerate(ids):
        by_length.setdefault(len(p), []).append(i)
    k = max(n_samples, 1)
    for group in by_length.values():
        rows = sample_batch(model, [ids[i] for i in group for _ in range(k)], cfg.max_new_tokens,
                            cfg.temperature, cfg.top_p, eos, rng)
        for j, (comp, _) in enumerate(rows):
            text, completion = evals[group[j // k]][0], decode(comp)
            r = reward(text, completion, len(comp))
            scores.append(r)
            samples.append((r, text + completion))
    graded = [(p, a) for p, a in evals if a is not None]
    acc = heldout_accuracy(model, lambda s: tok.encode(s).ids or [eos], decode, graded, eos,
                           cfg.max_new_tokens)[0] if graded else None
    val_loss = None
    if val is not None and val_batches:
        val_loss = evaluate(model, val, 16, min(128, model.config.max_seq_len), val_batches)
    model.train()
    return {"reward": float(np.mean(scores)), "accuracy": acc, "samples": samples[:32], "val_loss": val_loss}


def _plot(history: list, path: Path, title: str) -> None:
    """Mean reward per step (and its running mean), the evaluations, over entropy and KL."""
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
    ev = [(h["step"], h["eval_accuracy"]) for h in history if h.get("eval_accuracy") is not None]
    if ev:
        ax.plot(*zip(*ev), marker="o", color="tab:purple", label="greedy accuracy (evaluation)")
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
