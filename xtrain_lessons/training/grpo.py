"""GRPO: post-training a pretrained model towards a reward (phase T20).

Group-relative policy optimisation (DeepSeekMath, 2024) is PPO without a value network: the
baseline of a completion is the mean reward of the other completions of the same prompt.

One step of `grpo_step`:

    for each prompt:  G completions, sampled with the KV cache (`sample_group`)
    rewards r (n_prompts, G)  ->  advantages A = (r - mean_group) / (std_group + eps)
    one no-grad forward of the right-padded batch: old log-probs pi_old(token)  (and of the
        frozen reference model, for the KL penalty)
    inner_steps times:  loss = clipped surrogate (below); backward; clip grad; AdamW

The loss of completion i, token t (ratio rho = pi / pi_old, both at temperature 1):
    l_it = -( min(rho * A_i, clip(rho, 1 - eps, 1 + eps) * A_i) - beta * KL_it )
    KL_it = exp(q - p) - (q - p) - 1         (k3 estimator, p = log pi, q = log pi_ref; >= 0)

Normalisation (the GRPO paper's): the mean over the completion's own tokens, then the mean
over all completions, L = (1/N) sum_i (1/|o_i|) sum_t l_it. Each completion carries ONE
advantage, so each counts once whatever its length: a long completion does not get more say
than a short one with the same advantage, and the loss scale does not depend on how long
the model chooses to talk. (The cost, known since "Dr. GRPO": a wrong long answer is pushed
down less per token than a wrong short one; with the small rewards of this course that bias
is harmless, and the batched-vs-looped gate is exactly this per-sequence mean.)

Only completion tokens count (the prompt is given, not chosen); the end-of-text token that
stopped a completion IS one of its tokens (stopping is an action the reward may judge).
Sequences of different lengths share one right-padded batch: under the causal mask the pads
never reach a real position (T10), and the mask keeps them out of the loss.

    from xtrain_lessons.training.grpo import GRPOConfig, grpo_step
    metrics = grpo_step(model, ref, opt, prompts_ids, prompts_text, reward, tok, cfg, rng)
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor, make_node, no_grad
from xtrain_lessons.model.batching import pad_batch
from xtrain_lessons.model.generate import sample_next
from xtrain_lessons.runtime.device import array_module
from xtrain_lessons.training.optim import clip_grad_norm

__all__ = ["GRPOConfig", "Rollout", "sample_group", "group_advantages", "rollout_batch",
           "token_logprobs", "sequence_logprobs", "clipped_pg_loss", "clipped_pg_loss_looped",
           "masked_mean_per_sequence", "collect_rollouts", "grpo_step", "entropy_of"]


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
    lr: float = 1e-4                # AdamW learning rate (constant)
    weight_decay: float = 0.0
    grad_clip: float = 1.0          # global gradient-norm clip (0: off)
    adv_eps: float = 1e-4           # A = (r - mean) / (std + adv_eps)
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
        if self.kl_coef < 0 or self.lr <= 0:
            raise ValueError("GRPO: kl_coef must be >= 0 and lr > 0")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


# ----- rollouts ---------------------------------------------------------------------------

@dataclass
class Rollout:
    """One sampled completion: `ids` (ending with eos_id when `ended`), its prompt's index."""
    prompt_index: int
    prompt_ids: list
    ids: list
    ended: bool


def sample_group(model, prompt_ids, group: int, max_new_tokens: int, temperature: float = 1.0,
                 top_p: float | None = None, eos_id: int | None = None,
                 rng: np.random.Generator | None = None) -> list:
    """`group` completions of one prompt, decoded together: the prompt is prefilled once for a
    (group, T) KV cache and each step runs the group's next tokens as one (group, 1) batch.

    Returns a list of (ids, ended): ids includes eos_id when the completion stopped there.
    The prompt is cropped from the left so that prompt + completion fit max_seq_len.
    """
    rng = np.random.default_rng() if rng is None else rng
    L = model.config.max_seq_len
    if max_new_tokens >= L:
        raise ValueError(f"max_new_tokens={max_new_tokens} leaves no room for a prompt in "
                         f"max_seq_len={L}")
    prompt = [int(t) for t in prompt_ids][-(L - max_new_tokens):]
    if not prompt:
        raise ValueError("sample_group: the prompt must hold at least one token")
    cache = model.new_cache(batch=group)
    x = np.repeat(np.asarray([prompt], dtype=np.int64), group, axis=0)  # (G, Tp)
    logits = _host(model.forward_cached(x, cache, 0)[:, -1])  # (G, V)
    out = [[] for _ in range(group)]
    done = np.zeros(group, dtype=bool)
    for step in range(max_new_tokens):
        nxt = np.zeros(group, dtype=np.int64)
        for g in range(group):
            if not done[g]:
                nxt[g] = sample_next(logits[g], temperature, None, top_p, rng)
                out[g].append(int(nxt[g]))
                done[g] = eos_id is not None and nxt[g] == eos_id
        if done.all() or step == max_new_tokens - 1:
            break
        # finished rows keep running (their tokens are ignored): one batch shape throughout
        logits = _host(model.forward_cached(nxt[:, None], cache, cache.pos)[:, -1])
    return [(ids, eos_id is not None and bool(ids) and ids[-1] == eos_id) for ids in out]


