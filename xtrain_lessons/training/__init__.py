"""Layer 4b, training: from a corpus to a trained run directory, grouped by sub-topic.

    config.py       the run's settings (TrainConfig)
    tokenizer/      the byte-level BPE (pre-tokenize, train, encode/decode, the Hugging Face file) and
                    the tokenizer facade the run uses
    data/           tokenised datasets and their windows, corpus downloads (fetch)
    optim/          AdamW over flat buffers, SGD, clipping, the learning-rate schedule, fp16 loss scaling
    loop/           `train()`: the Trainer's named steps (setup, resume/start, train_step, log, finish),
                    values deferred to logging points, the step as a CUDA graph
    checkpoint/     checkpoints on disk and the state they save and restore
    rundir.py       the run directory (the one owner of its layout and of `load_run`)
    metrics.py      metrics.jsonl and the loss plot;  validation.py  the validation loss and samples

May import `runtime` (the op set, the device, the allocator), `autograd`, `model` and `parallel`.
"""
