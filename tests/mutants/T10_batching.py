"""Plausible wrong solutions of T10's exercises (format: tests/test_mutants.py)."""

MUTANTS = {
    "T10.1": {
        "left padding": """
            lengths = np.array([len(s) for s in seqs], dtype=np.int64)
            ids = np.full((len(seqs), int(lengths.max())), pad_id, dtype=np.int64)
            for b, s in enumerate(seqs):
                ids[b, ids.shape[1] - len(s):] = s
            return ids, lengths
        """,
        "pad_id ignored (zeros)": """
            lengths = np.array([len(s) for s in seqs], dtype=np.int64)
            ids = np.zeros((len(seqs), int(lengths.max())), dtype=np.int64)
            for b, s in enumerate(seqs):
                ids[b, :len(s)] = s
            return ids, lengths
        """,
        "lengths as the padded length": """
            T = max(len(s) for s in seqs)
            ids = np.full((len(seqs), T), pad_id, dtype=np.int64)
            for b, s in enumerate(seqs):
                ids[b, :len(s)] = s
            return ids, np.full(len(seqs), T, dtype=np.int64)
        """,
        "int32 lengths (my own slip: the wrong integer width)": """
            lengths = np.array([len(s) for s in seqs], dtype=np.int32)
            ids = np.full((len(seqs), int(lengths.max())), pad_id, dtype=np.int64)
            for b, s in enumerate(seqs):
                ids[b, :len(s)] = s
            return ids, lengths
        """,
        "last token dropped (my own slip: an off-by-one)": """
            lengths = np.array([len(s) for s in seqs], dtype=np.int64)
            ids = np.full((len(seqs), int(lengths.max())), pad_id, dtype=np.int64)
            for b, s in enumerate(seqs):
                ids[b, :len(s) - 1] = s[:-1]
            return ids, lengths
        """,
        "float ids": """
            lengths = np.array([len(s) for s in seqs], dtype=np.int64)
            ids = np.full((len(seqs), int(lengths.max())), pad_id, dtype=np.float32)
            for b, s in enumerate(seqs):
                ids[b, :len(s)] = s
            return ids, lengths
        """,
    },
    "T10.3": {
        "off by one (t > lengths)": """
            targets = np.array(targets, dtype=np.int64, copy=True)
            pad = np.arange(targets.shape[1])[None, :] > np.asarray(lengths)[:, None]
            targets[pad] = ignore_index
            return targets
        """,
        "mask on the wrong axis (lengths as columns)": """
            targets = np.array(targets, dtype=np.int64, copy=True)
            pad = np.arange(targets.shape[0])[:, None] >= np.asarray(lengths)[None, :targets.shape[1]]
            targets[pad[:, :targets.shape[1]]] = ignore_index
            return targets
        """,
        "ignore_index ignored (-100 always)": """
            targets = np.array(targets, dtype=np.int64, copy=True)
            pad = np.arange(targets.shape[1])[None, :] >= np.asarray(lengths)[:, None]
            targets[pad] = -100
            return targets
        """,
        # issue 37: the text asks for a copy; masking the caller's targets in place must fail
        "the caller's targets masked in place": ("""
            pad = np.arange(targets.shape[1])[None, :] >= np.asarray(lengths)[:, None]
            targets[pad] = ignore_index
            return targets
        """, "in place"),
        "the real tokens masked instead of the padding": """
            targets = np.array(targets, dtype=np.int64, copy=True)
            pad = np.arange(targets.shape[1])[None, :] < np.asarray(lengths)[:, None]
            targets[pad] = ignore_index
            return targets
        """,
    },
}

_FWD = """
ids, lengths = pad_batch(seqs, pad_id)
with no_grad():
    logits = model(ids).numpy()
return [logits[b, :n] for b, n in enumerate(lengths)]
"""
_MASK = """
pos = np.arange(T)
visible = (pos[None, :] <= pos[:, None])[None] & (pos[None, None, :] >= (T - np.asarray(lengths))[:, None, None])
s = np.where(visible, q @ k.swapaxes(1, 2) * (1 / math.sqrt(D)), -np.inf)
m = np.where(visible.any(axis=-1, keepdims=True), s.max(axis=-1, keepdims=True), 0)
p = np.where(visible, np.exp(s - m), 0)
l = p.sum(axis=-1, keepdims=True)
return (p / np.where(l > 0, l, 1)) @ v
"""

MUTANTS["T10.2"] = {
    "a loop of per-sequence forwards": ("""
        out = []
        with no_grad():
            for s in seqs:
                out.append(model(np.asarray(s)[None, :]).numpy()[0])
        return out
    """, "model calls"),
    "the last L_b rows (as if left-padded)": _FWD.replace("logits[b, :n]", "logits[b, logits.shape[1] - n:]"),
    "the padded rows returned whole": _FWD.replace("logits[b, :n]", "logits[b]"),
    "one row short (L_b - 1)": _FWD.replace("logits[b, :n]", "logits[b, :max(n - 1, 1)]"),
    # issue 37: a forward that records a graph, and Tensors where arrays are asked for
    "forward without no_grad (a graph recorded)": (_FWD.replace("with no_grad():\n    logits", "if True:\n    logits"),
                                                   "no_grad"),
    "Tensors returned instead of arrays": ("""
        ids, lengths = pad_batch(seqs, pad_id)
        with no_grad():
            logits = model(ids)
        return [logits[b, :n] for b, n in enumerate(lengths)]
    """, "Tensor"),
}
MUTANTS["T10.4"] = {
    "causal mask only (pad keys visible)": (_MASK.replace(
        " & (pos[None, None, :] >= (T - np.asarray(lengths))[:, None, None])", " & np.ones((len(lengths), 1, 1), bool)"),
        "pads hold 5.0"),
    "the right-padding mask (s < L_b) on a left-padded batch": _MASK.replace(
        "(pos[None, None, :] >= (T - np.asarray(lengths))[:, None, None])", "(pos[None, None, :] < np.asarray(lengths)[:, None, None])"),
    "a query with no visible key left as 0/0": (_MASK.replace(
        "m = np.where(visible.any(axis=-1, keepdims=True), s.max(axis=-1, keepdims=True), 0)",
        "m = s.max(axis=-1, keepdims=True)").replace("np.where(l > 0, l, 1)", "l"), "invalid value"),
    "no row maximum subtracted": (_MASK.replace("np.exp(s - m)", "np.exp(s)"), "scores in the hundreds"),
    "probabilities masked after the softmax, not renormalised": """
        pos = np.arange(T)
        visible = (pos[None, :] <= pos[:, None])[None] & (pos[None, None, :] >= (T - np.asarray(lengths))[:, None, None])
        s = np.where(np.tril(np.ones((T, T), bool)), q @ k.swapaxes(1, 2) * (1 / math.sqrt(D)), -np.inf)
        e = np.exp(s - s.max(axis=-1, keepdims=True))
        p = e / e.sum(axis=-1, keepdims=True)
        return np.where(visible, p, 0) @ v
    """,
}