def _host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") and not isinstance(a, np.ndarray) else np.asarray(a)


def group_advantages(rewards, eps: float = 1e-4) -> np.ndarray:
    """(r - mean) / (std + eps) within each group (row) of `rewards` (n_groups, G).

    std is the population std (ddof 0). A group whose rewards are all equal gets advantages
    0: it says nothing about which completion was better, and it moves nothing."""
    r = np.asarray(rewards, dtype=np.float64)
    if r.ndim != 2:
        raise ValueError(f"group_advantages: rewards must be (n_groups, G), got shape {r.shape}")
    mean = r.mean(axis=1, keepdims=True)
    std = r.std(axis=1, keepdims=True)
    return (r - mean) / (std + eps)


# ----- the batch and its log-probs --------------------------------------------------------

def rollout_batch(rollouts, pad_id: int = 0):
    """Right-padded next-token batch of prompt + completion sequences.

    Returns (ids (B, T), targets (B, T), mask (B, T) float32): position t predicts targets[b, t]
    = token t + 1 of sequence b; mask is 1 where that token is a completion token."""
    seqs = [list(r.prompt_ids) + list(r.ids) for r in rollouts]
    ids, lengths = pad_batch([s[:-1] for s in seqs], pad_id)
    targets, _ = pad_batch([s[1:] for s in seqs], pad_id)
    mask = np.zeros(ids.shape, dtype=np.float32)
    for b, r in enumerate(rollouts):
        start = len(r.prompt_ids) - 1  # the position that predicts the first completion token
        mask[b, start:start + len(r.ids)] = 1.0
    return ids, targets, mask


def token_logprobs(logits, targets) -> Tensor:
    """log softmax(logits)[target] at every position, one node: (B, T, V), (B, T) -> (B, T).

    Backward: d logp / d logits = onehot(target) - softmax(logits)."""
    logits = logits if isinstance(logits, Tensor) else Tensor(logits)
    xp = array_module(logits.data)
    x = logits.data
    if x.dtype != np.float32 and x.dtype != np.float64:
        x = x.astype(np.float32)  # bf16 logits: the log-probs in float32
    t = xp.asarray(targets)
    m = x.max(axis=-1, keepdims=True)
    e = xp.exp(x - m)
    s = e.sum(axis=-1, keepdims=True)
    picked = xp.take_along_axis(x, t[..., None], axis=-1)
    lp = (picked - m - xp.log(s))[..., 0]

    def backward(g):
        gx = -(e / s) * g[..., None]
        idx = t[..., None]
        xp.put_along_axis(gx, idx, xp.take_along_axis(gx, idx, axis=-1) + g[..., None], axis=-1)
        return (gx.astype(logits.dtype, copy=False),)

    return make_node(lp, (logits,), backward, "token_logprobs")


def sequence_logprobs(model, ids, targets) -> Tensor:
    """Token log-probs (B, T) of `targets` under `model`, one batched forward (with a graph
    unless called under no_grad)."""
    return token_logprobs(model(ids), targets)


