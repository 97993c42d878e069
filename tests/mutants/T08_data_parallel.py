"""Plausible wrong solutions of T08's exercises (format: tests/test_mutants.py)."""

_CHUNKS = """
q, rem = divmod(n, W)
bounds, start = [], 0
for c in range(W):
    stop = start + q + (1 if c < rem else 0)
    bounds.append((start, stop))
    start = stop
return bounds
"""
_RS = """
for s in range(W - 1):
    msgs = []
    for r in range(W):
        c = (r - s) % W
        a, b = bounds[c]
        msgs.append(((r + 1) % W, c, data[r][a:b]))
    for dst, c, chunk in msgs:
        a, b = bounds[c]
        data[dst][a:b] = [x + y for x, y in zip(data[dst][a:b], chunk)]
"""
_AG = """
for s in range(W - 1):
    msgs = []
    for r in range(W):
        c = (r + 1 - s) % W
        a, b = bounds[c]
        msgs.append(((r + 1) % W, c, data[r][a:b]))
    for dst, c, chunk in msgs:
        a, b = bounds[c]
        data[dst][a:b] = chunk
"""
_AVG = """
for names in buckets:
    flats = [np.concatenate([g[n].reshape(-1) for n in names]) for g in grads]
    all_reduce(flats)
    for g, flat in zip(grads, flats):
        flat *= np.float32(1.0 / W)
        i = 0
        for n in names:
            g[n][...] = flat[i:i + g[n].size].reshape(g[n].shape)
            i += g[n].size
"""

MUTANTS = {
    "T08.1": {
        "the remainder all in the last chunk": """
            q = n // W
            bounds = [(c * q, (c + 1) * q) for c in range(W)]
            bounds[-1] = (bounds[-1][0], n)
            return bounds
        """,
        "ceil-sized chunks (the last ones short or past the end)": """
            q = -(-n // W)
            return [(c * q, min((c + 1) * q, n)) for c in range(W)]
        """,
        "the remainder dropped (floor division)": """
            q = n // W
            return [(c * q, (c + 1) * q) for c in range(W)]
        """,
        "the longer chunks at the end": _CHUNKS.replace("(1 if c < rem else 0)", "(1 if c >= W - rem else 0)"),
    },
    "T08.2": {
        "sends the chunk it will receive ((r - s - 1) mod W)": _RS.replace("c = (r - s) % W", "c = (r - s - 1) % W"),
        "overwrites instead of adding": _RS.replace(
            "data[dst][a:b] = [x + y for x, y in zip(data[dst][a:b], chunk)]", "data[dst][a:b] = chunk"),
        "one step too few (W - 2)": _RS.replace("for s in range(W - 1):", "for s in range(W - 2):"),
        "sends to the left neighbour": _RS.replace("msgs.append(((r + 1) % W, c,", "msgs.append(((r - 1) % W, c,"),
    },
    "T08.3": {
        "starts from the wrong chunk (r - s)": _AG.replace("c = (r + 1 - s) % W", "c = (r - s) % W"),
        "adds instead of copying": _AG.replace(
            "data[dst][a:b] = chunk", "data[dst][a:b] = [x + y for x, y in zip(data[dst][a:b], chunk)]"),
        "one step too few (W - 2)": _AG.replace("for s in range(W - 1):", "for s in range(W - 2):"),
        "every rank broadcasts its own chunk once (a single step)": _AG.replace(
            "for s in range(W - 1):", "for s in range(min(W - 1, 1)):"),
    },
    "T08.4": {
        "summed, not averaged": _AVG.replace("        flat *= np.float32(1.0 / W)\n", ""),
        "one all-reduce per parameter": """
            for names in buckets:
                for n in names:
                    flats = [g[n].reshape(-1).copy() for g in grads]
                    all_reduce(flats)
                    for g, flat in zip(grads, flats):
                        g[n][...] = (flat / W).reshape(g[n].shape)
        """,
        "offset not advanced (every parameter reads the bucket's start)": _AVG.replace(
            "            i += g[n].size\n", ""),
        "each rank all-reduced alone (its own sum)": """
            for names in buckets:
                for g in grads:
                    flat = np.concatenate([g[n].reshape(-1) for n in names])
                    all_reduce([flat])
                    flat *= np.float32(1.0 / W)
                    i = 0
                    for n in names:
                        g[n][...] = flat[i:i + g[n].size].reshape(g[n].shape)
                        i += g[n].size
        """,
        "averaged on rank 0 only": _AVG.replace("    for g, flat in zip(grads, flats):\n        flat *= np.float32(1.0 / W)\n",
                                                "    flats[0] *= np.float32(1.0 / W)\n    for g, flat in zip(grads, flats):\n"),
    },
}
