"""Plausible wrong solutions of T07's exercises (format: tests/test_mutants.py)."""

_SWIGLU_ROWS = """
dgate, dup = np.empty_like(a), np.empty_like(a)

def rows(lo, hi):
    sig = sigmoid(a[lo:hi])
    np.multiply(a[lo:hi], sig, out=dup[lo:hi])
    dup[lo:hi] *= g[lo:hi]
    d = dgate[lo:hi]
    np.subtract(np.float32(1), sig, out=d)
    d *= a[lo:hi]
    d += np.float32(1)
    d *= sig
    d *= up[lo:hi]
    d *= g[lo:hi]

cpu_threads.map_rows(rows, a.shape[0], a.shape[1] * a.itemsize)
return dgate, dup
"""

_ADAMW = """
float theta = p[i];
if (i < n_decay) theta = theta * decay;
float gi = g[i];
float mi = m[i];
mi = mi + one_minus_b1 * (gi - mi);
float vi = v[i] * b2 + one_minus_b2 * (gi * gi);
float denom = sqrtf(vi) / bc2_sqrt + eps;
p[i] = theta + neg_step * (mi / denom);
m[i] = mi;
v[i] = vi;
"""

_FLOPS = """
d, hd = c.dim, c.head_dim
attn_w = d * c.n_heads * hd + 2 * d * c.n_kv_heads * hd + c.n_heads * hd * d
mlp_w = 3 * d * c.ffn_dim
matmul_params = c.n_layers * (attn_w + mlp_w) + c.vocab_size * d
return 6.0 * matmul_params + 12.0 * c.n_layers * seq_len * c.n_heads * hd
"""

MUTANTS = {
    "T07.1": {
        "the chain on whole arrays (no row blocks)": ("""
            sig = sigmoid(a)
            dup = a * sig * g
            dgate = g * up * sig * (1 + a * (1 - sig))
            return dgate, dup
        """, "rows at once"),
        "sigmoid as 1 / (1 + exp(-a)), which overflows": (
            _SWIGLU_ROWS.replace("sig = sigmoid(a[lo:hi])", "sig = 1 / (1 + np.exp(-a[lo:hi]))"), "overflow"),
        "sigmoid of the whole gate computed before the blocks": (
            _SWIGLU_ROWS.replace("def rows(lo, hi):\n    sig = sigmoid(a[lo:hi])",
                                 "sig_all = sigmoid(a)\n\ndef rows(lo, hi):\n    sig = sig_all[lo:hi]"), "rows at once"),
        "the (1 + a (1 - sigma)) factor forgotten": (
            _SWIGLU_ROWS.replace("np.subtract(np.float32(1), sig, out=d)\n    d *= a[lo:hi]\n    d += np.float32(1)\n    d *= sig",
                                 "d[...] = sig"), "dgate"),
        "dup without the upstream gradient g": (_SWIGLU_ROWS.replace("    dup[lo:hi] *= g[lo:hi]\n", ""), "dup"),
    },
    "T07.2": {
        "every parameter decayed (n_decay ignored)": _ADAMW.replace("if (i < n_decay) theta", "theta"),
        "eps inside the square root": _ADAMW.replace("sqrtf(vi) / bc2_sqrt + eps", "sqrtf(vi + eps) / bc2_sqrt"),
        "v not written back": _ADAMW.replace("v[i] = vi;\n", ""),
        "update from the old m (m read after the store)": _ADAMW.replace("(mi / denom)", "(m[i] / denom)"),
    },
    "T07.3": {
        "float() of each loss: a host sync per step": ("""
            return [float(v) for v in losses]
        """, "host syncs"),
        "to_host of each loss in turn": ("""
            return [float(device.to_host(v)) for v in losses]
        """, "host syncs"),
        "stacked in reverse order": ("""
            if not losses:
                return []
            xp = device.array_module(losses[0])
            return device.to_host(xp.stack([xp.asarray(v).reshape(()) for v in losses[::-1]])).astype(np.float64).tolist()
        """, "in order"),
        "only the last loss read, for every step": ("""
            return [float(losses[-1])] * len(losses) if losses else []
        """, "in order"),
        "an empty list not handled": ("""
            xp = device.array_module(losses[0])
            return device.to_host(xp.stack([xp.asarray(v).reshape(()) for v in losses])).astype(np.float64).tolist()
        """, "IndexError"),
    },
    "T07.4": {
        "the forward only (2 FLOPs per weight, not 6)": _FLOPS.replace("6.0 * matmul_params", "2.0 * matmul_params"),
        "the embedding counted as a matmul": _FLOPS.replace("+ c.vocab_size * d", "+ 2 * c.vocab_size * d"),
        "the lm_head forgotten": _FLOPS.replace(" + c.vocab_size * d", ""),
        "no attention term": _FLOPS.replace(" + 12.0 * c.n_layers * seq_len * c.n_heads * hd", ""),
        "attention's forward only (4, not 12)": _FLOPS.replace("12.0 * c.n_layers", "4.0 * c.n_layers"),
        "k and v with n_heads (grouped-query attention ignored)": (
            _FLOPS.replace("2 * d * c.n_kv_heads * hd", "2 * d * c.n_heads * hd"), "grouped-query"),
        "q and o sized dim, not n_heads * head_dim": (
            _FLOPS.replace("attn_w = d * c.n_heads * hd + 2 * d * c.n_kv_heads * hd + c.n_heads * hd * d",
                           "attn_w = d * d + 2 * d * c.n_kv_heads * hd + d * d"), "head_dim ≠ dim"),
    },
}
