"""The training step captured once as a CUDA graph and replayed every step after (phase T07b).

A small model's GPU step is bound by the host: Python issues 400 to 1,300 launches a step, each
costing tens of microseconds of autograd walk and CuPy dispatch, while the GPU's own work can be
shorter (measured on an H100: the 20m model in bf16 took 30 ms of host time for 23 ms of GPU
work). A CUDA graph records the step's launches once (CuPy's stream capture) and replays all of
them with one call, so a step costs what the GPU needs.

    stepper = device_stepper(trainer)   # the training loop's GPU step: a LoopGraph, or eager with one line why
    loss, norm, extra = stepper(x, y, lr)                 # device values, read at the logging points

    step = CudaGraphStep(model, opt, max_norm=1.0)   # `xtrain bench train --cuda-graph`'s bare step (opt an AdamW)
    loss = step(batch)      # batch (B, T+1) host ints -> the loss, a float32 device scalar
    step.reason             # None while the step is captured; else why it runs eagerly

A graph replays what it recorded: each kernel's arguments by value and every array's address.
So everything that changes from step to step is read from device memory that the host fills
before each replay:
  * the batch: copied into the same device arrays every step, checked on the host first
    (model/inputs.HostChecked: the model then skips its own check, which would wait for the GPU);
  * AdamW's lr and bias corrections: AdamW.step(step_scalars=...) (adamw_step_graphed);
  * dropout's Philox stream: [seed, offset] (model.dropout_key, opset/dropout.DeviceKey), so each
    replay draws new masks;
  * fp16's loss scale, growth count and skipped steps: GradScaler.state, on the device already
    (kernels/grad_scaler.cu updates it in place), and the run's health flag, kept in place;
  * the step's temporaries: allocated during the capture from a memory pool of the graphs' own
    that nothing else uses, so their addresses stay the graphs' (device.capture_graph).
Nothing inside the step may copy from the host or wait for the GPU: a capture cannot record
either (the CPU stand-in for CuPy refuses both while it captures, as CUDA does).

The first `warmup` calls run the step eagerly (every kernel compiled, every cache filled). A
batch shape not seen yet (or another count of valid targets) is then captured: the step runs
eagerly from a snapshot of the state (weights, moments, the loss scale, the health flag), the
snapshot is restored, the step captured and replayed: the two results must agree bit for bit, or
the step stays eager from then on with the eager result kept, and `reason` says why. The graphs
of the last `cache_size` shapes are kept (least recently used dropped first), so shapes that take
turns are captured once each. Between replays the loop runs eagerly (evaluation, sampling,
checkpoints): the graphs update the model's own weights in place, so those see every step.

The loss, the gradient norm and the fp16 counters of a replayed step are copied out of the graph
by one device copy per step (no host synchronisation), and read at the logging points as the eager
step's are. On the CuPy stand-in a capture checks the step's legality (no host copy, no host
synchronisation); by default its graph cannot be replayed and the step goes on eagerly, and inside
`cupy_standin.replaying_graphs()` it replays what it recorded (tests/test_cuda_graph.py).
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.model.inputs import HostChecked, host_targets
from xtrain_lessons.runtime.device import array_module, captures_graphs, set_from_host
from xtrain_lessons.training.loop.graph_cache import GraphCache

__all__ = ["CudaGraphStep", "LoopGraph", "device_stepper", "GraphCache", "CACHE_SIZE"]

CACHE_SIZE = 4  # the training loop keeps the graphs of this many batch shapes


def _checked_ids(ids, V: int):
    """The model's own check of token ids, on the host (it would wait for the GPU on device ids)."""
    if ids.size and (ids.min() < 0 or ids.max() >= V):
        raise ValueError(f"Model: token ids must lie in [0, {V}), got [{ids.min()}, {ids.max()}]")


