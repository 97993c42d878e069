"""Learning-rate schedule: linear warmup, then cosine decay to a floor.

    lr(t) = max_lr · t / T_w                                         t < T_w
    lr(t) = min_lr + ½(1 + cos(π (t − T_w)/(T_c − T_w)))·(max_lr − min_lr)   T_w ≤ t ≤ T_c
    lr(t) = min_lr                                                   t > T_c

``t`` is the 0-based index of the optimizer step about to be taken; ``T_w`` the number of
warmup steps and ``T_c`` the step at which the cosine reaches ``min_lr`` (the CS336
convention: ``cosine_steps`` counts from step 0, warmup included).
"""

from __future__ import annotations

import math

__all__ = ["lr_at", "WarmupCosine"]


def lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, cosine_steps: int) -> float:
    """The learning rate at ``step`` under linear warmup + cosine decay (see module doc)."""
    if warmup_steps > 0 and step < warmup_steps:
        return max_lr * step / warmup_steps
    if step > cosine_steps or cosine_steps <= warmup_steps:
        return float(min_lr)
    frac = (step - warmup_steps) / (cosine_steps - warmup_steps)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * frac)) * (max_lr - min_lr)


class WarmupCosine:
    """The schedule as an object: ``sched(step) -> lr``."""

    def __init__(self, max_lr: float, min_lr: float, warmup_steps: int, cosine_steps: int):
        self.max_lr, self.min_lr = float(max_lr), float(min_lr)
        self.warmup_steps, self.cosine_steps = int(warmup_steps), int(cosine_steps)

    def __call__(self, step: int) -> float:
        return lr_at(step, self.max_lr, self.min_lr, self.warmup_steps, self.cosine_steps)

    def __repr__(self) -> str:
        return (f"WarmupCosine(max_lr={self.max_lr}, min_lr={self.min_lr}, "
                f"warmup_steps={self.warmup_steps}, cosine_steps={self.cosine_steps})")
