"""Post-training (phases T20 and T21): from a pretrained run to one that follows a format and
earns a reward — supervised fine-tuning first, then reinforcement learning with GRPO.

One job per module:

- `batch`: ragged (prompt, response) pairs -> input ids, labels shifted by one, a response mask
- `logprobs`: per-token log-probabilities (one fused node) and per-token entropy of a batch
- `aggregate`: per-token values -> one loss, by a named choice (per-sequence mean, a constant,
  the token mean)
- `advantages`: rewards -> group-normalised advantages (baseline, std or not, ddof)
- `pg_loss`: the per-token policy-gradient losses (naive -A log pi, GRPO's clipped ratio) and
  the family under one function (no baseline, REINFORCE, GRPO)
- `sft`: the supervised fine-tuning step (masked NLL over a constant, gradient accumulation)
- `grpo`: rollouts and one GRPO step
- `arith`: a generated arithmetic task (train and held-out splits, a pretraining text)
- `answers`: the answer parser and the format check of a completion
- `accuracy`: held-out accuracy by greedy decoding
- `rewards`: reward functions by name (word, eos, length, arith, format, your own)
- `pairs`: the JSONL files of prompt / response pairs
- `run_files`, `sft_run`, `post_train`: the run directories `xtrain sft` and `xtrain grpo` write
"""
