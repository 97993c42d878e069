"""A scaling study on the course's own engine (T19): model sizes x token budgets, one corpus.

    from xtrain_lessons.measure.study import run_study
    report = run_study("quick", out="study")        # or "full" (the default of `xtrain study`)

The plan. The corpus's documents are split once, by position (no randomness): the last
documents holding at least ``eval_bytes`` bytes become ``corpus/eval.txt``, the fixed
held-out file every run is scored on (``evaluate.evaluate_model``: the whole file, bits per
byte); the documents just before it, up to ``train_bytes``, are ``corpus/train.txt``; the
first of those, at least ``small_bytes``, are ``corpus/small.txt``, a small corpus for the
data-vs-capacity comparisons (many epochs over little text). One byte-level BPE tokenizer is trained
on train.txt and shared by every run. Then every model size trains for every token budget on
train.txt (the grid), plus a few runs on small.txt (``extra``). Each run is a plain
``train()`` run directory under ``runs/``, with its own cosine schedule.

Outputs in the study directory::

    study.json          the plan (preset, corpus sha256), checked when the study is resumed
    results.csv/.json   one row per run: params, tokens, epochs, FLOPs, wall time, final train
                        and val loss, eval loss and bits per byte, a sample
    fit.json            L = E + A/N^alpha + B/D^beta on the grid (N: non-embedding parameters,
                        D: tokens, L: eval bits per byte) and compute-optimal sizes
    curves.png          learning curves;  loss_vs_flops.png  eval bits/byte against FLOPs
    samples.md          one sample of every run, side by side
    log.jsonl           one event per run and session: start, resume, reuse, done

FLOPs of a run = tokens x ``bench.train_flops_per_token`` = 6 N D + attention, where N counts
every weight matrix that is multiplied (the non-embedding weights and the lm_head). Wall time
of a run = its ``train()`` sessions (tokenizing its text included, scoring excluded; a
session killed before it returned is not counted). Final train loss = the mean of the last
10 steps; val loss = ``train()``'s own validation split of the run's text, in nats/token.

Resumable: a run whose ``result.json`` exists is reused; one with a checkpoint continues from
it (bit-exact, see train.py); one without is started again. Kill the study at any moment
and run the same command again.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm import tqdm

from xtrain_lessons.measure.bench import train_flops_per_token
from xtrain_lessons.measure.evaluate import evaluate_model
from xtrain_lessons.measure.scaling_law import compute_optimal, fit_scaling_law
from xtrain_lessons.measure.study_plots import plot_curves, plot_loss_vs_flops
from xtrain_lessons.model.qwen3 import ffn_dim_for
from xtrain_lessons.training.config import TrainConfig
from xtrain_lessons.training.data import TokenDataset, default_corpus_path, read_documents
from xtrain_lessons.training.loop import train
from xtrain_lessons.training.tokenizer import EOT, atomic_write_bytes, save_tokenizer, train_tokenizer

__all__ = ["StudyPreset", "PRESETS", "RunSpec", "plan_runs", "split_corpus", "run_study",
           "fit_grid", "non_embedding_params", "format_table", "run_one", "learning_rate"]


@dataclass(frozen=True)
class StudyPreset:
    sizes: dict            # name -> (dim, n_layers, n_heads)
    steps: tuple           # token budgets, in optimizer steps of batch_size x seq_len tokens
    extra: tuple           # (size, steps) runs on the small corpus
    batch_size: int = 8
    seq_len: int = 64
    vocab_size: int = 512
    eval_bytes: int = 40_000
    small_bytes: int = 24_000
    train_bytes: int = 600_000   # at most this much training text (each run tokenizes it)
    max_lr: float = 1e-2     # the peak learning rate up to width lr_width, then ~ width^-1.5
    lr_width: int = 48       # (measured on the quick grid: 1e-2 is best at d32-d48, 3e-3 at d96)
    seed: int = 0
    threads: int = 1
    flops_budgets: tuple = (1e12, 1e13)  # where fit.json reports the compute-optimal size


PRESETS: dict[str, StudyPreset] = {
    # for the tests: seconds
    "micro": StudyPreset(sizes={"d16L1": (16, 1, 2), "d24L1": (24, 1, 2), "d32L2": (32, 2, 2),
                                "d48L2": (48, 2, 2)},
                         steps=(12, 24, 48), extra=(("d24L1", 48),), batch_size=4, seq_len=32,
                         vocab_size=300, eval_bytes=6_000, small_bytes=10_000, train_bytes=100_000),
    # the notebook's and CI's: 46 s on 2 idle cores, about 2 minutes on a busy machine
    "quick": StudyPreset(sizes={"d24L2": (24, 2, 2), "d32L2": (32, 2, 2), "d48L2": (48, 2, 2),
                                "d64L3": (64, 3, 4)},
                         steps=(80, 160, 320), extra=(("d32L2", 160), ("d32L2", 320), ("d64L3", 320))),
    # the default of `xtrain study`: its 18 runs took about 17 minutes of CPU time here (one
    # thread each), 43 minutes elapsed at nice 19 on a 2-core machine with a load of 5 to 14
    "full": StudyPreset(sizes={"d32L2": (32, 2, 2), "d48L2": (48, 2, 2), "d64L3": (64, 3, 4),
                               "d96L4": (96, 4, 4), "d128L4": (128, 4, 4)},
                        steps=(400, 800, 1600), extra=(("d48L2", 800), ("d48L2", 1600), ("d128L4", 1600)),
                        batch_size=16, eval_bytes=100_000, small_bytes=250_000, train_bytes=8_000_000,
                        flops_budgets=(1e13, 1e14)),
}


@dataclass(frozen=True)
class RunSpec:
    size: str
    steps: int
    corpus: str = "train"  # "train" (the grid) or "small"

    def name(self, preset: StudyPreset) -> str:
        n = self.steps * preset.batch_size * preset.seq_len
        tokens = f"{n / 1e3:.3g}k" if n < 1e6 else f"{n / 1e6:.3g}M"
        return f"{self.size}-{tokens}" + ("-small" if self.corpus == "small" else "")


def plan_runs(preset: StudyPreset) -> list[RunSpec]:
    """The grid (every size x every budget, smallest first) then the small-corpus runs."""
    grid = [RunSpec(s, n) for s in preset.sizes for n in preset.steps]
    return grid + [RunSpec(s, n, "small") for s, n in preset.extra]


def model_overrides(preset: StudyPreset, size: str) -> dict:
    """TrainConfig.model for a size: dim, layers and heads; head_dim and ffn_dim derived."""
    dim, layers, heads = preset.sizes[size]
    return {"dim": dim, "n_layers": layers, "n_heads": heads, "n_kv_heads": heads,
            "head_dim": dim // heads, "ffn_dim": ffn_dim_for(dim), "max_seq_len": preset.seq_len}


def learning_rate(preset: StudyPreset, dim: int) -> float:
    """Peak learning rate of a width: wider models need smaller steps."""
    return preset.max_lr * min(1.0, preset.lr_width / dim) ** 1.5


def non_embedding_params(config) -> int:
    """Parameters outside the embedding and the lm_head (Kaplan et al.'s N)."""
    return config.n_params() - 2 * config.vocab_size * config.dim


# ----- the corpus -------------------------------------------------------------------------

def _eot_text(docs: list[str]) -> str:

    return f"\n{EOT}\n".join(docs) + "\n"


def split_corpus(corpus: str | os.PathLike, out_dir: str | os.PathLike, eval_bytes: int,
                 small_bytes: int, train_bytes: int | None = None) -> dict:
    """Write eval.txt (the last documents, >= eval_bytes), train.txt (the documents before it,
    at most train_bytes of them, the last ones kept) and small.txt (the first documents of
    train.txt, >= small_bytes) into out_dir. Deterministic: positions only, no randomness."""

    docs, sha = read_documents(corpus)
    sizes = [len(d.encode("utf-8")) for d in docs]
    cut, tail = len(docs), 0
    while cut > 0 and tail < eval_bytes:
        cut -= 1
        tail += sizes[cut]
    if cut < 2:
        raise ValueError(f"{corpus}: {len(docs)} documents, {sum(sizes):,} bytes: too little text "
                         f"for a held-out tail of {eval_bytes:,} bytes and a training set")
    first, kept = cut, 0
    while first > 0 and kept + sizes[first - 1] <= (train_bytes or math.inf):
        first -= 1
        kept += sizes[first]
    head, total = first, 0
    while head < cut and total < small_bytes:
        total += sizes[head]
        head += 1
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = {"train": docs[first:cut], "eval": docs[cut:], "small": docs[first:max(head, first + 2)]}
    for name, part in parts.items():
        atomic_write_bytes(out / f"{name}.txt", _eot_text(part).encode("utf-8"))
    return {"sha256": sha, "documents": {k: len(v) for k, v in parts.items()},
            "bytes": {k: sum(len(d.encode("utf-8")) for d in v) for k, v in parts.items()}}


# ----- running ----------------------------------------------------------------------------

def _write_json(path: Path, obj) -> None:

    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode("utf-8"))


