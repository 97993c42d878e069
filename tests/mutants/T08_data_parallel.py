"""Plausible wrong solutions of T08's exercise (format: tests/test_mutants.py)."""

_RING = """
for s in range(W - 1):
    msgs = [((r + 1) % W, (r - s) % W) for r in range(W)]
    msgs = [(dst, c, data[(dst - 1) % W][slice(*bounds[c])]) for dst, c in msgs]
    for dst, c, chunk in msgs:
        a, b = bounds[c]
        data[dst][a:b] = [x + y for x, y in zip(data[dst][a:b], chunk)]
for s in range(W - 1):
    msgs = [((r + 1) % W, (r + 1 - s) % W) for r in range(W)]
    msgs = [(dst, c, data[(dst - 1) % W][slice(*bounds[c])]) for dst, c in msgs]
    for dst, c, chunk in msgs:
        a, b = bounds[c]
        data[dst][a:b] = chunk
"""

MUTANTS = {
    "T08.1": {
        "all-gather starts from the wrong chunk (r - s)": _RING.replace("(r + 1 - s) % W", "(r - s) % W"),
        "all-gather left out (each rank holds one summed chunk)": _RING.split("for s in range(W - 1):")[0]
        + "for s in range(W - 1):" + _RING.split("for s in range(W - 1):")[1],
        "one step too few in the reduce-scatter (W - 2)": _RING.replace("for s in range(W - 1):\n    msgs = [((r + 1) % W, (r - s)",
                                                                        "for s in range(W - 2):\n    msgs = [((r + 1) % W, (r - s)"),
        "all-gather adds instead of copying": _RING.replace("        data[dst][a:b] = chunk",
                                                            "        data[dst][a:b] = [x + y for x, y in zip(data[dst][a:b], chunk)]"),
    },
}
