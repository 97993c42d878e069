"""Optimizers: AdamW (decoupled weight decay) and SGD, gradient clipping, the learning-rate schedule
and fp16 loss scaling (phases T06, T07, T07b, T12b).

A parameter is anything with a ``.data`` array and a ``.grad`` array (or ``None``):
the engine's ``Tensor`` or any stand-in. Updates are done in place on ``.data``, in
the parameter's own dtype, following the arithmetic of ``torch.optim.AdamW`` /
``torch.optim.SGD`` (single-tensor path), so the two agree to rounding (not bit for bit:
one step can differ by an ulp).

AdamW, for a parameter θ with gradient g at step t (1-based, counted per parameter):

    θ ← θ · (1 − lr·λ)                       decoupled weight decay
    m ← m + (1 − β1)·(g − m)                 = β1·m + (1 − β1)·g
    v ← β2·v + (1 − β2)·g²
    θ ← θ − lr/(1 − β1ᵗ) · m / (√v / √(1 − β2ᵗ) + ε)

Parameter groups. ``AdamW(model.named_parameters(), weight_decay=0.1)`` builds two
groups by default: every parameter with 2 or more dimensions (embedding, projections,
lm_head) is decayed; every 1-D parameter (RMSNorm / QK-norm gains, biases) is *not*
decayed, because shrinking a norm gain towards 0 fights the normalisation instead of
regularising the model. Pass ``decay_filter=`` to choose otherwise, a plain list of
parameters (one group, all decayed), or explicit groups::

    AdamW([{"params": {"w": w}, "weight_decay": 0.1}, {"params": {"g": g}, "weight_decay": 0.0}])

State. ``state_dict()`` returns ``{"tensors": {name: array}, "meta": {...}}``: the moment
arrays keyed ``"<param name>.exp_avg"`` / ``".exp_avg_sq"`` (``".momentum_buffer"`` for
SGD) and a JSON-able ``meta`` with the hyper-parameters, group layout and per-parameter
step counts. That is what a checkpoint stores (safetensors + JSON, no pickle).
"""

from xtrain_lessons.training.optim.adamw import AdamW
from xtrain_lessons.training.optim.base import Optimizer, default_decay_filter
from xtrain_lessons.training.optim.clip import clip_grad_norm, global_grad_norm
from xtrain_lessons.training.optim.sgd import SGD

__all__ = ["AdamW", "SGD", "Optimizer", "clip_grad_norm", "global_grad_norm", "default_decay_filter"]
