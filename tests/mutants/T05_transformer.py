"""Plausible wrong solutions of T05's exercises (format: tests/test_mutants.py, CONTRIBUTING.md)."""

_ROPE_TABLES = """
inv_freq = theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)
ang = np.arange(start, start + T, dtype=np.float64)[:, None] * inv_freq[None, :]
ang = np.concatenate([ang, ang], axis=-1)
cos = np.cos(ang).astype(x.dtype)[None, :, None, :]
sin = np.sin(ang).astype(x.dtype)[None, :, None, :]
"""

_SOFTMAX = """
e = np.exp(s - s.max(axis=-1, keepdims=True))
return e / e.sum(axis=-1, keepdims=True)
"""
_ONE_HEAD = """
s = q @ k.T * D ** -0.5
s = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, s)
p = softmax_rows(s)
return p @ v, p
"""
_HEADS = """
qh, kh, vh = (a.transpose(0, 2, 1, 3) for a in (q, k, v))
s = qh @ kh.transpose(0, 1, 3, 2) * D ** -0.5
s = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, s)
return (softmax_rows(s) @ vh).transpose(0, 2, 1, 3)
"""
_BLOCK = """
h = rmsnorm(x, P[p + "input_layernorm.weight"], c.norm_eps)
q, k, v = ((h @ P[p + f"self_attn.{n}_proj.weight"].T).reshape(B, T, H, D) for n in "qkv")
if c.qk_norm:
    q = rmsnorm(q, P[p + "self_attn.q_norm.weight"], c.norm_eps)
    k = rmsnorm(k, P[p + "self_attn.k_norm.weight"], c.norm_eps)
q, k = rope(q, c.rope_theta), rope(k, c.rope_theta)
x = x + causal_attention(q, k, v).reshape(B, T, H * D) @ P[p + "self_attn.o_proj.weight"].T
h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], c.norm_eps)
return x + swiglu_mlp(h, P[p + "mlp.gate_proj.weight"], P[p + "mlp.up_proj.weight"], P[p + "mlp.down_proj.weight"])
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
        "accumulated in float64 and returned in float64": ("""
            ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
            return x / np.sqrt(ms + eps) * w
        """, "dtype float64"),
        "eps outside the square root (named case)": ("""
            ms = np.mean(x * x, axis=-1, keepdims=True)
            return x / (np.sqrt(ms) + eps) * w
        """, "mean square near eps"),
        "eps added to x before squaring": ("""
            ms = np.mean((x + eps) ** 2, axis=-1, keepdims=True)
            return x / np.sqrt(ms) * w
        """, "mean square near eps"),
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
        # issue 37: float32 angles pass at positions up to ~100 and are off by 2e-3 at 30,000
        "angles computed in float32": (_ROPE_TABLES.replace("dtype=np.float64", "dtype=np.float32") + """
            rotated = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1)
            return x * cos + rotated * sin
        """.replace("            ", ""), "float64"),
        "tables left in float64 (a float64 result)": (_ROPE_TABLES.replace(".astype(x.dtype)", "") + """
            rotated = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1)
            return x * cos + rotated * sin
        """.replace("            ", ""), "dtype float64"),
        "frequencies over D/2 instead of D": _ROPE_TABLES.replace("/ D)", "/ (D // 2))") + """
            rotated = np.concatenate([-x[..., D // 2:], x[..., :D // 2]], axis=-1)
            return x * cos + rotated * sin
        """.replace("            ", ""),
    },
    "T05.6": {
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
    "T05.7": {
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
    "T05.3": {
        "no max subtracted (overflows at scores ~100)": (_SOFTMAX.replace(" - s.max(axis=-1, keepdims=True)", ""),
                                                         "subtract the row maximum"),
        "the maximum of the whole array, not of each row": (_SOFTMAX.replace("s.max(axis=-1, keepdims=True)", "s.max()"),
                                                            "all-negative row"),
        "the row maximum clipped at 0": (_SOFTMAX.replace("s.max(axis=-1, keepdims=True)",
                                                          "np.maximum(s.max(axis=-1, keepdims=True), 0)"),
                                         "all-negative row"),
        "maximum over the wrong axis": _SOFTMAX.replace("s.max(axis=-1, keepdims=True)", "s.max(axis=0, keepdims=True)"),
        "normalised over the wrong axis": _SOFTMAX.replace("e.sum(axis=-1, keepdims=True)", "e.sum(axis=0, keepdims=True)"),
        "max without keepdims (broadcasts against the wrong axis)": _SOFTMAX.replace(
            "s.max(axis=-1, keepdims=True)", "s.max(axis=-1)"),
    },
    "T05.4": {
        "causal mask forgotten": _ONE_HEAD.replace(
            "s = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, s)\n", ""),
        "no 1/sqrt(D) scale": _ONE_HEAD.replace(" * D ** -0.5", ""),
        "the diagonal masked too (k=0)": _ONE_HEAD.replace("k=1", "k=0"),
        "scores transposed (k q^T)": _ONE_HEAD.replace("q @ k.T", "k @ q.T"),
        "softmax over the query axis": _ONE_HEAD.replace("p = softmax_rows(s)", "p = softmax_rows(s.T).T"),
        "scale as a NumPy float64 (float64 result)": (_ONE_HEAD.replace("* D ** -0.5", "/ np.sqrt(D)"), "float64"),
    },
    "T05.5": {
        # the hint about reshape sits on the first case with several heads, which this mistake reaches
        "heads by reshape, not transpose (positions and heads mixed)": (_HEADS.replace(
            "(a.transpose(0, 2, 1, 3) for a in (q, k, v))", "(a.reshape(B, H, T, D) for a in (q, k, v))"),
            "a reshape gives the right shape"),
        "output reshaped back instead of transposed": (_HEADS.replace(
            ".transpose(0, 2, 1, 3)\n", ".reshape(B, T, H, D)\n").replace(
            "(a.reshape(B, T, H, D) for a", "(a.transpose(0, 2, 1, 3) for a"), "a reshape gives the right shape"),
        "causal mask forgotten": _HEADS.replace(
            "s = np.where(np.triu(np.ones((T, T), dtype=bool), k=1), -np.inf, s)\n", ""),
        "scale 1/D instead of 1/sqrt(D)": _HEADS.replace("D ** -0.5", "(1.0 / D)"),
        "keys not transposed per head (kh.transpose(0, 1, 2, 3))": _HEADS.replace(
            "kh.transpose(0, 1, 3, 2)", "kh.transpose(0, 1, 2, 3).swapaxes(-1, -2).swapaxes(0, 1)"),
    },
    "T05.8": {
        "post-norm (the sum normalised, not the branch input)": """
            a_in = x
            q, k, v = ((x @ P[p + f"self_attn.{n}_proj.weight"].T).reshape(B, T, H, D) for n in "qkv")
            q, k = rope(q, c.rope_theta), rope(k, c.rope_theta)
            x = rmsnorm(x + causal_attention(q, k, v).reshape(B, T, H * D) @ P[p + "self_attn.o_proj.weight"].T,
                        P[p + "input_layernorm.weight"], c.norm_eps)
            return rmsnorm(x + swiglu_mlp(x, P[p + "mlp.gate_proj.weight"], P[p + "mlp.up_proj.weight"],
                                          P[p + "mlp.down_proj.weight"]), P[p + "post_attention_layernorm.weight"], c.norm_eps)
        """,
        "attention residual forgotten": _BLOCK.replace(
            "x = x + causal_attention", "x = causal_attention"),
        "RoPE before QK-norm": _BLOCK.replace(
            "q, k = rope(q, c.rope_theta), rope(k, c.rope_theta)\n", "").replace(
            "if c.qk_norm:", "q, k = rope(q, c.rope_theta), rope(k, c.rope_theta)\nif c.qk_norm:"),
        "the MLP reads the block's input, not the updated stream": _BLOCK.replace(
            'h = rmsnorm(x, P[p + "post_attention_layernorm.weight"], c.norm_eps)',
            'h = rmsnorm(h0, P[p + "post_attention_layernorm.weight"], c.norm_eps)').replace(
            'h = rmsnorm(x, P[p + "input_layernorm.weight"], c.norm_eps)',
            'h0 = x\nh = rmsnorm(x, P[p + "input_layernorm.weight"], c.norm_eps)'),
        "one norm weight for both branches": _BLOCK.replace('"post_attention_layernorm.weight"', '"input_layernorm.weight"'),
        "QK-norm skipped": _BLOCK.replace("if c.qk_norm:", "if False:"),
    },
}
