"""The logging point of a run and its end: metrics, evaluation, a sample, checkpoints, the summary
(phase T06).
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from xtrain_lessons.parallel import collectives
from xtrain_lessons.training.checkpoint import CheckpointWriteError, is_disk_full, latest_checkpoint, save_checkpoint, \
    set_pointer, step_dir_name
from xtrain_lessons.training.loop.deferred import TrainingDiverged
from xtrain_lessons.training.metrics import last_sample, plot_metrics, read_metrics
from xtrain_lessons.training.validation import evaluate, sample_text

__all__ = ["ReportSteps", "TrainResult"]


@dataclass
class TrainResult:
    run_dir: Path
    step: int                       # optimizer steps completed
    status: str                     # "done", "interrupted", "diverged", "stopped", "time_limit"
    model: Any
    optimizer: Any
    tokenizer: Any
    summary: dict
    losses: list = field(default_factory=list)


class ReportSteps:
    """The Trainer's logging point and finish (its state is the Trainer's: see loop/trainer.py)."""

    def log(self) -> None:
        """Read the pending steps (one host synchronisation), evaluate, sample, checkpoint."""
        recs = self._read_pending()
        if self.at_eval:  # recs[-1] is this step's record
            self.evaluate(recs[-1])
        self._write(recs)
        if self.at_sample:
            self.say(f"sample @ {self.step}: {self.sample(self.step)!r}")
        if self.at_ckpt:
            self.checkpoint()

    def _read_pending(self) -> list[dict]:
        """The records of the pending steps, read in one host synchronisation; on a
        divergence the good ones are written and the step set back before it propagates."""
        try:
            recs = self.pending.read()
        except TrainingDiverged as e:
            self.step = e.step
            self._write(e.records)
            raise
        if recs:
            self.bar.update(len(recs))
            self.bar.set_postfix_str(f"loss {self.pending.last_loss:.3f} lr {recs[-1]['lr']:.2e} "
                                     f"{self.pending.ema_tps:,.0f} tok/s")
            if not self.progress and not self.at_eval and any(r["step"] % self.print_every == 0 for r in recs):
                self.say(f"step {self.step:>6}/{self.cfg.steps}: train loss {self.pending.last_loss:.4f}  "
                         f"lr {recs[-1]['lr']:.2e}  {self.pending.ema_tps:,.0f} tok/s")
        return recs

    def _write(self, recs: list[dict]) -> None:
        self.mf.write("".join(json.dumps(r) + "\n" for r in recs))
        self.mf.flush()

    def evaluate(self, rec: dict) -> None:
        cfg = self.cfg
        self.last_val = evaluate(self.model, self.val_ds, cfg.batch_size, cfg.seq_len, cfg.eval_batches,
                                 cfg.seed + 1_000_003)
        self.val_step = self.step
        rec["val_loss"] = round(self.last_val, 6)
        rec["val_ppl"] = round(math.exp(min(self.last_val, 50.0)), 3)
        tps = self.pending.ema_tps
        speed = (f"{tps:,.0f} tok/s" if self.world == 1 else  # T17: as the seed's DDP logs show both
                 f"{tps / self.world:,.0f} tok/s per rank, {tps:,.0f} global")
        self.say(f"step {self.step:>6}: train loss {self.pending.last_loss:.4f}  val loss {self.last_val:.4f}  "
                 f"val ppl {rec['val_ppl']:.2f}  lr {rec['lr']:.2e}  {speed}")

    def sample(self, at_step: int) -> str:
        if self.rank:
            return ""
        cfg = self.cfg
        text = sample_text(self.model, self.tok, cfg.sample_prompt, cfg.sample_tokens, cfg.sample_temperature,
                           cfg.sample_top_k, seed=cfg.seed + at_step)
        with open(self.samples_path, "a", encoding="utf-8") as f:
            f.write(f"--- step {at_step}\n{text}\n")
        return text

    def checkpoint(self) -> None:
        self.last_ckpt = self.step
        if self.rank:
            return
        cfg, root, name = self.cfg, self.dir.checkpoints, step_dir_name(self.step)
        evaluated = getattr(self, "val_step", None) == self.step and self.last_val is not None
        score = self.last_val if evaluated else self.pending.last_loss
        try:
            save_checkpoint(root, self.step, self.model, self.opt, train_config=cfg.to_dict(),
                            rng=self.rng, tokenizer_hash=self.tok_hash, keep_last=cfg.keep_checkpoints or None,
                            data_position=None, run_id=self.run_id, config_hash=self.cfg_hash,
                            keep=(self.best[1],) if self.best else (),
                            extra={"score": score, "score_is": "val_loss" if evaluated else "train_loss",
                                   **({"grad_scaler": self.scaler.state_dict()} if self.scaler is not None else {})})
        except Exception as e:
            if not is_disk_full(e):
                raise
            prev = latest_checkpoint(root)
            raise CheckpointWriteError(
                f"no space left on device writing checkpoint {name} to {root}: nothing of it was kept, "
                f"`latest` still names {prev.name if prev else 'no checkpoint'}; free some space, then "
                f"`xtrain train --resume {self.dir.path}`") from None
        if score is not None and math.isfinite(score) and (self.best is None or score <= self.best[0]):
            self.best = (score, name)
            set_pointer(root, "best", name)

    # ----- finish --------------------------------------------------------------------------
    def finish(self) -> TrainResult:
        """The last checkpoint, the plot, a final sample, summary.json; leave the group."""
        self._final_checkpoint()
        metrics = read_metrics(self.metrics_path)
        final_sample = None
        if self.status != "diverged" and self.step > 0 and not self.rank:
            try:
                plot_metrics(metrics, self.dir.loss_plot, title=f"{self.dir.path.name}: {self.cfg.preset}, "
                             f"{self.model.n_params() / 1e6:.2f}M params")
            except Exception as e:  # noqa: BLE001 - a plot must never lose a run
                self.say(f"(loss plot skipped: {e})")
            if self.cfg.sample_tokens > 0 and not (self.cfg.sample_every and self.step % self.cfg.sample_every == 0):
                final_sample = self.sample(self.step)
        summary = self._summary(metrics, final_sample)
        if not self.rank:
            self.dir.write_summary(summary)
        if self.status != "diverged":
            self._say_summary(summary, final_sample)
        if self.dp is not None and not self.group_existed:
            # leave the group together: a rank whose process exits while gloo's group is still
            # alive (and a peer still talking) can abort in the C++ teardown
            collectives.barrier()
            collectives.destroy()
        return TrainResult(run_dir=self.dir.path, step=self.step, status=self.status, model=self.model,
                           optimizer=self.opt, tokenizer=self.tok, summary=summary,
                           losses=self.pending.losses)

    def _final_checkpoint(self) -> None:
        step = self.step
        if self.status == "diverged":
            self.say(f"TRAINING STOPPED: {self.message}")
            self._latest_to_best()
            return
        if self.last_ckpt != step and step > 0:
            self.checkpoint()
        if self.status == "done" and step < self.cfg.steps:
            self.status = "stopped"
        if self.status == "interrupted":
            by = f" by {signal.Signals(self.signum).name}" if self.signum else ""
            self.say(f"interrupted{by}: checkpoint saved at step {step}; continue with "
                     f"`xtrain train --resume {self.dir.path}`")
        if self.status == "time_limit":
            self.say(f"time limit reached at step {step}; checkpoint saved")

    def _latest_to_best(self) -> None:
        """After a divergence `latest` names the best checkpoint (lowest loss), from before it."""
        root = self.dir.checkpoints
        latest = latest_checkpoint(root) if not self.rank else None
        if latest is None or self.best is None or self.best[1] == latest.name:
            return
        set_pointer(root, "latest", self.best[1])
        self.say(f"latest now names {self.best[1]} (loss {self.best[0]:.4f}), the best checkpoint "
                 f"saved before the divergence; {latest.name} is kept beside it")

    def _summary(self, metrics: list[dict], final_sample) -> dict:
        run_losses = [m["train_loss"] for m in metrics if "train_loss" in m]
        val_losses = [m["val_loss"] for m in metrics if m.get("val_loss") is not None]
        p = self.pending
        return {
            "status": self.status, "message": self.message, "step": self.step, "steps": self.cfg.steps,
            "n_params": self.model.n_params(), "tokens_seen": self.step * self.tokens_per_step,
            "loss_first": run_losses[0] if run_losses else p.first_loss,
            "loss_last": run_losses[-1] if run_losses else p.last_loss,
            "loss_last_mean10": float(np.mean(run_losses[-10:])) if run_losses else None,
            "val_loss": val_losses[-1] if val_losses else self.last_val,
            "val_ppl": math.exp(min(val_losses[-1], 50.0)) if val_losses else None,
            "wall_s_this_session": round(time.perf_counter() - self.t_start, 2),
            "train_s_this_session": round(self.train_time, 2),
            "tokens_per_s_this_session": (round(len(p.losses) * self.tokens_per_step / self.train_time, 1)
                                          if self.train_time else None),
            "sample": final_sample if final_sample is not None else last_sample(self.samples_path),
        }

    def _say_summary(self, summary: dict, final_sample) -> None:
        lf, ll = summary["loss_first"], summary["loss_last_mean10"]
        self.say(f"summary: {self.status} at step {self.step}/{self.cfg.steps}"
                 + (f"; train loss {lf:.3f} -> {ll:.3f} (mean of last 10)" if lf is not None else "; no step taken")
                 + (f"; val loss {summary['val_loss']:.3f} (ppl {summary['val_ppl']:.1f})"
                    if summary["val_loss"] is not None and summary["val_ppl"] is not None else "")
                 + f"; {summary['wall_s_this_session']:.0f}s, "
                 f"{summary['tokens_per_s_this_session'] or 0:,.0f} tok/s; run dir {self.dir.path}")
        if final_sample:
            self.say(f"final sample: {final_sample!r}")
