"""Step values kept on the device until a logging point (T07b), and the divergence they reveal.

With `log_every` N > 1 a step's loss and gradient norm stay device values; every N steps
`PendingSteps.read` reads all of them in ONE host synchronisation (`read_steps`) and turns
them into metric records, or raises `TrainingDiverged` at the first non-finite one.
"""

from __future__ import annotations

import math

import numpy as np

from xtrain_lessons.runtime.device import array_module, to_host

__all__ = ["TrainingDiverged", "PendingSteps", "read_steps"]


class TrainingDiverged(RuntimeError):
    """The loss or the gradient norm became NaN/inf. `records`: the good steps read with it;
    `step`: the steps completed before the bad one."""

    def __init__(self, message: str, records=(), step: int | None = None):
        super().__init__(message)
        self.records, self.step = list(records), step


def _is_number(v) -> bool:
    return v is None or isinstance(v, (int, float))


def read_steps(pending):
    """Read the losses, gradient norms and device-valued extras of the pending steps in ONE host
    synchronisation.

    Returns (good, bad): the steps up to the first non-finite one, with Python floats, and
    that step (None if every value is finite). A gradient norm of None is a step that fp16
    loss scaling skipped (T12b): not a divergence, its norm stays None. On a GPU that is known
    only on the device: an extra "_skipped" (1.0 for a skipped step) says it, and is dropped."""
    if not pending:
        return [], None
    device = [v for p in pending for v in (*p[2:4], *p[6].values()) if not _is_number(v)]
    if device:
        xp = array_module(device[0])
        got = iter(to_host(xp.stack([xp.asarray(v, dtype=np.float64).reshape(()) for v in device])).tolist())
    good = []
    for p in pending:
        loss, norm = (v if _is_number(v) else next(got) for v in p[2:4])
        extra = {k: (v if _is_number(v) else next(got)) for k, v in p[6].items()}
        skipped = p[3] is None or bool(extra.pop("_skipped", 0.0))
        row = (p[0], p[1], loss, None if skipped else norm, p[4], p[5],
               {k: (int(v) if k == "skipped_steps" else v) for k, v in extra.items()})
        if not (math.isfinite(loss) and (skipped or math.isfinite(norm))):
            return good, row
        good.append(row)
    return good, None


class PendingSteps:
    """(step, lr, loss, grad norm, seconds, elapsed) of the steps not yet read on the host,
    and the running numbers read so far (losses, first/last loss, smoothed tokens/s)."""

    def __init__(self, tokens_per_step: int, log_every: int, world: int = 1):
        """`tokens_per_step`: of all ranks together; `world`: the number of ranks."""
        self.tokens_per_step, self.log_every, self.world = tokens_per_step, log_every, world
        self.rows: list[tuple] = []
        self.losses: list[float] = []
        self.first_loss = self.last_loss = self.ema_tps = None

    def add(self, step, lr, loss, grad_norm, seconds, elapsed, extra=None) -> None:
        """`extra`: more fields for the record (T12b fp16: loss_scale, skipped_steps)."""
        self.rows.append((step, lr, loss, grad_norm, seconds, elapsed, extra or {}))

    def read(self) -> list[dict]:
        """The metric records of the pending steps; TrainingDiverged (carrying the good
        records) if one of them was not finite."""
        good, bad = read_steps(self.rows)
        self.rows = []
        recs = [self._record(*row) for row in good]
        if bad is not None:
            step = bad[0] - 1  # the steps from the bad one on were skipped on the device
            what, value = ("loss", bad[2]) if not math.isfinite(bad[2]) else ("gradient norm", bad[3])
            raise TrainingDiverged(
                f"{what} is {value} at step {step} (lr {bad[1]:.3g}): its update and every later "
                f"one were skipped on the device (read at the logging point, log_every "
                f"{self.log_every}); the model holds the weights of step {step} and the last good "
                f"checkpoint is left as it was; lower --max-lr or --grad-clip and resume.",
                records=recs, step=step)
        return recs

    def _record(self, step, lr, loss, grad_norm, seconds, elapsed, extra=None) -> dict:
        tps = self.tokens_per_step / seconds
        self.ema_tps = tps if self.ema_tps is None else 0.9 * self.ema_tps + 0.1 * tps
        self.first_loss = loss if self.first_loss is None else self.first_loss
        self.last_loss = loss
        self.losses.append(loss)
        return {"step": step, "train_loss": round(loss, 6), "lr": lr,
                "grad_norm": None if grad_norm is None else round(grad_norm, 6),
                "tokens_per_s": round(tps, 1), "tokens_per_s_per_rank": round(tps / self.world, 1),
                "tokens": step * self.tokens_per_step,
                "elapsed_s": round(elapsed, 3), **(extra or {})}
