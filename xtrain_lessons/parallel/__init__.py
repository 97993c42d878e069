"""Layer 4a, parallel: several processes training one model.

Collectives over gloo or NCCL (`collectives`), the ring all-reduce built by hand (`ring`),
data-parallel gradients (`ddp`) and the one-process-per-device launcher (`launch`).
May import `runtime`, `autograd` and `model`.
"""
