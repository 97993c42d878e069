"""Device calls per training step (phase T07b): what a GPU would be asked to do, counted without one.

A small model's step on a GPU is launch-bound: each kernel launch or library call costs a few
microseconds of CPU time however little work it does. So count them before timing them:

    calls = engine_step_calls("tiny", dtype="float32")
    calls.total, calls.host_syncs, calls.by_kind     # e.g. 330, 0, {"kernel": 118, "library": 111, ...}
    calls.bytes                                      # the step's memory traffic (operands + results)
    ops = torch_step_ops(PRESETS["tiny"])
    ops.total, ops.views                             # PyTorch eager's ATen ops for the same step

`engine_step_calls` runs the training loop's own step (training/loop/step.py: forward, backward, the
norm and clip, the optimizer, on the "cuda" device) on the CPU stand-in for CuPy
(cupy_standin), which counts every device call — operators, ufuncs, reductions, copies,
cuBLAS calls, kernel launches — and every host synchronisation, as a GPU would see them, and the
bytes each call reads and writes (every operand and result once: a GPU's memory traffic, which
the batch and the sequence length do scale). The count
does not depend on the batch or the sequence length (one launch per op, whatever its size), so a
small batch (and a small vocabulary) gives the count of a large one; the bytes do scale, so count
those at the shape you estimate. `torch_step_ops` counts the ATen operators PyTorch
eager dispatches for the same model and step (forward, cross-entropy, backward, clip_grad_norm_,
AdamW with foreach=True as on a GPU) with a TorchDispatchMode, on the CPU; about a third of them are
views, which launch nothing on a GPU.
"""

from __future__ import annotations

import collections
import sys
import tempfile
from dataclasses import dataclass, field

import numpy as np

__all__ = ["StepCalls", "engine_step_calls", "torch_step_ops", "VIEW_OPS"]

# ATen ops that return a view (no kernel on a GPU)
VIEW_OPS = {"view", "_unsafe_view", "t", "transpose", "expand", "permute", "reshape", "slice", "select",
            "unsqueeze", "squeeze", "alias", "detach", "as_strided", "split", "split_with_sizes", "unbind",
            "_reshape_alias", "numpy_T", "unflatten"}


@dataclass
class StepCalls:
    total: int                      # device calls (engine) or ATen ops (torch)
    host_syncs: int = 0
    bytes: int = 0                  # engine: memory traffic, each call's operands and result once
    views: int = 0                  # torch: the ops among `total` that only make a view
    by_kind: dict = field(default_factory=dict)    # "kernel", "library", "copy", ... -> n
    by_name: collections.Counter = field(default_factory=collections.Counter)


def engine_step_calls(preset: str = "tiny", batch: int = 2, seq: int = 16, dtype: str = "float32",
                      vocab_size: int | None = None) -> StepCalls:
    """The device calls of one training step of the engine's `preset` model on the "cuda" device
    (the loop's train_step, after a first step), counted on the CuPy stand-in (see the module doc).
    `vocab_size`: a BPE of that size on the shipped stories (for the bytes; the count does not
    depend on it); default: a 300-token vocabulary of a tiny corpus (fast)."""
    from xtrain_lessons import cupy_standin  # noqa: PLC0415
    from xtrain_lessons.runtime import device  # noqa: PLC0415
    from xtrain_lessons.training import loop  # noqa: PLC0415
    from xtrain_lessons.training.data import default_corpus_path  # noqa: PLC0415

    before, override, probed = cupy_standin.install(), device._override, device._gpu_ok
    device._gpu_ok = None  # probe again: the stand-in is a GPU
    device.set_device("cuda")
    counts = []
    real_step = loop.Trainer.train_step

    def counted(self):
        with cupy_standin.counting() as c:
            real_step(self)
        counts.append(c)

    loop.Trainer.train_step = counted
    try:
        with tempfile.TemporaryDirectory(prefix="xtrain-calls-") as tmp:
            corpus = str(default_corpus_path()) if vocab_size else f"{tmp}/corpus.txt"
            if not vocab_size:
                words = np.array(["the", "cat", "sat", "on", "a", "mat", "and", "ran", "to", "sun"])
                rng = np.random.default_rng(0)
                with open(corpus, "w", encoding="utf-8") as f:
                    f.write("\n\n".join(" ".join(rng.choice(words, 40)) for _ in range(200)))
            cfg = loop.TrainConfig(preset=preset, vocab_size=vocab_size or 300, steps=2, batch_size=batch, seq_len=seq,
                                   eval_every=0, sample_every=0, sample_tokens=0, checkpoint_every=0, dtype=dtype,
                                   data=corpus, tokenizer_impl="hf", threads=1, out=f"{tmp}/run", log_every=10)
            loop.train(cfg, progress=False, log=lambda s: None)
    finally:
        loop.Trainer.train_step = real_step
        cupy_standin.uninstall(before)
        device._gpu_ok = probed
        device.set_device(override)
    c = counts[-1]
    kinds = collections.Counter()
    for name, n in c["calls"].items():
        kinds[name.split(":")[0]] += n
    return StepCalls(c["device_calls"], c["host_syncs"], c["bytes"], 0, dict(kinds), c["calls"])


def torch_step_ops(config, batch: int = 2, seq: int = 16, kind: str = "eager", foreach: bool = True) -> StepCalls:
    """The ATen ops PyTorch eager dispatches in one training step of the same model (after a first
    step), counted on the CPU with a TorchDispatchMode. kind: "eager" (composed attention, as the
    engine's) or "sdpa"."""
    import torch  # noqa: PLC0415
    from torch.utils._python_dispatch import TorchDispatchMode  # noqa: PLC0415

    from xtrain_lessons.measure.torch_twin import torch_model  # noqa: PLC0415

    model = torch_model(config, torch, "composed" if kind == "eager" else "sdpa")
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay}, {"params": no_decay, "weight_decay": 0.0}], lr=1e-3,
                            betas=(0.9, 0.95), weight_decay=0.1, foreach=foreach)
    b = torch.from_numpy(np.random.default_rng(0).integers(0, config.vocab_size, (batch, seq + 1)))

    def step():
        logits = model(b[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), b[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=foreach)
        opt.step()

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops[func._schema.name.split("::")[-1]] += 1
            return func(*args, **(kwargs or {}))

    step()
    with Count() as counter:
        step()
    views = sum(n for name, n in counter.ops.items() if name in VIEW_OPS)
    return StepCalls(sum(counter.ops.values()), 0, 0, views, {}, counter.ops)


if __name__ == "__main__":  # python -m xtrain_lessons.measure.device_calls [preset]
    from xtrain_lessons.model.qwen3 import PRESETS  # noqa: PLC0415

    preset = sys.argv[1] if len(sys.argv) > 1 else "tiny"
    if preset not in PRESETS:
        sys.exit(f"usage: python -m xtrain_lessons.measure.device_calls [PRESET]: counts one training step's "
                 f"device calls on the stand-in, in float32, bf16 and fp16 (PRESET one of {', '.join(PRESETS)})")
    c = PRESETS[preset]
    for dt in ("float32", "bf16", "fp16"):
        e = engine_step_calls(preset, dtype=dt)
        print(f"{preset} {dt}: engine {e.total} device calls, {e.host_syncs} host syncs; {dict(e.by_kind)}")
    t = torch_step_ops(c)
    print(f"{preset}: torch eager {t.total} ATen ops ({t.views} views)")
