"""A run's metrics (`metrics.jsonl`, one JSON object per step), its samples and its loss plot.

    from xtrain_lessons.training.metrics import read_metrics, plot_metrics
    plot_metrics(read_metrics("runs/demo/metrics.jsonl"), "loss.png")
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

__all__ = ["read_metrics", "plot_metrics", "truncate_after", "last_sample"]


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The records of a metrics.jsonl (a line cut by a crash is skipped)."""
    path = Path(path)
    if not path.exists():
        return []
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line cut by a crash
    return out


def plot_metrics(metrics: list[dict], path: str | os.PathLike, title: str = "") -> None:
    """Train loss (raw and smoothed) and validation loss against step, as a PNG (Agg, no GUI)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    steps = [m["step"] for m in metrics if "train_loss" in m]
    loss = [m["train_loss"] for m in metrics if "train_loss" in m]
    fig = Figure(figsize=(7, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    if loss:
        ax.plot(steps, loss, color="tab:blue", alpha=0.3, lw=0.8, label="train (per step)")
        k = max(1, len(loss) // 50)
        if k > 1:
            sm = np.convolve(loss, np.ones(k) / k, mode="valid")
            ax.plot(steps[k - 1:], sm, color="tab:blue", lw=1.6, label=f"train (mean of {k})")
    vs = [(m["step"], m["val_loss"]) for m in metrics if m.get("val_loss") is not None]
    if vs:
        ax.plot(*zip(*vs), "o-", color="tab:orange", lw=1.6, label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/token)")
    ax.set_title(title or "loss")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(path))


def truncate_after(step: int, metrics_path: Path, samples_path: Path) -> None:
    """Drop the metric records and samples of steps after `step` (a resumed run redoes them)."""
    kept = [m for m in read_metrics(metrics_path) if m.get("step", 0) <= step]
    with open(metrics_path, "w", encoding="utf-8") as f:
        f.write("".join(json.dumps(m) + "\n" for m in kept))
    if samples_path.exists():
        chunks = samples_path.read_text(encoding="utf-8").split("--- step ")
        keep = [c for c in chunks[1:] if c.split("\n", 1)[0].strip().isdigit()
                and int(c.split("\n", 1)[0]) <= step]
        samples_path.write_text("".join("--- step " + c for c in keep), encoding="utf-8")


def last_sample(samples_path: Path) -> str | None:
    """The text of the last sample in samples.txt (None if there is none)."""
    if not samples_path.exists():
        return None
    chunks = samples_path.read_text(encoding="utf-8").split("--- step ")
    return chunks[-1].split("\n", 1)[-1].strip() if len(chunks) > 1 else None
