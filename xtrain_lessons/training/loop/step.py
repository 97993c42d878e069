"""One training step and the loop of them (phase T06; host synchronisations only at logging points: T07b).

    lr   = lr_at(step + 1, max_lr, min_lr, warmup, steps) # warmup, then cosine to min_lr at the end
    x, y = train_data.get_batch(batch_size, seq_len, rng) # random windows, y = x shifted by 1
    loss = model.loss(x, y); loss.backward()
    norm = opt.clip_grad_norm(grad_clip)                  # global L2 norm, before clipping
    opt.step(lr)                                          # the clip factor applied inside

The same step on either device: the optimizer (AdamW over flat buffers) folds the clip, fp16's
unscale and its overflow skip into one factor, computed where the gradients are. On a GPU that
step is captured once per batch shape as a CUDA graph and replayed (loop/cuda_graph.py;
`cuda_graph=False`, `--no-cuda-graph`, keeps it eager): `Trainer.stepper`.
"""

from __future__ import annotations

import math
import sys
import time

from tqdm import tqdm

from xtrain_lessons.parallel.ddp import accumulate_gradients, agree_max, average_scalar, micro_batches
from xtrain_lessons.runtime.device import array_module, default_log_every
from xtrain_lessons.training.loop.cuda_graph import device_stepper
from xtrain_lessons.training.loop.deferred import PendingSteps, TrainingDiverged
from xtrain_lessons.training.optim.schedule import lr_at

__all__ = ["TrainSteps"]


