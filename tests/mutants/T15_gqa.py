"""Plausible wrong solutions of T15's exercises (format: tests/test_mutants.py)."""

_GA = """
qg = q.reshape(B, T, Hkv, G, D).transpose(0, 2, 3, 1, 4).reshape(B, Hkv, G * T, D)
kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
s = qg @ kh.swapaxes(-1, -2) / D ** 0.5
pos = np.arange(G * T) % T
s = np.where(np.arange(T)[None, :] <= pos[:, None], s, -np.inf)
p = np.exp(s - s.max(axis=-1, keepdims=True))
o = (p / p.sum(axis=-1, keepdims=True)) @ vh
return o.reshape(B, Hkv, G, T, D).transpose(0, 3, 1, 2, 4).reshape(B, T, H, D)
"""
_KV = """
per_layer = 2 * batch * seq_len * config.n_kv_heads * config.head_dim
return config.n_layers * per_layer * np.dtype(dtype).itemsize
"""

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
    "T15.3": {
        "query heads grouped as h % Hkv (tiled)": _GA.replace(
            "q.reshape(B, T, Hkv, G, D).transpose(0, 2, 3, 1, 4)", "q.reshape(B, T, G, Hkv, D).transpose(0, 3, 2, 1, 4)"),
        "causal mask on the stacked row index, not its position": _GA.replace("np.arange(G * T) % T", "np.arange(G * T)"),
        "no 1/sqrt(D) scale": _GA.replace(" / D ** 0.5", ""),
        "mask applied after the softmax (rows not renormalised)": """
            qg = q.reshape(B, T, Hkv, G, D).transpose(0, 2, 3, 1, 4).reshape(B, Hkv, G * T, D)
            kh, vh = k.transpose(0, 2, 1, 3), v.transpose(0, 2, 1, 3)
            s = qg @ kh.swapaxes(-1, -2) / D ** 0.5
            p = np.exp(s - s.max(axis=-1, keepdims=True))
            p = p / p.sum(axis=-1, keepdims=True)
            p = np.where(np.arange(T)[None, :] <= (np.arange(G * T) % T)[:, None], p, 0.0)
            return (p @ vh).reshape(B, Hkv, G, T, D).transpose(0, 3, 1, 2, 4).reshape(B, T, H, D)
        """,
        "softmax without the row maximum": (_GA.replace("np.exp(s - s.max(axis=-1, keepdims=True))", "np.exp(s)"),
                                            "scores ~1000"),
    },
    "T15.4": {
        "K only (the factor 2 for V forgotten)": _KV.replace("2 * batch", "batch"),
        "query heads counted (n_heads, not n_kv_heads)": _KV.replace("config.n_kv_heads", "config.n_heads"),
        "one layer only": _KV.replace("config.n_layers * per_layer", "per_layer"),
        "4 bytes a number whatever the dtype": _KV.replace("np.dtype(dtype).itemsize", "4"),
        "head width taken as dim / n_heads": _KV.replace("config.head_dim", "(config.dim // config.n_heads)"),
    },
}
