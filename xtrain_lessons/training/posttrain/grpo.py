"""GRPO: post-training a model towards a reward (phase T21).

Group-relative policy optimisation (DeepSeekMath, 2024) is PPO without a value network: the
baseline of a completion is the mean reward of the other completions of the same prompt.

One step of `grpo_step`:

    for each prompt:  G completions, sampled with the KV cache (`sample_group`)
    rewards r (n_prompts, G)  ->  advantages (advantages.py: r - mean, divided by the std or not)
    the frozen reference model's log-probs of the right-padded batch (for the KL penalty)
    inner_steps times:  a forward (the first one's log-probs are pi_old, and its entropies the
                        step's entropy), per-token loss (pg_loss.py) + beta * KL_k3, aggregated
                        (aggregate.py); backward; clip grad; AdamW

The per-token loss is GRPO's clipped ratio by default (cfg.loss: "no_baseline" and "reinforce"
are the rest of the family), and the aggregation GRPO's mean per completion, then over the
completions (cfg.aggregation: "constant" divides the masked sum by B x max_new_tokens, as Dr.
GRPO does; "token_mean" weighs every token of the batch the same).

Only completion tokens count (the prompt is given, not chosen); the end-of-text token that
stopped a completion IS one of its tokens (stopping is an action the reward may judge).
Sequences of different lengths share one right-padded batch: under the causal mask the pads
never reach a real position (T10), and the mask keeps them out of the loss.

    from xtrain_lessons.training.posttrain.grpo import GRPOConfig, grpo_step
    metrics = grpo_step(model, ref, opt, prompts, reward, cfg, rng, eos_id, decode)
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from xtrain_lessons.autograd.tensor import no_grad
from xtrain_lessons.training.optim import clip_grad_norm
from xtrain_lessons.training.posttrain.aggregate import AGGREGATIONS, aggregate
from xtrain_lessons.training.posttrain.logprobs import (
    host,
    sequence_logprobs,
    token_entropy,
    token_logprobs,
)
from xtrain_lessons.training.posttrain.pg_loss import (
    PG_METHODS,
    clipped_pg_loss_per_token,
    k3_kl,
    policy_gradient_loss,
)
from xtrain_lessons.training.posttrain.rollouts import Rollout, rollout_batch, sample_batch

__all__ = ["GRPOConfig", "clipped_pg_loss", "grpo_loss", "clipped_pg_loss_looped", "collect_rollouts",
           "grpo_step"]


@dataclass
class GRPOConfig:
    """Settings of a GRPO run (the defaults fit 2 CPU cores and the `tiny` model)."""
    steps: int = 60                 # GRPO steps (each: sample, score, inner_steps updates)
    group: int = 8                  # G: completions per prompt
    prompts_per_step: int = 2       # prompts per step (batch = prompts_per_step * group)
    max_new_tokens: int = 48        # completion length limit (stops earlier at end-of-text)
    temperature: float = 1.0        # sampling temperature of the rollouts
    top_p: float | None = None      # nucleus sampling of the rollouts (None: off)
    clip_eps: float = 0.2           # PPO clip: the ratio is kept in [1 - eps, 1 + eps]
    kl_coef: float = 0.05           # beta of the k3 KL penalty to the frozen start model (0: off)
    inner_steps: int = 2            # optimizer steps on each batch of rollouts
    lr: float = 1e-4                # AdamW learning rate (after the warmup)
    warmup: int = 0                 # steps of linear lr warmup: Adam's first steps move every
                                    # weight by ~lr whatever its gradient's size (noise included)
    weight_decay: float = 0.0
    grad_clip: float = 1.0          # global gradient-norm clip (0: off)
    adv_eps: float = 1e-4           # A = (r - mean) / (std + adv_eps)
    loss: str = "grpo_clip"         # pg_loss.PG_METHODS: no_baseline, reinforce, grpo_clip
    aggregation: str = "sequence_mean"  # aggregate.AGGREGATIONS (constant: B x max_new_tokens)
    normalize_by_std: bool = True   # divide the advantages by the group's std (Dr. GRPO: False)
    ddof: int = 1                   # the std's estimator: 1 sample (torch.std), 0 population
    seed: int = 0                   # sampling and prompt order

    def validate(self) -> "GRPOConfig":
        for name in ("steps", "group", "prompts_per_step", "max_new_tokens", "inner_steps"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"GRPO: {name} must be >= 1, got {getattr(self, name)}")
        if self.group < 2:
            raise ValueError("GRPO: group must be >= 2 (the baseline is the group's mean reward)")
        if not self.temperature > 0:
            raise ValueError(f"GRPO: temperature must be > 0, got {self.temperature}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"GRPO: top_p must be in (0, 1], got {self.top_p}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"GRPO: clip_eps must be in (0, 1), got {self.clip_eps}")
        if self.kl_coef < 0 or self.lr <= 0 or self.warmup < 0:
            raise ValueError("GRPO: kl_coef and warmup must be >= 0 and lr > 0")
        if self.loss not in PG_METHODS:
            raise ValueError(f"GRPO: loss must be one of {', '.join(PG_METHODS)}, got {self.loss!r}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"GRPO: aggregation must be one of {', '.join(AGGREGATIONS)}, got {self.aggregation!r}")
        if self.ddof not in (0, 1):
            raise ValueError(f"GRPO: ddof must be 0 (population std) or 1 (sample std), got {self.ddof}")
        return self

    def lr_at(self, step: int) -> float:
        """The learning rate of (1-based) step `step`: linear warmup, then constant."""
        return self.lr * min(1.0, step / self.warmup) if self.warmup else self.lr

    def to_dict(self) -> dict:
        return asdict(self)


# ----- the loss ---------------------------------------------------------------------------

def _finish(per_token, logp, mask, ref_logp, kl_coef, aggregation, constant, clipped, ratio_of):
    """Add beta * KL, aggregate; the statistics of the batch's real tokens."""
    kl_value = 0.0
    if ref_logp is not None:
        kl = k3_kl(logp, ref_logp)
        if kl_coef:
            per_token = per_token + kl * kl_coef
        kl_value = aggregate(host(kl.data), mask, aggregation, constant)
    loss = aggregate(per_token, mask, aggregation, constant)
    m = np.asarray(mask) > 0
    clipped, r = host(clipped), ratio_of()
    stats = {"clip_frac": float(clipped[m].mean()) if m.any() else 0.0, "kl": kl_value,
             "ratio_mean": float(r[m].mean()) if m.any() else 1.0}
    return loss, stats


