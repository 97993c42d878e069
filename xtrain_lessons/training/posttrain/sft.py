"""Supervised fine-tuning (T20): teach a pretrained model to answer in a format, from examples.

The standard pipeline is pretrain -> SFT -> RL. SFT is pretraining's loss restricted to the
response: the negative log-likelihood of each response token given the prompt and the response
so far, with the prompt and the padding masked out (batch.py). One optimizer step:

    C = the number of response tokens in the whole batch          (the normalising constant)
    for each micro-batch of the batch:                            (gradient accumulation)
        loss_k = sum_{b,t} -log pi(label) * mask / C;  loss_k.backward()
    clip the gradient norm; AdamW step

Because every micro-batch divides its SUM by the same constant, the accumulated gradient is the
gradient of the whole batch's token mean, however the batch is cut (a micro-batch's own token
mean would weigh the tokens of a short micro-batch more). `sum_k loss_k` is the batch's mean
NLL per response token.

    from xtrain_lessons.training.posttrain.sft import SFTConfig, sft_train
    history = sft_train(model, pairs_ids, SFTConfig(steps=200), on_step=print)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from xtrain_lessons.training.optim import AdamW, clip_grad_norm
from xtrain_lessons.training.posttrain.aggregate import masked_normalize
from xtrain_lessons.training.posttrain.batch import prompt_response_batch
from xtrain_lessons.training.posttrain.logprobs import sequence_logprobs
from xtrain_lessons.training.optim.schedule import lr_at

__all__ = ["SFTConfig", "sft_loss", "sft_step", "sft_train", "check_lengths"]


@dataclass
class SFTConfig:
    """Settings of a fine-tuning run (the defaults fit 2 CPU cores and a small model)."""
    steps: int = 200            # optimizer steps
    batch_size: int = 16        # pairs per optimizer step
    micro_batch: int = 0        # pairs per forward (0: the whole batch); smaller = accumulation
    lr: float = 1e-3            # AdamW peak learning rate (linear warmup, cosine to lr / 10)
    warmup: int = 10            # warmup steps
    weight_decay: float = 0.0
    grad_clip: float = 1.0      # global gradient-norm clip (0: off)
    seed: int = 0               # the order of the pairs

    def validate(self) -> "SFTConfig":
        for name in ("steps", "batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"SFT: {name} must be >= 1, got {getattr(self, name)}")
        if self.micro_batch < 0:
            raise ValueError(f"SFT: micro_batch must be >= 0 (0: the whole batch), got {self.micro_batch}")
        if not self.lr > 0 or self.warmup < 0 or self.weight_decay < 0 or self.grad_clip < 0:
            raise ValueError("SFT: lr must be > 0 and warmup, weight_decay, grad_clip >= 0")
        return self

    def to_dict(self) -> dict:
        return asdict(self)


def sft_loss(logp, mask, constant: float):
    """sum_{b,t} -logp[b, t] * mask[b, t] / constant: a scalar Tensor (logp a Tensor (B, T))."""
    return masked_normalize(-logp, mask, constant)


def sft_step(model, optimizer, pairs, micro_batch: int = 0, pad_id: int = 0, grad_clip: float = 1.0) -> dict:
    """One optimizer step on `pairs` (list of (prompt ids, response ids)), in micro-batches of
    `micro_batch` pairs (0: one). Returns {"loss": mean NLL per response token, "tokens",
    "grad_norm"}."""
    n_tokens = sum(len(r) for _, r in pairs)
    if n_tokens == 0:
        raise ValueError("sft_step: the batch holds no response token")
    size = micro_batch or len(pairs)
    optimizer.zero_grad()
    total = 0.0
    for i in range(0, len(pairs), size):
        chunk = pairs[i:i + size]
        ids, labels, mask = prompt_response_batch([p for p, _ in chunk], [r for _, r in chunk], pad_id=pad_id)
        loss = sft_loss(sequence_logprobs(model, ids, labels), mask, n_tokens)
        loss.backward()
        total += float(loss.item())
    norm = float(clip_grad_norm(model.parameters(), grad_clip)) if grad_clip else None
    optimizer.step()
    return {"loss": total, "tokens": n_tokens, "grad_norm": norm}


def check_lengths(pairs, max_seq_len: int, what: str = "pair") -> None:
    """ValueError naming the first pair longer than the model's context."""
    for i, (p, r) in enumerate(pairs):
        if len(p) + len(r) - 1 > max_seq_len:
            raise ValueError(f"{what} {i + 1} is {len(p) + len(r)} tokens long: the model reads at most "
                             f"{max_seq_len + 1} (max_seq_len + 1); shorten it or drop it")


def sft_train(model, pairs, cfg: SFTConfig, pad_id: int = 0, on_step=None) -> list[dict]:
    """`cfg.steps` SFT steps on `pairs` (list of (prompt ids, response ids)), drawn in epochs
    of a seeded shuffle. `on_step(step, metrics)` is called after each (1-based) step; it may
    return True to stop. Returns the metrics of every step."""
    cfg.validate()
    check_lengths(pairs, model.config.max_seq_len)
    opt = AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay)
    rng = np.random.default_rng(cfg.seed)
    order, pos, history = rng.permutation(len(pairs)), 0, []
    was_training = model.training
    model.train()
    try:
        for step in range(1, cfg.steps + 1):
            take = []
            while len(take) < min(cfg.batch_size, len(pairs)):
                if pos == len(order):
                    order, pos = rng.permutation(len(pairs)), 0
                take.append(int(order[pos]))
                pos += 1
            opt.set_lr(lr_at(step - 1, cfg.lr, cfg.lr / 10, cfg.warmup, cfg.steps))
            m = sft_step(model, opt, [pairs[i] for i in take], cfg.micro_batch, pad_id, cfg.grad_clip)
            m = {"step": step, "lr": opt.lr, **m}
            history.append(m)
            if on_step is not None and on_step(step, m):
                break
    finally:
        model.train(was_training)
    return history
