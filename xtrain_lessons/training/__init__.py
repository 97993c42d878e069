"""Layer 4b, training: from a corpus to a trained run directory.

The settings (`config`), the loop cut into named steps (`loop`), optimizers and clipping
(`optim`, `fused_adamw`), the learning-rate `schedule`, tokenizers (`tokenizer`), tokenised
`data` and corpus downloads (`fetch`), `checkpoint`s, and the run directory (`rundir`: the one
owner of its layout). May import `runtime`, `autograd`, `model` and `parallel`.
"""
