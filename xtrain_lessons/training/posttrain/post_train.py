"""GRPO post-training of a run directory (T20): evaluate, sample groups and reinforce, evaluate
again, and write the post-trained run (the engine of `xtrain grpo`, cli/grpo.py).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from xtrain_lessons.training.checkpoint import save_checkpoint
from xtrain_lessons.training.data import TokenDataset
from xtrain_lessons.training.posttrain.grpo import grpo_step, sample_group
from xtrain_lessons.training.optim import AdamW
from xtrain_lessons.training.posttrain.rewards import EOT
from xtrain_lessons.training.tokenizer import atomic_write_bytes, eot_id, tokenizer_hash
from xtrain_lessons.training.validation import evaluate


def post_train(args, cfg, reward, prompts, model, tok, ck, out: Path) -> int:
    """Evaluate, train, evaluate again, write everything. `args` holds the options of
    `xtrain grpo` (cli/grpo.py): run_dir, reward, steps, eval_samples, eval_batches, ..."""
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
    def decode(ids) -> str:
        ended = bool(ids) and ids[-1] == eos
        return tok.decode([i for i in ids if i != eos]) + (EOT if ended else "")
    return decode


def _val_dataset(run_dir: Path, tok):
    try:
        return TokenDataset(run_dir / "data", "val", tokenizer=tok)
    except (FileNotFoundError, ValueError):
        return None


def _evaluate(model, encoded, reward, cfg, decode, eos, args, val) -> dict:
    """Mean reward of --eval-samples completions of every prompt (a fixed seed) and the
    validation loss: the same measurement before and after."""


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

    atomic_write_bytes(out / "tokenizer.json", tok.to_str(pretty=True).encode("utf-8"))
    conf = {"model": model.config.to_dict(), "tokenizer_hash": tokenizer_hash(tok),
            "n_params": model.n_params(), "grpo": cfg.to_dict(), "reward": args.reward,
            "base_run": str(args.run_dir)}
    atomic_write_bytes(out / "config.json", (json.dumps(conf, indent=2) + "\n").encode("utf-8"))
    src = Path(args.run_dir) / "data"
    if src.is_dir() and not (out / "data").exists():  # the validation split, for evaluating
        shutil.copytree(src, out / "data")


def _save(model, tok, out: Path, step: int, cfg, args) -> None:

    save_checkpoint(out / "checkpoints", step, model, tokenizer_hash=tokenizer_hash(tok),
                    extra={"grpo": cfg.to_dict(), "reward": args.reward, "base_run": str(args.run_dir)})


def _write_samples(path: Path, before: dict, after: dict) -> None:
    lines = []
    for name, ev in (("before", before), ("after", after)):
        lines.append(f"===== {name}: mean reward {ev['reward']:.3f}")
        for r, text in ev["samples"]:
            lines.append(f"[reward {r:g}] {text}")

    atomic_write_bytes(path, ("\n".join(lines) + "\n").encode("utf-8"))


def _plot(history: list, path: Path, title: str) -> None:
    """Mean reward per step (and its running mean) over entropy and KL."""
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
