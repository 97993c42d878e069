"""Per-token policy-gradient losses, and the family under one function (T21).

Every loss here returns (B, T) per-token values; `aggregate.py` makes one number of them.
logp (B, T) is a Tensor of log pi_theta(token) (the graph flows through it); each sequence b
carries one advantage A_b.

    naive_pg_loss(logp, A)            l = -A log pi: its gradient is the REINFORCE estimate
                                      (T21 §1), right only for samples of the current policy
    clipped_pg_loss_per_token(logp, old_logp, A, eps)
                                      l = -min(rho A, clip(rho, 1-eps, 1+eps) A), rho = pi/pi_old:
                                      PPO's surrogate, for several updates on one batch of
                                      samples; the gradient of a token stops once its ratio has
                                      left [1-eps, 1+eps] in the direction A pushes it
    k3_kl(logp, ref_logp)             e^(q-p) - (q-p) - 1 >= 0: Schulman's estimator of
                                      KL(pi_theta || pi_ref) per sampled token

The family (`policy_gradient_loss(logp, method, rewards, ...)`, rewards (n_groups, G) in the
order of the batch's rows):

    "no_baseline"   A = r (the raw reward), naive loss
    "reinforce"     A = r - mean of the group (REINFORCE with the group-mean baseline), naive loss
    "grpo_clip"     A = group-normalised (advantages.py), clipped loss
"""

from __future__ import annotations

import numpy as np

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.training.posttrain.advantages import group_advantages
from xtrain_lessons.training.posttrain.logprobs import host

__all__ = ["PG_METHODS", "naive_pg_loss", "clipped_pg_loss_per_token", "k3_kl", "policy_gradient_loss"]

PG_METHODS = ("no_baseline", "reinforce", "grpo_clip")


def _per_sequence(adv, logp: Tensor):
    """The advantages (B,) as a (B, 1) array of logp's dtype, on logp's device."""
    a = host(adv).reshape(-1)
    if a.shape[0] != logp.shape[0]:
        raise ValueError(f"{a.shape[0]} advantages for a batch of {logp.shape[0]} sequences")
    return array_module(logp.data).asarray(a, dtype=logp.dtype)[:, None]


def naive_pg_loss(logp: Tensor, adv) -> Tensor:
    """-A_b log pi(token) at every position: (B, T)."""
    return -(logp * _per_sequence(adv, logp))


def clipped_pg_loss_per_token(logp: Tensor, old_logp, adv, clip_eps: float = 0.2):
    """(-min(rho A, clip(rho) A) (B, T) Tensor, clipped (B, T) bool array: where the gradient
    stopped). Where the two branches are equal the unclipped one is taken (the gradient flows
    inside the range)."""
    xp = array_module(logp.data)
    a = _per_sequence(adv, logp)
    ratio = ops.exp(logp - xp.asarray(host(old_logp), dtype=logp.dtype))
    r = ratio.data
    # the clipped branch is the smaller one exactly where the ratio has left the range in the
    # direction the advantage pushes it: above 1 + eps for A > 0, below 1 - eps for A < 0
    clipped = ((a > 0) & (r > 1 + clip_eps)) | ((a < 0) & (r < 1 - clip_eps))
    bound = xp.where(a > 0, 1 + clip_eps, 1 - clip_eps).astype(logp.dtype)
    surrogate = ops.where(clipped, Tensor(bound * a * xp.ones_like(r)), ratio * a)
    return -surrogate, clipped


def k3_kl(logp: Tensor, ref_logp) -> Tensor:
    """e^(q - p) - (q - p) - 1 per token, p = logp (Tensor), q = ref_logp: (B, T), >= 0."""
    d = array_module(logp.data).asarray(host(ref_logp), dtype=logp.dtype) - logp  # q - p
    return ops.exp(d) - d - 1.0


def policy_gradient_loss(logp: Tensor, method: str, rewards, old_logp=None, clip_eps: float = 0.2,
                         normalize_by_std: bool = True, ddof: int = 1, eps: float = 1e-4):
    """(per-token loss (B, T) Tensor, {"advantages": (B,), "clipped": (B, T) bool}) of one of
    PG_METHODS (module docstring). `rewards` (n_groups, G), rows of the batch in group order;
    `old_logp` (B, T) is needed by "grpo_clip" only."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2 or r.size != logp.shape[0]:
        raise ValueError(f"policy_gradient_loss: rewards must be (n_groups, G) with n_groups * G = "
                         f"{logp.shape[0]} sequences, got shape {r.shape}")
    no_clip = np.zeros(logp.shape, dtype=bool)
    if method == "no_baseline":
        adv = r.reshape(-1)
        return naive_pg_loss(logp, adv), {"advantages": adv, "clipped": no_clip}
    if method == "reinforce":
        adv = group_advantages(r, normalize_by_std=False).reshape(-1)
        return naive_pg_loss(logp, adv), {"advantages": adv, "clipped": no_clip}
    if method == "grpo_clip":
        if old_logp is None:
            raise ValueError("policy_gradient_loss 'grpo_clip' needs old_logp (the sampling policy's log-probs)")
        adv = group_advantages(r, eps, normalize_by_std, ddof).reshape(-1)
        loss, clipped = clipped_pg_loss_per_token(logp, old_logp, adv, clip_eps)
        return loss, {"advantages": adv, "clipped": host(clipped)}
    raise ValueError(f"unknown policy-gradient method {method!r}: choose one of {', '.join(PG_METHODS)}")
