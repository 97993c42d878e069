"""Plausible wrong solutions of T07's exercises (format: tests/test_mutants.py)."""

_EXCLUSIVE = """
times, stack = {}, []
for kind, name, t in events:
    if kind == "enter":
        stack.append([t, 0.0])
        continue
    start, inner = stack.pop()
    times[name] = times.get(name, 0.0) + (t - start) - inner
    if stack:
        stack[-1][1] += t - start
return times
"""

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

_FLOPS = """
d, hd = c.dim, c.head_dim
attn_w = d * c.n_heads * hd + 2 * d * c.n_kv_heads * hd + c.n_heads * hd * d
mlp_w = 3 * d * c.ffn_dim
matmul_params = c.n_layers * (attn_w + mlp_w) + c.vocab_size * d
return 6.0 * matmul_params + 12.0 * c.n_layers * seq_len * c.n_heads * hd
"""

MUTANTS = {
    "T07.1": {
        "inclusive times (the calls inside not subtracted)": (
            _EXCLUSIVE.replace("(t - start) - inner", "(t - start)"), "nested three deep"),
        "open calls kept in a dict by name (a name inside itself breaks)": ("""
            times, open_, inner = {}, {}, {}
            parents = []
            for kind, name, t in events:
                if kind == "enter":
                    open_[name], inner[name] = t, 0.0
                    parents.append(name)
                    continue
                parents.pop()
                elapsed = t - open_[name]
                times[name] = times.get(name, 0.0) + elapsed - inner[name]
                if parents:
                    inner[parents[-1]] += elapsed
            return times
        """, "a name inside itself"),
        "the children's exclusive time subtracted, not their elapsed time": (
            _EXCLUSIVE.replace("        stack[-1][1] += t - start", "        stack[-1][1] += (t - start) - inner"),
            "nested three deep"),
        "a name's later call overwrites its earlier one": (
            _EXCLUSIVE.replace("times[name] = times.get(name, 0.0) + (t - start) - inner",
                               "times[name] = (t - start) - inner"), "two calls of one name"),
    },
    "T07.2": {
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
    "T07.3": {
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
