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
        "float ids": """
            lengths = np.array([len(s) for s in seqs], dtype=np.int64)
            ids = np.full((len(seqs), int(lengths.max())), pad_id, dtype=np.float32)
            for b, s in enumerate(seqs):
                ids[b, :len(s)] = s
            return ids, lengths
        """,
    },
    "T10.2": {
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
        "the real tokens masked instead of the padding": """
            targets = np.array(targets, dtype=np.int64, copy=True)
            pad = np.arange(targets.shape[1])[None, :] < np.asarray(lengths)[:, None]
            targets[pad] = ignore_index
            return targets
        """,
    },
}