class CudaGraphStep(GraphCache):
    """`xtrain bench train --cuda-graph`'s step (forward, backward, clip, AdamW) as a replayed CUDA
    graph; see the module doc. float32 and bf16 without dropout: the training loop's LoopGraph also
    captures fp16's loss scaling and dropout."""

    def __init__(self, model, opt, max_norm: float = 1.0, warmup: int = 2, ignore_index: int = -100,
                 cache_size: int = 4):
        if model.compute_dtype == "fp16" or model.config.dropout > 0:
            raise ValueError("CudaGraphStep: the bench's step has no fp16 loss scaling or dropout; run those "
                             "steps eagerly (the training loop's graph, LoopGraph, captures both)")
        super().__init__(array_module(opt.flat_param), warmup, cache_size)
        self.model, self.opt, self.max_norm, self.ignore_index = model, opt, max_norm, ignore_index
        self._scalars = self.xp.empty(3, np.float32)

    def _body(self, entry):
        m, o = self.model, self.opt
        m.zero_grad()
        loss = m.loss(HostChecked(entry.ids), HostChecked(entry.targets, entry.n_valid), self.ignore_index)
        loss.backward()
        o.clip_grad_norm(self.max_norm)
        o.step(step_scalars=self._scalars)
        return (loss.data,)

    def __call__(self, batch):
        ids, targets, n_valid = self._checked(np.asarray(batch))
        entry = self._entry((ids.shape, n_valid), ids.shape)
        entry.n_valid = n_valid
        set_from_host(entry.ids, ids)
        set_from_host(entry.targets, targets)
        set_from_host(self._scalars, self.opt.next_step_scalars())
        self.calls += 1
        if self.reason is not None or self.calls <= self.warmup:
            return self._body(entry)[0]
        return self._run(entry)[0]

    def _checked(self, batch):
        """(ids, targets) as int64 host arrays and the count of valid targets, checked as the model
        and the loss check them (which they cannot do on device arrays without waiting)."""
        if batch.ndim != 2 or batch.shape[1] < 2 or batch.dtype.kind not in "iu":
            raise ValueError(f"CudaGraphStep: the batch must be (B, T+1) integers, got {batch.dtype} {batch.shape}")
        ids = np.ascontiguousarray(batch[:, :-1], dtype=np.int64)
        targets = np.ascontiguousarray(batch[:, 1:], dtype=np.int64)
        V = self.model.config.vocab_size
        _checked_ids(ids, V)
        _, n_valid = host_targets(targets, ids.shape, V, self.ignore_index)  # the loss's own check
        return ids, targets, n_valid

    def _state(self):
        o = self.opt
        return (o.flat_param, o.flat_exp_avg, o.flat_exp_avg_sq)

    def _name(self, i):
        return ("loss", "weights", "exp_avg", "exp_avg_sq")[i]

    def _host(self):
        return self.opt.step_count, self.opt.last_factors

    def _set_host(self, host) -> None:
        self.opt.step_count = host[0]
        self.opt.last_factors = host[1]

    def _after_replay(self, entry) -> None:
        """The host-side bookkeeping of AdamW.step that a replay does not run."""
        self.opt.step_count += 1
        self.opt.last_factors = entry.after[1]


class _Rows(HostChecked):
    """A batch's rows on the device (`data`), checked on the host (`host`: the same values there):
    sliced as gradient accumulation's micro-batches slice a batch, each slice counting its own valid
    targets on the host (`ignore`: the loss's ignore_index; None for token ids)."""

    __slots__ = ("host", "ignore")

    def __init__(self, data, host, ignore=None):
        super().__init__(data, None if ignore is None else int(np.count_nonzero(host != ignore)))
        self.host, self.ignore = host, ignore

    @property
    def shape(self):
        return self.data.shape

    def __getitem__(self, rows):
        return _Rows(self.data[rows], self.host[rows], self.ignore)