def _event(study: Path, **kw) -> None:
    with open(study / "log.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps({"time": round(time.time(), 3), **kw}) + "\n")


def _prepare(study: Path, preset: StudyPreset, corpus: Path, log) -> dict:
    """The plan, the corpus split and the tokenizer: made once, checked when resuming."""
    sha = hashlib.sha256(corpus.read_bytes()).hexdigest()
    plan = {"preset": asdict(preset), "corpus": str(corpus), "corpus_sha256": sha}
    plan_path = study / "study.json"
    if plan_path.exists():
        old = json.loads(plan_path.read_text(encoding="utf-8"))
        if json.loads(json.dumps(plan["preset"])) != old["preset"] or old["corpus_sha256"] != sha:
            raise ValueError(f"{study} holds a study with other settings or another corpus: "
                             f"use another --out, or delete {study} to start over")
    study.mkdir(parents=True, exist_ok=True)
    cdir = study / "corpus"
    if not all((cdir / f"{n}.txt").exists() for n in ("train", "eval", "small")) or not plan_path.exists():
        plan["split"] = split_corpus(corpus, cdir, preset.eval_bytes, preset.small_bytes, preset.train_bytes)
        log(f"corpus: {plan['split']['documents']['train']} training documents, "
            f"{plan['split']['documents']['eval']} held out ({plan['split']['bytes']['eval']:,} bytes) "
            f"in {cdir / 'eval.txt'}")
        _write_json(plan_path, plan)
    if not (study / "tokenizer.json").exists():
        save_tokenizer(train_tokenizer([cdir / "train.txt"], preset.vocab_size), study / "tokenizer.json")
    return json.loads(plan_path.read_text(encoding="utf-8"))


def _train_config(study: Path, preset: StudyPreset, spec: RunSpec):
    lr = learning_rate(preset, preset.sizes[spec.size][0])
    return TrainConfig(
        preset="tiny", model=model_overrides(preset, spec.size), data=str(study / "corpus" / f"{spec.corpus}.txt"),
        tokenizer=str(study / "tokenizer.json"), vocab_size=preset.vocab_size, steps=spec.steps,
        batch_size=preset.batch_size, seq_len=preset.seq_len, max_lr=lr, min_lr=lr / 10,
        warmup=max(1, min(30, spec.steps // 10)), seed=preset.seed, eval_every=spec.steps, eval_batches=8,
        sample_every=0, sample_tokens=48, checkpoint_every=max(1, spec.steps // 4), keep_checkpoints=1,
        threads=preset.threads, out=str(study / "runs" / spec.name(preset)))


def run_one(study: Path, preset: StudyPreset, spec: RunSpec, progress: bool) -> dict:
    """Train (or continue) one run, score it on eval.txt, write its result.json."""
    name = spec.name(preset)
    run_dir = study / "runs" / name
    result_path = run_dir / "result.json"
    if result_path.exists():
        _event(study, run=name, event="reuse")
        return json.loads(result_path.read_text(encoding="utf-8"))
    if (run_dir / "checkpoints" / "latest").exists():
        step = int((run_dir / "checkpoints" / "latest").read_text().strip().split("_")[-1])
        _event(study, run=name, event="resume", step=step)
        kw = {"resume": run_dir}
    else:
        shutil.rmtree(run_dir, ignore_errors=True)  # started but never checkpointed: start again
        _event(study, run=name, event="start")
        kw = {"cfg": _train_config(study, preset, spec)}
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with open(run_dir.parent / f"{name}.log", "a", encoding="utf-8") as logf:  # train()'s messages
        res = train(progress=progress, log=lambda m: print(m, file=logf, flush=True), **kw)
    if res.status != "done":
        raise KeyboardInterrupt if res.status == "interrupted" else RuntimeError(
            f"run {name} stopped: {res.status} {res.summary.get('message', '')}")
    sessions = _sessions(run_dir) + [res.summary["wall_s_this_session"]]
    _write_json(run_dir / "sessions.json", sessions)
    ev = evaluate_model(res.model, res.tokenizer, study / "corpus" / "eval.txt", preset.seq_len)
    mc, s = res.model.config, res.summary
    tokens = spec.steps * preset.batch_size * preset.seq_len
    data_tokens = len(TokenDataset(run_dir / "data", "train", check_ids=False))
    row = {
        "run": name, "size": spec.size, "corpus": spec.corpus, "dim": mc.dim, "n_layers": mc.n_layers,
        "params": mc.n_params(), "params_nonembed": non_embedding_params(mc), "steps": spec.steps,
        "tokens": tokens, "epochs": round(tokens / data_tokens, 3),
        "flops": tokens * train_flops_per_token(mc, preset.seq_len), "wall_s": round(sum(sessions), 2),
        "train_loss": s["loss_last_mean10"], "val_loss": s["val_loss"],
        "eval_loss": ev["loss"], "eval_bits_per_byte": ev["bits_per_byte"], "eval_ppl": ev["ppl"],
        "eval_tokens": ev["n_tokens"], "eval_bytes": ev["n_bytes"],
        "sample": s["sample"], "finished_at": time.time(),
    }
    _write_json(result_path, row)
    _event(study, run=name, event="done", wall_s=row["wall_s"], bits_per_byte=row["eval_bits_per_byte"])
    return row


def _sessions(run_dir: Path) -> list:
    p = run_dir / "sessions.json"
    return json.loads(p.read_text(encoding="utf-8")) if p.exists() else []


def run_study(preset: str | StudyPreset = "full", out: str | os.PathLike = "study",
              data: str | os.PathLike | None = None, progress: bool | None = None, log=print) -> dict:
    """Run (or finish) a study; returns {"rows", "fit", "optimal", "paths"} and writes the files."""


    p = PRESETS[preset] if isinstance(preset, str) else preset
    study, corpus = Path(out), Path(data) if data is not None else default_corpus_path()
    if not corpus.is_file():
        raise FileNotFoundError(f"corpus not found: {corpus} (fetch TinyStories with "
                                f"`xtrain data fetch tinystories`, or give --data FILE)")
    progress = sys.stderr.isatty() if progress is None else progress
    _prepare(study, p, corpus, log)
    specs = plan_runs(p)
    rows = []
    with tqdm(total=len(specs), desc="study", unit="run", disable=not progress, file=sys.stderr) as bar:
        for spec in specs:
            bar.set_postfix_str(spec.name(p))
            rows.append(run_one(study, p, spec, progress))
            bar.update(1)
    return write_report(study, p, rows)


# ----- the report -------------------------------------------------------------------------

COLUMNS = ["run", "size", "corpus", "params", "params_nonembed", "steps", "tokens", "epochs", "flops",
           "wall_s", "train_loss", "val_loss", "eval_loss", "eval_bits_per_byte"]


def fit_grid(rows: list[dict], budgets=()) -> tuple[dict, list[dict]]:
    """The scaling law on the grid runs (N non-embedding params, D tokens, L eval bits/byte)."""
    grid = [r for r in rows if r["corpus"] == "train"]
    fit = fit_scaling_law([r["params_nonembed"] for r in grid], [r["tokens"] for r in grid],
                          [r["eval_bits_per_byte"] for r in grid])
    return fit, [compute_optimal(fit, c) for c in budgets]


def write_report(study: Path, preset: StudyPreset, rows: list[dict]) -> dict:
    fit, optimal = fit_grid(rows, preset.flops_budgets)
    _write_json(study / "results.json", rows)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    w.writerows(rows)

    atomic_write_bytes(study / "results.csv", buf.getvalue().encode("utf-8"))
    _write_json(study / "fit.json", {"law": "bits_per_byte = E + A / N^alpha + B / D^beta",
                                     "N": "non-embedding parameters", "D": "training tokens",
                                     "fit": fit, "compute_optimal": optimal})
    samples = ["| run | eval bits/byte | sample |", "|---|---|---|"]
    samples += [f"| {r['run']} | {r['eval_bits_per_byte']:.3f} | "
                f"{(r['sample'] or '').replace('|', '/').replace(chr(10), ' ')} |" for r in rows]
    atomic_write_bytes(study / "samples.md", ("\n".join(samples) + "\n").encode("utf-8"))

    plot_curves(study, rows, study / "curves.png")
    plot_loss_vs_flops(rows, fit, study / "loss_vs_flops.png")
    return {"rows": rows, "fit": fit, "optimal": optimal,
            "paths": {n: str(study / n) for n in ("results.csv", "results.json", "fit.json", "curves.png",
                                                  "loss_vs_flops.png", "samples.md")}}


def format_table(rows: list[dict]) -> str:
    head = f"{'run':<20}{'N (non-emb)':>12}{'tokens':>11}{'epochs':>7}{'FLOPs':>10}{'wall s':>8}" \
           f"{'train':>7}{'val':>7}{'bits/byte':>10}"
    lines = [head]
    for r in rows:
        lines.append(f"{r['run']:<20}{r['params_nonembed']:>12,}{r['tokens']:>11,}{r['epochs']:>7.2f}"
                     f"{r['flops']:>10.2e}{r['wall_s']:>8.1f}{r['train_loss']:>7.3f}"
                     f"{(r['val_loss'] or math.nan):>7.3f}{r['eval_bits_per_byte']:>10.4f}")
    return "\n".join(lines)
