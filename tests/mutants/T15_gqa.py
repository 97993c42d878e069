"""Plausible wrong solutions of T15's exercises (format: tests/test_mutants.py)."""

MUTANTS = {
    "T15.1": {
        "heads tiled (0,1,2,0,1,2) instead of repeated (0,0,1,1,2,2)": "return np.tile(x, (1, 1, n_rep, 1))",
        "repeated along the wrong axis": "return np.repeat(x, n_rep, axis=1)[:, :T].reshape(B, T, Hkv, D).repeat(n_rep, axis=-2)[:, :, ::-1]",
        "repeat axis inserted before the kv heads": """
            return np.broadcast_to(x[:, :, None, :, :], (B, T, n_rep, Hkv, D)).reshape(B, T, Hkv * n_rep, D)
        """,
        "float32 forced (dtype not kept)": "return np.repeat(x, n_rep, axis=2).astype(np.float32)",
    },
    "T15.2": {
        "groups taken as (n_rep, Hkv) (tiled layout)": "return g.reshape(B, T, n_rep, H // n_rep, D).sum(axis=2)",
        "mean instead of sum": "return g.reshape(B, T, H // n_rep, n_rep, D).mean(axis=3)",
        "first head of each group only": "return g.reshape(B, T, H // n_rep, n_rep, D)[:, :, :, 0]",
    },
}
