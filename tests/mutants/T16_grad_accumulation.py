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
