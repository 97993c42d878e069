"""The scaling study's two pictures (T19): learning curves, and eval bits/byte against FLOPs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from xtrain_lessons.measure.scaling_law import predict
from xtrain_lessons.training.metrics import read_metrics


def _figure(w: float = 7.5, h: float = 4.5):
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: PLC0415
    from matplotlib.figure import Figure  # noqa: PLC0415

    fig = Figure(figsize=(w, h), dpi=100)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot(1, 1, 1)


def _colors(rows):
    from matplotlib import colormaps  # noqa: PLC0415

    sizes = sorted({r["size"] for r in rows}, key=lambda s: min(x["params_nonembed"] for x in rows if x["size"] == s))
    cmap = colormaps["viridis"]
    return {s: cmap(i / max(1, len(sizes) - 1) * 0.9) for i, s in enumerate(sizes)}


def plot_curves(study: Path, rows: list[dict], path: Path) -> None:
    """Train loss (smoothed) against tokens for every run: solid on train.txt, dashed on small.txt."""
    fig, ax = _figure()
    colors = _colors(rows)
    for r in rows:
        m = [x for x in read_metrics(Path(study) / "runs" / r["run"] / "metrics.jsonl") if "train_loss" in x]
        if not m:
            continue
        tok = np.array([x["tokens"] for x in m], dtype=float)
        loss = np.array([x["train_loss"] for x in m])
        k = max(1, len(loss) // 20)
        sm = np.convolve(loss, np.ones(k) / k, mode="valid")
        ax.plot(tok[k - 1:], sm, color=colors[r["size"]], lw=1.2, ls="-" if r["corpus"] == "train" else "--",
                label=r["size"] if r["corpus"] == "train" and r["steps"] == max(
                    x["steps"] for x in rows if x["size"] == r["size"]) else None)
    ax.set_xscale("log")
    ax.set_xlabel("training tokens")
    ax.set_ylabel("train loss (nats/token)")
    ax.set_title("learning curves (dashed: the small corpus)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(str(path))


def plot_loss_vs_flops(rows: list[dict], fit: dict, path: Path) -> None:
    """Eval bits/byte against training FLOPs; one line per size, the fitted law dotted."""
    fig, ax = _figure()
    colors = _colors(rows)
    for size, color in colors.items():
        g = sorted((r for r in rows if r["size"] == size and r["corpus"] == "train"), key=lambda r: r["flops"])
        if not g:
            continue
        f = np.array([r["flops"] for r in g])
        ax.plot(f, [r["eval_bits_per_byte"] for r in g], "o-", color=color,
                label=f"{size} ({g[0]['params_nonembed'] / 1e3:.0f}k)")
        D = np.geomspace(g[0]["tokens"] / 1.5, g[-1]["tokens"] * 1.5, 30)
        ax.plot(f[0] / g[0]["tokens"] * D, predict(fit, g[0]["params_nonembed"], D), ":", color=color)
    small = [r for r in rows if r["corpus"] == "small"]
    if small:
        ax.plot([r["flops"] for r in small], [r["eval_bits_per_byte"] for r in small], "x", color="tab:red",
                ms=8, label="small corpus")
    ax.set_xscale("log")
    ax.set_xlabel("training FLOPs (6ND + attention)")
    ax.set_ylabel("eval bits per byte")
    ax.set_title(f"fit: {fit['E']:.2f} + {fit['A']:.3g}/N^{fit['alpha']:.2f} + {fit['B']:.3g}/D^{fit['beta']:.2f}")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(str(path))
