"""A training step captured once as a CUDA graph and replayed every step after (phase T07).

A small model's GPU step is bound by the host: Python issues 400 to 1,300 launches a step, each
costing tens of microseconds of autograd walk and CuPy dispatch, while the GPU's own work can be
shorter (measured on an H100: the 20m model in bf16 took 30 ms of host time for 23 ms of GPU
work). A CUDA graph records the step's launches once (CuPy's stream capture) and replays all of
them with one call, so a step costs what the GPU needs.

    step = CudaGraphStep(model, opt, max_norm=1.0)   # model on the GPU, opt an AdamW
    loss = step(batch)      # batch (B, T+1) host ints -> the loss, a float32 device scalar
    step.reason             # None while the step is captured; else why it runs eagerly

A graph replays what it recorded: each kernel's arguments by value and every array's address.
So everything that changes from step to step is read from device memory that the host fills
before each replay:
  * the batch: copied into the same two device arrays every step, checked on the host first
    (model/inputs.HostChecked: the model then skips its own check, which would wait for the GPU);
  * AdamW's lr and bias corrections: AdamW.step(step_scalars=...) (adamw_step_graphed);
  * the step's temporaries: allocated during the capture from a memory pool of the graph's own
    that nothing else uses, so their addresses stay the graph's.
Nothing inside the step may copy from the host or wait for the GPU: a capture cannot record
either (the CPU stand-in for CuPy refuses both while it captures, as CUDA does).

The first `warmup` calls run the step eagerly (every kernel compiled, every cache filled). The
next one runs it eagerly from a snapshot of the weights and moments, restores the snapshot,
captures the step and replays it: the two results must agree bit for bit (loss, weights, both
moments), or the step stays eager from then on with the eager result kept, and `reason` says why.
A new batch shape or a new count of valid targets means a new capture. Steps with dropout, fp16
loss scaling or gradient accumulation are not captured here (their state would have to move to
the device too): callers run those eagerly.
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.model.inputs import HostChecked, host_targets
from xtrain_lessons.runtime.device import array_module, capture_graph, set_from_host

__all__ = ["CudaGraphStep"]


class CudaGraphStep:
    """One training step (forward, backward, clip, AdamW) as a replayed CUDA graph; see the module doc."""

    def __init__(self, model, opt, max_norm: float = 1.0, warmup: int = 2, ignore_index: int = -100):
        if model.compute_dtype == "fp16" or model.config.dropout > 0:
            raise ValueError("CudaGraphStep: fp16 loss scaling and dropout keep state on the host; run those "
                             "steps eagerly")
        self.model, self.opt, self.max_norm = model, opt, max_norm
        self.warmup, self.ignore_index = warmup, ignore_index
        self.graph = self.reason = None
        self.calls = 0
        self._key = None  # (batch shape, valid targets) the buffers and the graph were made for

    # -- the step, on the device buffers: what the graph records ---------------------------
    def _body(self):
        m, o = self.model, self.opt
        m.zero_grad()
        loss = m.loss(HostChecked(self._ids), HostChecked(self._targets, self._n_valid), self.ignore_index)
        loss.backward()
        o.clip_grad_norm(self.max_norm)
        o.step(step_scalars=self._scalars)
        return loss.data

    def __call__(self, batch):
        ids, targets, n_valid = self._checked(np.asarray(batch))
        if self._key != (ids.shape, n_valid):  # new buffers, and a new capture once warm
            self._key, self.graph, self._n_valid = (ids.shape, n_valid), None, n_valid
            xp = array_module(self.opt.flat_param)  # the device's buffers, refilled every step
            self._ids = xp.empty(ids.shape, np.int64)
            self._targets = xp.empty(ids.shape, np.int64)
            self._scalars = xp.empty(3, np.float32)
        set_from_host(self._ids, ids)
        set_from_host(self._targets, targets)
        set_from_host(self._scalars, self.opt.next_step_scalars())
        self.calls += 1
        if self.reason is not None or self.calls <= self.warmup:
            return self._body()
        if self.graph is None:
            return self._capture_and_check()
        self.graph.launch()
        self._advance()
        return self._loss

    def _checked(self, batch):
        """(ids, targets) as int64 host arrays and the count of valid targets, checked as the model
        and the loss check them (which they cannot do on device arrays without waiting)."""
        if batch.ndim != 2 or batch.shape[1] < 2 or batch.dtype.kind not in "iu":
            raise ValueError(f"CudaGraphStep: the batch must be (B, T+1) integers, got {batch.dtype} {batch.shape}")
        ids = np.ascontiguousarray(batch[:, :-1], dtype=np.int64)
        targets = np.ascontiguousarray(batch[:, 1:], dtype=np.int64)
        V = self.model.config.vocab_size
        if ids.min() < 0 or ids.max() >= V:
            raise ValueError(f"Model: token ids must lie in [0, {V}), got [{ids.min()}, {ids.max()}]")
        _, n_valid = host_targets(targets, ids.shape, V, self.ignore_index)  # the loss's own check
        return ids, targets, n_valid

    def _advance(self) -> None:
        """The host-side bookkeeping of AdamW.step that a replay does not run."""
        self.opt.step_count += 1

    # -- capture, replay once, compare with the eager step -------------------------------
    def _state(self):
        o = self.opt
        return (o.flat_param, o.flat_exp_avg, o.flat_exp_avg_sq)

    def _capture_and_check(self):
        o = self.opt
        xp = array_module(o.flat_param)
        before = [a.copy() for a in self._state()]
        step0 = o.step_count
        eager_loss = self._body().copy()
        eager = [a.copy() for a in self._state()]
        eager_factors = o.last_factors  # [norm, clip factor, skip] of the eager step
        for a, b in zip(self._state(), before):
            a[...] = b
        o.step_count = step0
        try:
            self._loss, self.graph = self._capture()
            self.graph.launch()
            o.step_count = step0
            self._advance()
            differs = [name for name, a, b in zip(("loss", "weights", "exp_avg", "exp_avg_sq"),
                                                  (self._loss, *self._state()), (eager_loss, *eager))
                       if not bool(xp.array_equal(a.view(np.uint32), b.view(np.uint32)))]
            if differs:
                self.reason = "the replayed graph differs from the eager step in " + ", ".join(differs)
        except Exception as e:  # noqa: BLE001 - whatever the capture meets, the step goes on eagerly
            self.reason = f"the capture failed: {type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"
        if self.reason is None:
            return self._loss
        self.graph = None  # keep the eager step's result
        for a, b in zip(self._state(), eager):
            a[...] = b
        o.step_count, o.last_factors = step0 + 1, eager_factors
        return eager_loss

    def _capture(self):
        """(the loss array the graph writes, the graph): the step recorded on a stream of its own,
        its temporaries from a memory pool of its own (device.capture_graph)."""
        loss, graph, self._keep = capture_graph(self._body)
        return loss, graph
