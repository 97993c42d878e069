"""Global-norm gradient clipping (the implementation lives in `xtrain_lessons.optim`).

    norm = clip_grad_norm(model.named_parameters(), max_norm=1.0)   # the norm before clipping

All gradients are scaled by ``max_norm / (norm + 1e-6)`` when that is below 1, exactly as
``torch.nn.utils.clip_grad_norm_``; parameters without a gradient are skipped; a non-finite
norm is returned without touching the gradients so the caller can skip the step.
"""

from .optim import clip_grad_norm, global_grad_norm

__all__ = ["clip_grad_norm", "global_grad_norm"]
