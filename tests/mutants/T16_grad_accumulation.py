"""Plausible wrong solutions of T16's exercise (format: tests/test_mutants.py)."""

_ACC = """
b = x.shape[0] // n_micro
total = 0.0
for k in range(n_micro):
    loss = model.loss(x[k * b:(k + 1) * b], y[k * b:(k + 1) * b])
    total += loss.item()
    (loss * (1.0 / n_micro)).backward()
return total / n_micro
"""

MUTANTS = {
    "T16.1": {
        "loss not divided by N": _ACC.replace("(loss * (1.0 / n_micro)).backward()", "loss.backward()"),
        "gradients zeroed inside the loop": _ACC.replace("    total += loss.item()\n", "    total += loss.item()\n    model.zero_grad()\n"),
        "the same micro-batch every time": _ACC.replace("x[k * b:(k + 1) * b], y[k * b:(k + 1) * b]", "x[:b], y[:b]"),
        "returns the summed loss": _ACC.replace("return total / n_micro", "return total"),
    },
}

_CUT = """
n = x.shape[0]
if n % (accum_steps * world_size):
    raise ValueError(f"{n} rows do not split into {accum_steps} micro-steps x {world_size} ranks")
b = n // (accum_steps * world_size)
return [(x[(k * world_size + rank) * b:(k * world_size + rank + 1) * b],
         y[(k * world_size + rank) * b:(k * world_size + rank + 1) * b]) for k in range(accum_steps)]
"""

_SYNC = """
total = 0.0
for xb, yb in batches:
    loss = model.loss(xb, yb)
    total += loss.item()
    (loss * (1.0 / len(batches))).backward()
ddp.sync_gradients()
return total / len(batches)
"""

MUTANTS["T16.2"] = {
    "rank-major layout (each rank a contiguous block)": _CUT.replace("(k * world_size + rank)", "(rank * accum_steps + k)"),
    "micro-batch size ignores the ranks (b = n // accum_steps)": """
        b = x.shape[0] // accum_steps
        return [(x[k * b:(k + 1) * b], y[k * b:(k + 1) * b]) for k in range(accum_steps)]
    """,
    "every rank takes rank 0's rows": _CUT.replace("(k * world_size + rank)", "(k * world_size)"),
    "uneven split not refused": _CUT.replace(
        'if n % (accum_steps * world_size):\n    raise ValueError(f"{n} rows do not split into {accum_steps} micro-steps x {world_size} ranks")\n', ""),
}
MUTANTS["T16.3"] = {
    "all-reduce after every micro-step": _SYNC.replace("    (loss * (1.0 / len(batches))).backward()\nddp.sync_gradients()",
                                                       "    (loss * (1.0 / len(batches))).backward()\n    ddp.sync_gradients()"),
    "all-reduce before the last micro-batch's backward": """
        total = 0.0
        for i, (xb, yb) in enumerate(batches):
            loss = model.loss(xb, yb)
            total += loss.item()
            if i == len(batches) - 1:
                ddp.sync_gradients()
            (loss * (1.0 / len(batches))).backward()
        return total / len(batches)
    """,
    "no all-reduce": _SYNC.replace("ddp.sync_gradients()\n", ""),
    "loss not divided by N": _SYNC.replace("(loss * (1.0 / len(batches))).backward()", "loss.backward()"),
}