def clipped_pg_loss(logp, old_logp, adv, mask, clip_eps: float = 0.2, ref_logp=None,
                    kl_coef: float = 0.0, aggregation: str = "sequence_mean", constant=None):
    """GRPO's loss of a right-padded batch from given advantages, and its statistics.

    logp: Tensor (B, T) of the current policy; old_logp, ref_logp: arrays (B, T); adv (B,):
    one advantage per sequence; mask (B, T): 1 on completion tokens.
    Returns (loss Tensor, {"clip_frac", "kl", "ratio_mean"}).
    """
    per_token, clipped = clipped_pg_loss_per_token(logp, old_logp, adv, clip_eps)
    ratio = lambda: np.exp(host(logp.data).astype(np.float64) - host(old_logp))  # noqa: E731
    return _finish(per_token, logp, mask, ref_logp, kl_coef, aggregation, constant, clipped, ratio)


def grpo_loss(logp, old_logp, rewards, mask, cfg: GRPOConfig, ref_logp=None):
    """The loss `grpo_step` minimises: cfg.loss's per-token loss of the group rewards
    (n_groups, G), + cfg.kl_coef * KL, aggregated by cfg.aggregation (constant:
    B x max_new_tokens). Returns (loss Tensor, stats)."""
    per_token, st = policy_gradient_loss(logp, cfg.loss, rewards, old_logp, cfg.clip_eps,
                                         cfg.normalize_by_std, cfg.ddof, cfg.adv_eps)
    ratio = lambda: np.exp(host(logp.data).astype(np.float64) - host(old_logp))  # noqa: E731
    return _finish(per_token, logp, mask, ref_logp, cfg.kl_coef, cfg.aggregation,
                   logp.shape[0] * cfg.max_new_tokens, st["clipped"], ratio)


def clipped_pg_loss_looped(model, rollouts, old_logp, adv, clip_eps: float = 0.2,
                           ref_logp=None, kl_coef: float = 0.0):
    """The reference: sum over sequences s of (1/N) * loss_s, one forward per sequence.
    old_logp / ref_logp: lists of per-sequence arrays (1, T_s)."""
    total = None
    for s, r in enumerate(rollouts):
        ids, targets, mask = rollout_batch([r])
        logp = sequence_logprobs(model, ids, targets)
        ref = None if ref_logp is None else ref_logp[s]
        loss_s, _ = clipped_pg_loss(logp, old_logp[s], np.asarray(adv)[s:s + 1], mask,
                                    clip_eps, ref, kl_coef)
        term = loss_s * (1.0 / len(rollouts))
        total = term if total is None else total + term
    return total