def entropy_of(logits, mask) -> float:
    """Mean entropy (nats) of the next-token distributions at the masked positions."""
    x = np.asarray(_host(logits), dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    p = np.exp(x)
    p /= p.sum(axis=-1, keepdims=True)
    h = -(p * np.log(np.maximum(p, 1e-300))).sum(axis=-1)
    m = np.asarray(mask, dtype=np.float64)
    return float((h * m).sum() / max(m.sum(), 1.0))


# ----- the loss ---------------------------------------------------------------------------

def masked_mean_per_sequence(values, mask):
    """(1/B) sum_b (1/n_b) sum_t values[b, t] mask[b, t], n_b = sum_t mask[b, t]: the mean over
    each sequence's real tokens, then over the sequences. `values` a Tensor or an array."""
    mask = np.asarray(mask, dtype=np.float64)
    n = mask.sum(axis=1, keepdims=True)
    w = mask / (np.maximum(n, 1.0) * mask.shape[0])  # a row without tokens weighs nothing
    if isinstance(values, Tensor):
        return ops.sum(values * array_module(values.data).asarray(w, dtype=values.dtype))
    return float((np.asarray(values, dtype=np.float64) * w).sum())


def clipped_pg_loss(logp, old_logp, adv, mask, clip_eps: float = 0.2, ref_logp=None,
                    kl_coef: float = 0.0):
    """The GRPO loss (module docstring) of a right-padded batch, and its statistics.

    logp: Tensor (B, T) of the current policy; old_logp, ref_logp: arrays (B, T); adv (B,):
    one advantage per sequence; mask (B, T): 1 on completion tokens.
    Returns (loss Tensor, {"clip_frac", "kl", "ratio_mean"}).
    """
    xp = array_module(logp.data)  # NumPy, or CuPy on a GPU
    old = xp.asarray(_host(old_logp), dtype=logp.dtype)
    a = xp.asarray(_host(adv), dtype=logp.dtype)[:, None]  # (B, 1)
    ratio = ops.exp(logp - old)  # (B, T)
    r = ratio.data
    # min(rho A, clip(rho) A): the clipped branch is a constant (no gradient) exactly where the
    # ratio has left [1 - eps, 1 + eps] in the direction the advantage pushes it
    clipped = ((a > 0) & (r > 1 + clip_eps)) | ((a < 0) & (r < 1 - clip_eps))
    bound = xp.where(a > 0, 1 + clip_eps, 1 - clip_eps).astype(logp.dtype)
    surrogate = ops.where(clipped, Tensor(bound * a * xp.ones_like(r)), ratio * a)
    per_token = -surrogate
    kl_value = 0.0
    if ref_logp is not None:
        d = xp.asarray(_host(ref_logp), dtype=logp.dtype) - logp  # q - p, a Tensor
        kl = ops.exp(d) - d - 1.0  # k3: >= 0, unbiased for KL(pi || pi_ref) under pi
        if kl_coef:
            per_token = per_token + kl * kl_coef
        kl_value = masked_mean_per_sequence(_host(kl.data), mask)
    loss = masked_mean_per_sequence(per_token, mask)
    m = np.asarray(mask) > 0
    clipped, r = _host(clipped), _host(r)
    stats = {"clip_frac": float(clipped[m].mean()) if m.any() else 0.0, "kl": kl_value,
             "ratio_mean": float(r[m].mean()) if m.any() else 1.0}
    return loss, stats


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
    (list of Rollout, rewards (n_prompts, group))."""
    keep = model.config.max_seq_len - cfg.max_new_tokens  # sample_group's crop of the prompt
    rollouts, rewards = [], []
    for p, (text, ids) in enumerate(prompts):
        row = []
        for comp, ended in sample_group(model, ids, cfg.group, cfg.max_new_tokens, cfg.temperature,
                                        cfg.top_p, eos_id, rng):
            rollouts.append(Rollout(p, list(ids)[-keep:], comp, ended))
            row.append(reward(text, decode(comp), len(comp)))
        rewards.append(row)
    return rollouts, np.asarray(rewards, dtype=np.float64)


def grpo_step(model, ref_model, optimizer, prompts, reward, cfg: GRPOConfig,
              rng: np.random.Generator, eos_id: int | None, decode, pad_id: int = 0) -> dict:
    """Sample, score and update once; returns the step's metrics.

    prompts: list of (text, ids) of this step; reward(prompt_text, completion_text, n_tokens)
    -> float (see rewards.py); decode(ids) -> text (end-of-text included as its token text).
    ref_model: the frozen start model for the KL penalty (None: no penalty, KL not measured).
    Metrics: kl is the k3 estimate of KL(sampling policy || reference) on this step's
    completions; clip_frac the fraction of completion tokens clipped in the inner steps after
    the first (the first has ratio 1). The log-probs are taken at temperature 1: with the
    default temperature 1 and no top-p that is exactly the distribution sampled from;
    otherwise the usual approximation.
    """

    t0 = time.perf_counter()
    was_training = model.training
    model.eval()  # dropout (T18) off: the ratio must be 1 before the first update
    rollouts, rewards = collect_rollouts(model, prompts, reward, cfg, rng, eos_id, decode)
    t_sample = time.perf_counter() - t0
    adv = group_advantages(rewards, cfg.adv_eps).reshape(-1)
    ids, targets, mask = rollout_batch(rollouts, pad_id)
    with no_grad():
        logits = model(ids)
        old_logp = token_logprobs(logits, targets).numpy()
        entropy = entropy_of(logits.data, mask)
        ref_logp = None if ref_model is None else sequence_logprobs(ref_model, ids, targets).numpy()
    stats, losses = [], []
    for _ in range(cfg.inner_steps):
        optimizer.zero_grad()
        logp = sequence_logprobs(model, ids, targets)
        loss, st = clipped_pg_loss(logp, old_logp, adv, mask, cfg.clip_eps, ref_logp, cfg.kl_coef)
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
