"""The training loop: data -> model -> loss -> backward -> clip -> AdamW, with everything around it.

    from xtrain_lessons.training.config import TrainConfig
    from xtrain_lessons.training.loop import train
    result = train(TrainConfig(preset="test", steps=50, data="my.txt", out="runs/demo"))
    result = train(resume="runs/demo", overrides={"steps": 80})     # continue the same run

One step (``step`` counts the optimizer steps already taken, from 0):

    lr   = lr_at(step + 1, max_lr, min_lr, warmup, steps) # warmup, then cosine to min_lr at the end
    x, y = train_data.get_batch(batch_size, seq_len, rng) # random windows, y = x shifted by 1
    loss = model.loss(x, y); loss.backward()
    norm = clip_grad_norm(params, grad_clip)              # global L2 norm, before clipping
    optimizer.step(lr)

With ``dtype="fp16"`` (T12b) the loss is multiplied by the GradScaler's scale before backward,
and ``scaler.unscale_`` (once per optimizer step, all ranks agreeing) divides the gradients
before clipping; a step with an inf/NaN gradient is skipped and the scale halved
(``scaler.update``); ``metrics.jsonl`` gets ``loss_scale`` and ``skipped_steps``. Every record
has ``tokens_per_s`` (all ranks) and ``tokens_per_s_per_rank``.

A run is a short sequence of named steps, the methods of `Trainer`: ``setup`` (process group,
tokenizer, data, model, optimizer), ``resume`` or ``start``, then per step ``train_step``
and, at a logging point, ``log`` (with ``evaluate``, ``sample``, ``checkpoint`` when due),
and ``finish`` (last checkpoint, plot, summary).

Around it: a tqdm bar (loss, lr, tokens/s); every ``eval_every`` steps the validation loss
and perplexity on ``eval_batches`` fixed batches; every ``sample_every`` steps a sample
decoded to text; every ``checkpoint_every`` steps a checkpoint; ``metrics.jsonl`` (one JSON
object per step); ``loss.png``; at the end a summary (``summary.json``). The run directory's
layout is `rundir.RunDir`'s.

The default run (``xtrain train`` with no arguments): the "tiny" preset (2.6M parameters at
the 2048-token vocabulary), 500 steps of 16 × 128 tokens (about 2 passes over the shipped
corpus), AdamW lr 3e-3 → 3e-4 after 30 warmup steps, on every core. The command line gives
this default schedule a time limit (``DEFAULT_RUN_TIME_LIMIT``, 540 s) that stops it early,
with a checkpoint, on a slower or busier machine, so the 10-minute budget holds either way.

Exact resume. Everything random that the *training* trajectory depends on is the one
data Generator, whose ``bit_generator.state`` goes into each checkpoint; evaluation and
sampling use their own, freshly seeded generators. So ``k steps, stop, resume to N`` gives
bit-for-bit the parameters of ``N steps straight`` on the same machine.

Failure handling. A NaN/inf loss or gradient norm stops the run before the bad update is
applied, with a message; nothing is saved, so the last good checkpoint stays ``latest``.
With ``log_every`` N > 1 (the default on a GPU) the step has no host synchronisation: loss
and gradient norm stay on the device, clipping and the finite check run there, and a bad
step's update (and every later one) is skipped on the device; the values are read every N
steps (and before evaluating, sampling or saving), where the run stops the same way, with
the weights of the last good step. On the CPU reading a value is free, so N = 1 there.
Ctrl-C finishes the step in progress, saves a checkpoint and returns cleanly (a second
Ctrl-C aborts at once); SIGTERM (a scheduler, `docker stop`, the launcher) does the same.

A loss spike (``spike_factor`` times the lowest training loss so far) stops the run like a
NaN. Each checkpoint records its loss; ``checkpoints/best`` names the one with the lowest
(validation loss where one was computed at that step, else training loss), which pruning
keeps, and on a divergence ``latest`` is pointed at it, so what a resume continues is from
before the divergence. A run directory has one writer (``rundir.RunLock``); checkpoints record
the run id and config hash, and resume refuses those of another run. A corrupt latest
checkpoint names the previous intact one, which ``from_checkpoint`` resumes.
"""

from xtrain_lessons.training.config import TrainConfig
from xtrain_lessons.training.loop.deferred import TrainingDiverged
from xtrain_lessons.training.loop.report import TrainResult
from xtrain_lessons.training.loop.run import OutOfDeviceMemory, resolve_config, train
from xtrain_lessons.training.loop.trainer import Trainer, make_optimizer

__all__ = ["TrainResult", "train", "TrainingDiverged", "OutOfDeviceMemory", "make_optimizer", "Trainer", "TrainConfig",
           "resolve_config"]