# ----- one step ---------------------------------------------------------------------------

def collect_rollouts(model, prompts, reward, cfg: GRPOConfig, rng: np.random.Generator,
                     eos_id: int | None, decode) -> tuple:
    """cfg.group completions of each prompt (list of (text, ids)) and their rewards:
    (list of Rollout, prompt-major; rewards (n_prompts, group)). The prompts of one token
    length are decoded together, each repeated cfg.group times (`sample_batch`)."""
    keep = model.config.max_seq_len - cfg.max_new_tokens  # sample_batch's crop of the prompt
    cropped = [list(ids)[-keep:] for _, ids in prompts]
    by_length = {}
    for p, ids in enumerate(cropped):
        by_length.setdefault(len(ids), []).append(p)
    completions = [None] * len(prompts)
    for group in by_length.values():
        rows = sample_batch(model, [cropped[p] for p in group for _ in range(cfg.group)],
                            cfg.max_new_tokens, cfg.temperature, cfg.top_p, eos_id, rng)
        for k, p in enumerate(group):
            completions[p] = rows[k * cfg.group:(k + 1) * cfg.group]
    rollouts, rewards = [], []
    for p, (text, _) in enumerate(prompts):
        rollouts += [Rollout(p, cropped[p], comp, ended) for comp, ended in completions[p]]
        rewards.append([reward(text, decode(comp), len(comp)) for comp, _ in completions[p]])
    return rollouts, np.asarray(rewards, dtype=np.float64)


def grpo_step(model, ref_model, optimizer, prompts, reward, cfg: GRPOConfig,
              rng: np.random.Generator, eos_id: int | None, decode, pad_id: int = 0) -> dict:
    """Sample, score and update once; returns the step's metrics.

    prompts: list of (text, ids) of this step; reward(prompt_text, completion_text, n_tokens)
    -> float (see rewards.py); decode(ids) -> text (end-of-text included as its token text).
    ref_model: the frozen start model for the KL penalty (None: no penalty, KL not measured).
    Metrics: kl is the k3 estimate of KL(sampling policy || reference) on this step's
    completions; clip_frac the fraction of completion tokens clipped in the inner steps after
    the first (the first has ratio 1); entropy the mean entropy of the completion positions.
    The log-probs are taken at temperature 1: with the default temperature 1 and no top-p
    that is exactly the distribution sampled from; otherwise the usual approximation.
    """
    t0 = time.perf_counter()
    was_training = model.training
    model.eval()  # dropout (T18) off: the ratio must be 1 before the first update
    rollouts, rewards = collect_rollouts(model, prompts, reward, cfg, rng, eos_id, decode)
    t_sample = time.perf_counter() - t0
    ids, targets, mask = rollout_batch(rollouts, pad_id)
    if ref_model is not None:
        with no_grad():
            ref_logp = sequence_logprobs(ref_model, ids, targets).numpy()
    else:
        ref_logp = None
    stats, losses = [], []
    for k in range(cfg.inner_steps):
        optimizer.zero_grad()
        logits = model(ids)
        logp = token_logprobs(logits, targets)
        if k == 0:  # the weights that sampled: this forward's log-probs ARE pi_old (no extra forward)
            old_logp = logp.numpy().copy()
            entropy = aggregate(host(token_entropy(logits.data)), mask, "token_mean")
        loss, st = grpo_loss(logp, old_logp, rewards, mask, cfg, ref_logp)
        loss.backward()
        if cfg.grad_clip:
            clip_grad_norm(model.parameters(), cfg.grad_clip)
        optimizer.step()
        stats.append(st)
        losses.append(float(loss.item()))
    model.train(was_training)
    lens = [len(r.ids) for r in rollouts]
    return {
        "reward_mean": float(rewards.mean()), "reward_std": float(rewards.std()),
        "kl": stats[0]["kl"] if ref_model is not None else None,
        "clip_frac": float(np.mean([s["clip_frac"] for s in stats[1:]])) if len(stats) > 1 else 0.0,
        "entropy": entropy, "loss": losses[0], "len_mean": float(np.mean(lens)),
        "ended_frac": float(np.mean([r.ended for r in rollouts])),
        "sample_s": t_sample, "step_s": time.perf_counter() - t0,
        "_rollouts": rollouts, "_rewards": rewards,
    }
