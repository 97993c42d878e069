"""Plausible wrong solutions of T13's exercises (format: tests/test_mutants.py)."""

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
_SEG = """
for a in range(0, len(blocks), every):
    def segment(h, seg=blocks[a:a + every]):
        for f in seg:
            h = f(h)
        return h
    x = checkpoint1(segment, x)
return x
"""

MUTANTS = {
    "T13.1": {
        "recomputed under no_grad (no graph to backpropagate)": _CKPT.replace("with enable_grad():", "with no_grad():"),
        "inner backward without the upstream gradient": _CKPT.replace("y.backward(g)", "y.backward(np.ones_like(g))"),
        "recomputed input does not require grad": _CKPT.replace(
            "x_again = Tensor(x.data, requires_grad=True)", "x_again = Tensor(x.data)"),
        "returns the recomputation's output as the gradient": _CKPT.replace("return (x_again.grad,)", "return (y.data,)"),
    },
    "T13.2": {
        "the whole block checkpointed": """
            return checkpoint1(lambda a: block(a, i), x)
        """,
        "the MLP half checkpointed instead": """
            return checkpoint1(lambda a: mlp_half(a, i), attention_half(x, i))
        """,
        "no checkpoint (both halves recorded)": """
            return mlp_half(attention_half(x, i), i)
        """,
        "the layer index fixed to block 0": """
            h = checkpoint1(lambda a: attention_half(a, 0), x)
            return mlp_half(h, i)
        """,
    },
    "T13.3": {
        "late binding: the segment read from the loop variable at backward time": """
            for a in range(0, len(blocks), every):
                def segment(h):
                    for f in blocks[a:a + every]:
                        h = f(h)
                    return h
                x = checkpoint1(segment, x)
            return x
        """,
        "the last, shorter segment dropped": _SEG.replace("range(0, len(blocks), every)",
                                                          "range(0, len(blocks) - every + 1, every)"),
        "every block its own checkpoint (every ignored)": _SEG.replace("blocks[a:a + every]", "blocks[a:a + 1]").replace(
            "range(0, len(blocks), every)", "range(0, len(blocks))"),
        "segments run without checkpoint1 (all recorded)": _SEG.replace("x = checkpoint1(segment, x)", "x = segment(x)"),
    },
}