class TrainSteps:
    """The Trainer's loop and step (its state is the Trainer's: see loop/trainer.py)."""

    def loop(self, end: int, sigint: "_SigintDefer") -> None:
        """Steps until `end`, a stop request (`sigint`), the time limit or a divergence."""
        cfg = self.cfg
        # T07b: host synchronisations only at logging points (see TrainConfig.log_every)
        self.log_every = cfg.log_every or default_log_every(self.device)
        self.deferred = self.log_every > 1
        self.healthy = True  # on the device once a deferred step ran: every step so far was finite
        self.pending = PendingSteps(self.tokens_per_step, self.log_every, self.world)  # tokens/s: all ranks
        self.stepper = device_stepper(self)  # the step: eager (device_step), or replayed as a CUDA graph
        # without a progress bar (no terminal: a notebook, a CI log) a line every 1/25 of the run
        self.print_every = max(1, cfg.steps // 25)
        self.bar = tqdm(total=cfg.steps, initial=self.step, disable=not self.progress,
                        dynamic_ncols=True, desc="train", unit="step", file=sys.stderr)
        self.mf = open(self.metrics_path, "a", encoding="utf-8")
        self.looping = True
        try:
            while self.step < end:
                if self._should_stop(sigint) or not self._guarded_step():
                    break
                if self._at_logging_point(end):
                    self.log()
            self._write(self._read_pending())  # stopped between logging points
            self.looping = False  # (left True by an exception: the run failed inside the loop)
        except TrainingDiverged as e:
            self.status, self.message = "diverged", str(e)
        finally:
            self.bar.close()
            self.mf.close()
            self.bar = None

    def _should_stop(self, sigint) -> bool:
        over_time = bool(self.cfg.time_limit) and time.perf_counter() - self.t_start > self.cfg.time_limit
        requested, signum = sigint.requested, sigint.signum or 0  # read once: a handler may run any time
        if self.ddp is not None:  # T17: every rank stops at the same step, naming the same signal
            requested, over_time, signum = agree_max([requested, over_time, signum])
        if requested or over_time:
            self.status = "interrupted" if requested else "time_limit"
            self.signum = int(signum) or None
            return True
        return False

    def _guarded_step(self) -> bool:
        """One step; False when Ctrl-C came before its update (the step never happened)."""
        rng_before = self.rng.bit_generator.state
        self.in_update = False
        try:
            self.train_step()
            return True
        except KeyboardInterrupt:
            self.status = "interrupted"
            if self.in_update:
                self.message = ("interrupted in the middle of an optimizer update: the weights "
                                "are inconsistent, so no checkpoint was written")
                raise
            self.rng.bit_generator.state = rng_before
            return False

    def train_step(self) -> None:
        """lr, batch, forward and backward (micro-batches and all-reduce), clip, update."""
        cfg, step = self.cfg, self.step
        t0 = time.perf_counter()
        # update k = step+1 of 1..steps: warmup ends at k = warmup, min_lr at k = steps
        lr = lr_at(step + 1, cfg.max_lr, cfg.min_lr, cfg.warmup, cfg.steps)
        x, y = self.train_ds.get_batch(cfg.batch_size * cfg.accum_steps * self.world, cfg.seq_len, self.rng)
        self.model.dropout_step = step  # T18: masks keyed by step, so resume redraws them
        self._finish_step(t0, lr, *self.stepper(x, y, lr))

    def device_step(self, x, y, lr, step_scalars=None):
        """The step's work, (loss, gradient norm, extra): forward, backward, clip, update. Deferred
        (T07b) it has no host synchronisation, and it is what loop/cuda_graph.py captures: then x and
        y are checked device buffers and `step_scalars` (AdamW's lr and bias corrections in device
        memory) stands for lr."""
        loss_val = self._forward_backward(x, y, lr)
        extra = {}
        gnorm = self._update(lr, loss_val, extra, step_scalars)
        return loss_val, gnorm, extra

    def _finish_step(self, t0, lr, loss_val, gnorm, extra) -> None:
        self.model.zero_grad()
        dt = time.perf_counter() - t0
        self.train_time += dt
        self.step += 1
        self.pending.add(self.step, lr, loss_val, gnorm, dt, time.perf_counter() - self.t_start, extra)

    def _update(self, lr, loss_val, extra, step_scalars=None):
        """The optimizer's part of the step: the global norm, the clip and fp16's unscale folded into
        one factor over the flat gradient buffer, the update (skipped where fp16's gradients
        overflowed), the loss scale's update (T12b). Deferred (log_every > 1, T07b): nothing is read
        on the host; a non-finite loss or norm skips this update and every later one on the device,
        and is read at the next logging point. Otherwise a non-finite norm stops the run before the
        update. Under DDP the gradients are already averaged: an inf on any rank is an inf on every
        rank, so the ranks skip together. Returns the norm (a device value when deferred)."""
        scaler = self.scaler
        state = scaler.state if scaler is not None else None
        if scaler is not None:
            extra["loss_scale"] = state[0].copy()  # the scale this step used
        gnorm = self.opt.clip_grad_norm(self.cfg.grad_clip, scale_state=state)
        where = None
        if self.deferred:  # T07b: checked on the device, read at the logging point
            xp = array_module(gnorm)
            finite = xp.isfinite(loss_val) if scaler is not None else xp.isfinite(loss_val) & xp.isfinite(gnorm)
            self.healthy = where = self.healthy & finite
        elif scaler is None and not math.isfinite(float(gnorm)):
            raise TrainingDiverged(
                f"gradient norm is {float(gnorm)} at step {self.step} (loss {loss_val:.4f}); "
                f"stopping before the update; the last good checkpoint is intact.")
        self.in_update = True
        self.opt.step(lr, where=where, step_scalars=step_scalars)  # also skipped where fp16 overflowed
        self.in_update = False
        if scaler is not None:
            scaler.update_from(self.opt.last_factors)
            extra["skipped_steps"] = state[2].copy()
            extra["_skipped"] = self.opt.last_factors[2]  # read_steps: a skipped step has no norm
        return gnorm if self.deferred else float(gnorm)

    def _forward_backward(self, x, y, lr: float):
        """The loss of the step (a device value when deferred), gradients in .grad."""
        cfg, model = self.cfg, self.model
        scale = self.scaler.scale if self.scaler is not None else None  # T12b fp16
        if cfg.accum_steps > 1 or self.ddp is not None:  # T16/T08: this rank's micro-batches,
            batches = micro_batches(x, y, cfg.accum_steps, self.rank, self.world)  # one all-reduce at the end
            if self.deferred and self.ddp is None:  # the losses summed on the device (T07b)
                return accumulate_gradients(model, batches, None, scale, sync=False)
            loss_val = average_scalar(accumulate_gradients(model, batches, self.ddp, scale))
            if not self.deferred:  # the same mean on every rank: they all stop together
                self._check_loss(loss_val, lr)
            return loss_val
        loss = model.loss(x, y)
        loss_val = loss.data if self.deferred else float(loss.item())  # .item(): a sync
        if not self.deferred:
            self._check_loss(loss_val, lr)
        model.zero_grad()
        (scale(loss) if scale is not None else loss).backward()
        return loss_val

    def _check_loss(self, loss_val: float, lr: float) -> None:
        """Stop before the update on a non-finite loss or a spike (spike_factor x the lowest)."""
        spike = self.cfg.spike_factor and loss_val > self.cfg.spike_factor * self.min_loss
        if not math.isfinite(loss_val) or spike:
            what = (f"loss {loss_val:.4g} is over {self.cfg.spike_factor:g} x the lowest so far "
                    f"({self.min_loss:.4g})") if math.isfinite(loss_val) else f"loss is {loss_val}"
            raise TrainingDiverged(
                f"{what} at step {self.step} (lr {lr:.3g}); stopping before the update. "
                f"Lower --max-lr or --grad-clip and resume.")
        self.min_loss = min(self.min_loss, loss_val)

    def _at_logging_point(self, end: int) -> bool:
        cfg, step = self.cfg, self.step
        self.at_eval = bool(self.eval_every) and (step % self.eval_every == 0 or step == cfg.steps)
        self.at_sample = bool(cfg.sample_every) and (step % cfg.sample_every == 0 or step == cfg.steps)
        self.at_ckpt = bool(cfg.checkpoint_every) and step % cfg.checkpoint_every == 0
        return not (step % self.log_every and step < end) or self.at_eval or self.at_sample or self.at_ckpt
