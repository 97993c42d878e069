"""Plausible wrong solutions of T05's exercises (format: tests/test_mutants.py, CONTRIBUTING.md)."""

_ATTN_HEAD = """
k = np.repeat(k, G, axis=2)
v = np.repeat(v, G, axis=2)
qh, kh, vh = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
"""
_ATTN_TAIL = """
s = s - s.max(axis=-1, keepdims=True)
p = np.exp(s)
p = p / p.sum(axis=-1, keepdims=True)
return (p @ vh).transpose(0, 2, 1, 3)
"""
_CAUSAL = """
future = np.triu(np.ones((T, T), dtype=bool), k=1)
s = np.where(future, -np.inf, s)
"""
_SCORES = "s = qh @ kh.transpose(0, 1, 3, 2) / np.sqrt(D).astype(q.dtype)\n"

_ROPE_TABLES = """
inv_freq = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)
ang = np.arange(start, start + T, dtype=np.float64)[:, None] * inv_freq[None, :]
ang = np.concatenate([ang, ang], axis=-1)
cos = np.cos(ang).astype(x.dtype)[None, :, None, :]
sin = np.sin(ang).astype(x.dtype)[None, :, None, :]
"""

MUTANTS = {
    "T05.1": {
        "eps outside the square root": """
            ms = np.mean(x * x, axis=-1, keepdims=True)
            return x / (np.sqrt(ms) + eps) * w
        """,
        "normalised over the wrong axis": """
            ms = np.mean(x * x, axis=0, keepdims=True)
            return x / np.sqrt(ms + eps) * w
        """,
        "the weight forgotten": """
            ms = np.mean(x * x, axis=-1, keepdims=True)
            return x / np.sqrt(ms + eps)
        """,
        "variance (mean subtracted) instead of mean square": """
            return x / np.sqrt(np.var(x, axis=-1, keepdims=True) + eps) * w
        """,
    },
    "T05.2": {
        "positions from 0, start ignored": _ROPE_TABLES.replace("start, start + T", "0, T") + """
            rotated = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1)
            return x * cos + rotated * sin
        """.replace("            ", ""),
        "rotate_half with the wrong sign": _ROPE_TABLES + """
            rotated = np.concatenate([x[..., D // 2:], -x[..., :D // 2]], axis=-1)
            return x * cos + rotated * sin
        """.replace("            ", ""),
        "interleaved pairs instead of halves": _ROPE_TABLES + """
            rotated = np.stack([-x[..., 1::2], x[..., 0::2]], axis=-1).reshape(x.shape)
            return x * cos + rotated * sin
        """.replace("            ", ""),
        "frequencies over D/2 instead of D": _ROPE_TABLES.replace("/ D)", "/ (D // 2))") + """
            rotated = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1)
            return x * cos + rotated * sin
        """.replace("            ", ""),
    },
    "T05.3": {
        "causal mask forgotten": _ATTN_HEAD + _SCORES + _ATTN_TAIL,
        "no 1/sqrt(D) scale": _ATTN_HEAD + _SCORES.replace(" / np.sqrt(D).astype(q.dtype)", "") + _CAUSAL + _ATTN_TAIL,
        "mask keeps the diagonal out (k=0)": _ATTN_HEAD + _SCORES + _CAUSAL.replace("k=1", "k=0")
        + "s = np.where(np.isneginf(s).all(-1, keepdims=True), 0, s)\n" + _ATTN_TAIL,
        "kv heads tiled (0,1,0,1) instead of repeated (0,0,1,1)": _ATTN_HEAD.replace(
            "np.repeat(k, G, axis=2)", "np.tile(k, (1, 1, G, 1))").replace(
            "np.repeat(v, G, axis=2)", "np.tile(v, (1, 1, G, 1))") + _SCORES + _CAUSAL + _ATTN_TAIL,
        "softmax over the query axis": _ATTN_HEAD + _SCORES + _CAUSAL + _ATTN_TAIL.replace(
            "p = p / p.sum(axis=-1, keepdims=True)", "p = p / p.sum(axis=-2, keepdims=True)"),
    },
    "T05.4": {
        "overflowing sigmoid a / (1 + exp(-a))": """
            gate = h @ w_gate.T
            up = h @ w_up.T
            return (gate / (1 + np.exp(-gate)) * up) @ w_down.T
        """,
        "gate and up swapped": """
            gate = h @ w_gate.T
            up = h @ w_up.T
            silu = up * 0.5 * (1 + np.tanh(0.5 * up))
            return (silu * gate) @ w_down.T
        """,
        "sigmoid without the gate factor": """
            gate = h @ w_gate.T
            up = h @ w_up.T
            return (0.5 * (1 + np.tanh(0.5 * gate)) * up) @ w_down.T
        """,
        "up projected with w_gate (copy-paste)": """
            gate = h @ w_gate.T
            up = h @ w_gate.T
            silu = gate * 0.5 * (1 + np.tanh(0.5 * gate))
            return (silu * up) @ w_down.T
        """,
    },
    "T05.5": {
        "float64 result (the logits' dtype is asked for)": """
            m = z.max(axis=1, keepdims=True)
            lse = m[:, 0] + np.log(np.exp(z.astype(np.float64) - m).sum(axis=1))
            return (lse - z[np.arange(len(t)), t]).mean()
        """,
        "no max subtracted (overflows)": """
            lse = np.log(np.exp(z).sum(axis=1))
            return (lse - z[np.arange(len(t)), t]).mean().astype(logits.dtype)
        """,
        "max subtracted but not added back": """
            m = z.max(axis=1, keepdims=True)
            lse = np.log(np.exp(z - m).sum(axis=1))
            return (lse - z[np.arange(len(t)), t]).mean().astype(logits.dtype)
        """,
        "sum instead of mean": """
            m = z.max(axis=1, keepdims=True)
            lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
            return (lse - z[np.arange(len(t)), t]).sum().astype(logits.dtype)
        """,
        "wrong target indexing z[:, t]": """
            m = z.max(axis=1, keepdims=True)
            lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
            return (lse - z[:, t].mean(axis=0)).mean().astype(logits.dtype)
        """,
    },
}