class LoopGraph(GraphCache):
    """The training loop's GPU step (`Trainer.device_step`: micro-batches, fp16's loss scale, dropout,
    the clip and AdamW skipped on the device when a value is not finite) captured per batch shape
    and replayed; see the module doc. Called as the loop calls its step: (x, y, lr) -> (loss,
    gradient norm, extra), device values. Its warmup steps, and every step once `reason` is set, are
    the eager step itself."""

    IGNORE = -100  # Model.loss's ignore_index, as the loop calls it

    def __init__(self, trainer, warmup: int = 2, cache_size: int = 4):
        super().__init__(array_module(trainer.opt.flat_param), warmup, cache_size)
        self.t = trainer
        xp, model = self.xp, trainer.model
        self._scalars = xp.empty(3, np.float32)
        self._healthy = xp.ones((), np.bool_)  # the run's health flag, updated in place by the graphs
        self._key = xp.empty(2, np.uint64) if model.config.dropout > 0 else None  # dropout's [seed, offset]
        self._said = False

    def __call__(self, x, y, lr):
        t = self.t
        self.calls += 1
        if self.reason is not None or self.calls <= self.warmup:
            return t.device_step(x, y, lr)  # the eager loop's step, exactly
        V = t.model.config.vocab_size
        _checked_ids(x, V)
        host_targets(y, x.shape, V, self.IGNORE)  # the loss's own check
        valid = tuple(np.count_nonzero(y != self.IGNORE, axis=1).tolist())  # each micro-batch's count follows
        key = (x.shape, valid, t.cfg.accum_steps, t.model.training)
        entry = self._entry(key, x.shape)
        set_from_host(entry.ids, x)
        set_from_host(entry.targets, y)
        self._x, self._y, self._lr = _Rows(entry.ids, x), _Rows(entry.targets, y, self.IGNORE), lr
        self._fill(lr)
        first = entry.graph is None
        outs = self._run(entry)
        if first:
            self._say(x.shape)
        stats = outs[0].copy() if entry.graph is not None else outs[0]  # a replay's values, kept per step
        return stats[0], stats[1], dict(zip(entry.keys, stats[2:]))

    def _run(self, entry):
        self.t.in_update = True  # a replay updates the weights: a second Ctrl-C in it is not a clean stop
        outs = super()._run(entry)
        self.t.in_update = False
        return outs

    def _fill(self, lr) -> None:
        """What the step reads from device memory, for this step (no host synchronisation)."""
        t, o = self.t, self.t.opt
        o.set_lr(lr)
        set_from_host(self._scalars, o.next_step_scalars())
        if t.healthy is True:
            self._healthy.fill(True)
        elif t.healthy is not self._healthy:
            self._healthy[...] = t.healthy
        t.healthy = self._healthy
        if self._key is not None:
            m = t.model
            set_from_host(self._key, np.array([m.dropout_seed, m.dropout_step * 2 * m.config.n_layers], np.uint64))

    def _body(self, entry):
        t, m = self.t, self.t.model
        step0 = m.dropout_step
        if self._key is not None:  # offsets key[1] + (forward within this step) * 2 * n_layers + site
            m.dropout_key, m.dropout_step = self._key, 0
        try:
            loss, norm, extra = t.device_step(self._x, self._y, self._lr, step_scalars=self._scalars)
        finally:
            if self._key is not None:
                m.dropout_key, m.dropout_step = None, step0 + m.dropout_step
        self._healthy[...] = t.healthy  # in place: the next replay reads it there
        t.healthy = self._healthy
        entry.keys = tuple(extra)
        xp = self.xp
        return (xp.stack([xp.asarray(v, dtype=np.float64).reshape(()) for v in (loss, norm, *extra.values())]),)

    def _state(self):
        o, scaler = self.t.opt, self.t.scaler
        extra = (scaler.state,) if scaler is not None and scaler.state is not None else ()
        return (o.flat_param, o.flat_exp_avg, o.flat_exp_avg_sq, self._healthy, *extra)

    def _name(self, i):
        return ("loss, grad norm or fp16 counters", "weights", "exp_avg", "exp_avg_sq", "health flag",
                "loss scale")[i]

    def _host(self):
        return self.t.opt.step_count, self.t.model.dropout_step, self.t.opt.last_factors

    def _set_host(self, host) -> None:
        self.t.opt.step_count = host[0]
        self.t.model.dropout_step, self.t.opt.last_factors = host[1], host[2]
        self.t.healthy = self._healthy

    def _after_replay(self, entry) -> None:
        """What the step does on the host that a replay does not: AdamW's step count and lr (a
        checkpoint saves both), the dropout forwards counted, the factors the loop may read."""
        o, m = self.t.opt, self.t.model
        o.step_count += 1
        o.set_lr(self._lr)
        m.dropout_step += entry.after[1] - entry.before[1]
        o.last_factors = entry.after[2]

    def _say(self, shape) -> None:
        """After a capture: the first that worked says so, the one that did not says why (once: the
        step is eager from then on)."""
        if self.reason is not None:
            self.t.say(f"CUDA graph: off ({self.reason}); the step runs eagerly from step {self.t.step + 1}")
        elif not self._said:
            self._said = True
            self.t.say(f"CUDA graph: the step is captured and replayed (batch {shape[0]} x {shape[1]}; "
                       f"checked bit for bit against the eager step; --no-cuda-graph: eager)")


def device_stepper(trainer):
    """The training loop's step: on a GPU a LoopGraph by default, or the eager step
    (`Trainer.device_step`) where a setting keeps it eager, said in one line; elsewhere (the CPU:
    nothing to capture) the eager step."""
    t, cfg = trainer, trainer.cfg
    if not captures_graphs(t.device):
        return t.device_step
    why = ("--no-cuda-graph" if not cfg.cuda_graph else
           "--log-every 1: the loss is read on the host before every update" if not t.deferred else
           "xtrain launch: the gradients' all-reduce synchronises with the host" if t.ddp is not None else None)
    if why is None:
        return LoopGraph(t, cache_size=CACHE_SIZE)
    t.say(f"CUDA graph: off ({why}); the step runs eagerly")
    return t.device_step
