"""Plausible wrong solutions of T13's exercise (format: tests/test_mutants.py)."""

_CKPT = """
with no_grad():
    out = fn(x)
def backward(g):
    x_again = Tensor(x.data, requires_grad=True)
    with enable_grad():
        y = fn(x_again)
    y.backward(g)
    return (x_again.grad,)
return make_node(out.data, (x,), backward, "checkpoint1")
"""

MUTANTS = {
    "T13.1": {
        "recomputed under no_grad (no graph to backpropagate)": _CKPT.replace("with enable_grad():", "with no_grad():"),
        "inner backward without the upstream gradient": _CKPT.replace("y.backward(g)", "y.backward(np.ones_like(g))"),
        "recomputed input does not require grad": _CKPT.replace(
            "x_again = Tensor(x.data, requires_grad=True)", "x_again = Tensor(x.data)"),
        "returns the recomputation's output as the gradient": _CKPT.replace("return (x_again.grad,)", "return (y.data,)"),
    },
}
