"""A pretrained base model for the arithmetic task, in seconds (T20, T21 and the tests).

    base = arith_base_run("runs/arith-base", steps=150)     # a run directory, like `xtrain train`'s
    model, tok = base.model, base.tokenizer

What it does, in the pipeline's order: write `corpus.txt` (the train split told as sentences,
arith.pretraining_text), train a byte-level BPE on that corpus plus the train split's
responses (the tokenizer is fixed once for the whole pipeline, so the answer tag gets its own
tokens; the base model never reads a tag), then pretrain a small model on the corpus with
`training.loop.train`. The run directory is a normal one: `xtrain sft` and `xtrain sample`
accept it.
"""

from __future__ import annotations

from pathlib import Path

from xtrain_lessons.training.config import TrainConfig
from xtrain_lessons.training.loop import train
from xtrain_lessons.training.posttrain.arith import make_task, pretraining_text
from xtrain_lessons.training.tokenizer import atomic_write_bytes, save_tokenizer, train_tokenizer_from_text

__all__ = ["SMALL", "arith_base_run"]

# a model of the T05 architecture small enough to train in seconds on 2 cores
SMALL = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16, "ffn_dim": 192,
         "max_seq_len": 64}


def arith_base_run(out, steps: int = 150, seed: int = 0, n_docs: int = 2000, vocab_size: int = 400,
                   threads: int = 1):
    """Pretrain the base model of the arithmetic task into run directory `out`; returns
    training.loop's TrainResult (.model, .tokenizer, .run_dir)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train_split, _ = make_task(seed)  # (seed: the split and the corpus; the model's init too)
    corpus = pretraining_text(train_split, n_docs, seed)
    atomic_write_bytes(out / "corpus.txt", corpus.encode("utf-8"))
    tok = train_tokenizer_from_text(corpus + "\n".join(p.response for p in train_split), vocab_size)
    save_tokenizer(tok, out / "base-tokenizer.json")
    cfg = TrainConfig(preset="test", model=dict(SMALL), data=str(out / "corpus.txt"),
                      tokenizer=str(out / "base-tokenizer.json"), steps=steps, batch_size=16, seq_len=64,
                      max_lr=1e-2, min_lr=1e-3, warmup=10, eval_every=0, sample_every=0,
                      checkpoint_every=0, out=str(out / "run"), threads=threads, seed=seed)
    return train(cfg, progress=False, log=lambda line: None)
