"""Memory accounting of a training step (phase T11): what a step keeps alive, by category.

    from xtrain_lessons.measure.memory_report import memory_report, fmt_bytes
    r = memory_report(model, AdamW(model.named_parameters()), (ids, targets))
    print({k: fmt_bytes(v) for k, v in r.items()})

memory_report(model, optimizer, batch) -> dict of bytes: parameters, gradients,
    optimizer_state, activations, total (the peak of a step: all four are alive when the
    backward starts), measured on one forward/backward of `batch` = (ids, targets).
"""

from __future__ import annotations

from xtrain_lessons.model.recompute import saved_bytes
from xtrain_lessons.runtime.allocator import fmt_bytes

__all__ = ["memory_report", "fmt_bytes"]


def _nbytes(a) -> int:
    return int(a.nbytes) if a is not None else 0


def memory_report(model, optimizer, batch) -> dict:
    """Bytes of a training step by category, measured on one forward + backward of `batch`.

    model: anything with `named_parameters()` and `loss(ids, targets)`; optimizer: an
    `optim.Optimizer` (its `slots` give the state per parameter: AdamW keeps 2 arrays of the
    parameter's shape and dtype, SGD with momentum 1); batch: (ids, targets).

        parameters       sum of the parameters' bytes
        gradients        the bytes of the gradients the backward produces (one per parameter
                         that gets one)
        optimizer_state  the optimizer's state arrays: those it holds, or for a parameter it
                         has not stepped yet, what its first step allocates (slots x bytes)
        activations      what the graph keeps for the backward when the forward is done
                         (`recompute.saved_bytes` of the loss)
        total            their sum: the peak of the step (everything is alive when the
                         backward starts, the gradients are complete when it ends). The
                         backward's own temporaries are not counted.

    The model's gradients are restored afterwards (the optimizer is not stepped).
    """
    ids, targets = batch
    params = model.named_parameters()
    saved_grads = {k: p.grad for k, p in params.items()}
    try:
        for p in params.values():
            p.grad = None
        loss = model.loss(ids, targets)
        activations = saved_bytes(loss)
        loss.backward()
        del loss
        gradients = sum(_nbytes(p.grad) for p in params.values())
    finally:
        for k, p in params.items():
            p.grad = saved_grads[k]
    parameters = sum(_nbytes(p.data) for p in params.values())
    slots = tuple(getattr(optimizer, "slots", ()))
    state = getattr(optimizer, "state", {})
    optimizer_state = 0
    for name, p in optimizer.named_params():
        st = state.get(name)
        if st is not None and any(s in st for s in slots):
            optimizer_state += sum(_nbytes(st.get(s)) for s in slots)
        elif slots and not (getattr(optimizer, "kind", "") == "SGD"
                            and not any(g.get("momentum", 0) for g in optimizer.groups)):
            optimizer_state += len(slots) * _nbytes(p.data)
    total = parameters + gradients + optimizer_state + activations
    return {"parameters": parameters, "gradients": gradients, "optimizer_state": optimizer_state,
            "activations": activations, "total": total}
