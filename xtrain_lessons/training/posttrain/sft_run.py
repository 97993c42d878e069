"""Supervised fine-tuning of a run directory (the engine of `xtrain sft`, cli/sft.py): measure,
fine-tune with a progress bar, measure again, write the fine-tuned run (run_files.py).

What is measured on the held-out pairs (when there are any), before, every `eval_every` steps
and after: the mean negative log-likelihood per response token, and — for rows with an
"answer" — the accuracy of the greedy completions (answers.parse_answer).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np
from tqdm import tqdm

from xtrain_lessons.autograd.tensor import no_grad
from xtrain_lessons.training.posttrain.accuracy import greedy_completions
from xtrain_lessons.training.posttrain.answers import is_correct
from xtrain_lessons.training.posttrain.batch import prompt_response_batch
from xtrain_lessons.training.posttrain.logprobs import sequence_logprobs
from xtrain_lessons.training.posttrain.run_files import (
    append_metrics,
    decoder,
    save_weights,
    write_run_files,
    write_samples,
)
from xtrain_lessons.training.posttrain.sft import SFTConfig, check_lengths, sft_loss, sft_train
from xtrain_lessons.training.rundir import write_json_atomic
from xtrain_lessons.training.tokenizer import eot_id

__all__ = ["sft_run", "heldout_metrics", "encode_pairs"]


def encode_pairs(rows, tok, eos: int) -> list:
    """(prompt ids, response ids + end-of-text) of each row: the model learns to stop."""
    return [(tok.encode(r["prompt"]).ids, tok.encode(r["response"]).ids + [eos]) for r in rows]


def _nll(model, pairs, batch: int = 64) -> float:
    """Mean negative log-likelihood per response token of `pairs`, no graph."""
    total, tokens = 0.0, sum(len(r) for _, r in pairs)
    with no_grad():
        for i in range(0, len(pairs), batch):
            chunk = pairs[i:i + batch]
            ids, labels, mask = prompt_response_batch([p for p, _ in chunk], [r for _, r in chunk])
            total += float(sft_loss(sequence_logprobs(model, ids, labels), mask, tokens).item())
    return total


def heldout_metrics(model, rows, pairs, decode, eos: int, max_new_tokens: int, n_samples: int = 4) -> dict:
    """{"loss", "accuracy" (None without answers), "samples": [(mark, prompt + completion)]}."""
    model.eval()
    graded = [i for i, r in enumerate(rows) if "answer" in r]
    shown = list(range(min(n_samples, len(rows))))
    wanted = sorted(set(graded) | set(shown))
    done = dict(zip(wanted, greedy_completions(model, [pairs[i][0] for i in wanted], max_new_tokens, eos)))
    texts = {i: decode(ids) for i, ids in done.items()}
    acc = float(np.mean([is_correct(texts[i], rows[i]["answer"]) for i in graded])) if graded else None
    samples = [("right" if is_correct(texts[i], rows[i]["answer"]) else "wrong") if "answer" in rows[i]
               else "sample" for i in shown]
    out = {"loss": _nll(model, pairs), "accuracy": acc,
           "samples": [(mark, rows[i]["prompt"] + texts[i]) for mark, i in zip(samples, shown)]}
    model.train()
    return out


def _describe(ev: dict, label: str) -> str:
    acc = "" if ev["accuracy"] is None else f", accuracy {ev['accuracy']:.3f}"
    return f"{label} loss {ev['loss']:.4f}{acc}"


def sft_run(args, cfg: SFTConfig, model, tok, ck, rows, heldout, out: Path) -> int:
    """Fine-tune `model` on `rows` (pairs.read_pairs) and write run directory `out`. `args`: the
    options of `xtrain sft` (run_dir, data, eval_every, max_new_tokens, progress)."""
    eos = eot_id(tok)
    decode = decoder(tok, eos)
    pairs = encode_pairs(rows, tok, eos)
    check_lengths(pairs, model.config.max_seq_len, what=f"{args.data}: pair")
    # without held-out pairs: the loss and samples of the first training pairs (not graded)
    evals = heldout or [{k: v for k, v in r.items() if k != "answer"} for r in rows[:4]]
    label = "held-out" if heldout else "first-pairs"
    eval_pairs = encode_pairs(evals, tok, eos)
    check_lengths(eval_pairs, model.config.max_seq_len, what="held-out pair")
    write_run_files(out, model, tok, args.run_dir, "sft", cfg.to_dict(), sft_data=str(args.data))
    metrics = out / "metrics.jsonl"
    metrics.write_text("", encoding="utf-8")
    t0 = time.perf_counter()
    before = heldout_metrics(model, evals, eval_pairs, decode, eos, args.max_new_tokens)
    print(f"before: {_describe(before, label)}")
    curve = [(0, before["accuracy"])]
    bar = tqdm(total=cfg.steps, desc="sft", disable=not args.progress, dynamic_ncols=True)
    history = []

    def on_step(step, m):
        history.append(m)
        bar.update(1)
        bar.set_postfix(loss=f"{m['loss']:.3f}")
        row = dict(m)
        if args.eval_every and step % args.eval_every == 0 and step < cfg.steps:
            ev = heldout_metrics(model, evals, eval_pairs, decode, eos, args.max_new_tokens)
            row.update(heldout_loss=ev["loss"], heldout_accuracy=ev["accuracy"])
            curve.append((step, ev["accuracy"]))
            tqdm.write(f"step {step}: {_describe(ev, label)}", file=sys.stdout)
        append_metrics(metrics, row)

    try:
        sft_train(model, pairs, cfg, on_step=on_step)
    except KeyboardInterrupt:
        print(f"interrupted after step {len(history)}: saving what was learned so far", file=sys.stderr)
    finally:
        bar.close()
    after = heldout_metrics(model, evals, eval_pairs, decode, eos, args.max_new_tokens)
    curve.append((len(history), after["accuracy"]))
    save_weights(out, model, tok, ck.step + len(history), {"sft": cfg.to_dict(), "base_run": str(args.run_dir)})
    _plot(history, curve, out / "loss.png")
    write_samples(out / "samples.txt", [(f"before: {_describe(before, label)}", before["samples"]),
                                        (f"after: {_describe(after, label)}", after["samples"])])
    summary = {"steps": len(history), "seconds": round(time.perf_counter() - t0, 1),
               "pairs": len(rows), "heldout_pairs": len(heldout),
               "loss_first": history[0]["loss"] if history else None,
               "loss_last": history[-1]["loss"] if history else None,
               "heldout_loss_before": before["loss"], "heldout_loss_after": after["loss"],
               "heldout_accuracy_before": before["accuracy"], "heldout_accuracy_after": after["accuracy"]}
    write_json_atomic(out / "summary.json", summary)
    first = f"loss {history[0]['loss']:.3f} -> {history[-1]['loss']:.3f} over {len(history)} steps; " if history else ""
    acc = ("" if after["accuracy"] is None else
           f"; held-out accuracy {before['accuracy']:.3f} -> {after['accuracy']:.3f} on {len(heldout)} pairs")
    print(f"SFT: {first}{label} loss {before['loss']:.4f} -> {after['loss']:.4f}{acc}; wrote {out}")
    return 0


def _plot(history: list, curve: list, path: Path) -> None:
    """The training loss per step, and the held-out accuracy where it was measured."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(7, 3.2), dpi=100)
    FigureCanvasAgg(fig)
    ax, ax2 = fig.subplots(1, 2)
    ax.plot([h["step"] for h in history], [h["loss"] for h in history], color="tab:blue")
    ax.set_xlabel("SFT step")
    ax.set_ylabel("loss (NLL per response token)")
    ax.set_yscale("log")
    ax.grid(alpha=0.3)
    pts = [(s, a) for s, a in curve if a is not None]
    if pts:
        ax2.plot(*zip(*pts), marker="o", color="tab:green")
    ax2.set_xlabel("SFT step")
    ax2.set_ylabel("held-out accuracy (greedy)")
    ax2.set_ylim(0, 1)
    ax2.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(str(path))
