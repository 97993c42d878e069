"""Plausible wrong solutions of T14's exercises (format: tests/test_mutants.py)."""

_ONLINE = """
m = np.full(x.shape[:-1], -np.inf, dtype=x.dtype)
l = np.zeros(x.shape[:-1], dtype=x.dtype)
for j0 in range(0, x.shape[-1], chunk):
    c = x[..., j0:j0 + chunk]
    m_new = np.maximum(m, c.max(axis=-1))
    l = np.exp(m - m_new) * l + np.exp(c - m_new[..., None]).sum(axis=-1)
    m = m_new
return np.exp(x - m[..., None]) / l[..., None]
"""
_FWD = """
for i0 in range(0, T, block_q):
    i1 = min(i0 + block_q, T)
    qi = q[:, i0:i1]
    m = np.full((N, i1 - i0), -np.inf, dtype=q.dtype)
    l = np.zeros((N, i1 - i0), dtype=q.dtype)
    acc = np.zeros_like(qi)
    for j0 in range(0, i1, block_k):
        j1 = min(j0 + block_k, T)
        s = qi @ k[:, j0:j1].swapaxes(1, 2) * scale
        future = np.arange(j0, j1)[None, :] > np.arange(i0, i1)[:, None]
        s = np.where(future, -np.inf, s)
        m_new = np.maximum(m, s.max(axis=-1))
        p = np.exp(s - m_new[..., None])
        alpha = np.exp(m - m_new)
        l = alpha * l + p.sum(axis=-1)
        acc = alpha[..., None] * acc + p @ v[:, j0:j1]
        m = m_new
    O[:, i0:i1] = acc / l[..., None]
    L[:, i0:i1] = m + np.log(l)
"""
_BWD = """
Dr = (dO * O).sum(axis=-1)
for j0 in range(0, T, block_k):
    j1 = min(j0 + block_k, T)
    for i0 in range((j0 // block_q) * block_q, T, block_q):
        i1 = min(i0 + block_q, T)
        s = q[:, i0:i1] @ k[:, j0:j1].swapaxes(1, 2) * scale
        future = np.arange(j0, j1)[None, :] > np.arange(i0, i1)[:, None]
        p = np.exp(np.where(future, -np.inf, s) - L[:, i0:i1, None])
        dv[:, j0:j1] += p.swapaxes(1, 2) @ dO[:, i0:i1]
        ds = p * (dO[:, i0:i1] @ v[:, j0:j1].swapaxes(1, 2) - Dr[:, i0:i1, None]) * scale
        dq[:, i0:i1] += ds @ k[:, j0:j1]
        dk[:, j0:j1] += ds.swapaxes(1, 2) @ q[:, i0:i1]
"""

MUTANTS = {
    "T14.1": {
        "not streamed (the whole row at once)": """
            e = np.exp(x - x.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)
        """,
        "old sum not rescaled when the max grows": (_ONLINE.replace("l = np.exp(m - m_new) * l + ", "l = l + "),
                                                    "maximum arrives in the last chunk"),
        "final pass with the first chunk's max": _ONLINE.replace(
            "    m = m_new\n", "    m = m_new if j0 == 0 else m\n"),
        "only the last chunk's sum kept": _ONLINE.replace("l = np.exp(m - m_new) * l + ", "l = "),
        "running max initialised to 0": (_ONLINE.replace("m = np.full(x.shape[:-1], -np.inf, dtype=x.dtype)",
                                                         "m = np.zeros(x.shape[:-1], dtype=x.dtype)"),
                                         "all-negative rows"),
        "plain softmax without the row maximum (streamed)": ("""
            l = np.zeros(x.shape[:-1], dtype=x.dtype)
            for j0 in range(0, x.shape[-1], chunk):
                l = l + np.exp(x[..., j0:j0 + chunk]).sum(axis=-1)
            return np.exp(x) / l[..., None]
        """, "logits ~1000"),
        "running max replaced by the chunk's max (forgets a larger earlier one)": (_ONLINE.replace(
            "m_new = np.maximum(m, c.max(axis=-1))", "m_new = c.max(axis=-1)"), "falling to -1000"),
        "rescale factor inverted, e^(m' - m)": (_ONLINE.replace("np.exp(m - m_new) * l", "np.exp(m_new - m) * l"),
                                               "maximum arrives in the last chunk"),
    },
    "T14.2": {
        "causal mask forgotten": _FWD.replace("        s = np.where(future, -np.inf, s)\n", ""),
        # issue 37: the text says to skip the key tiles above the diagonal ("that halves the work")
        "fully masked key tiles computed too": (_FWD.replace("for j0 in range(0, i1, block_k):",
                                                             "for j0 in range(0, T, block_k):"), "masked"),
        "accumulator not rescaled (alpha forgotten)": _FWD.replace("alpha[..., None] * acc + ", "acc + "),
        "no 1/sqrt(D) scale": _FWD.replace(".swapaxes(1, 2) * scale", ".swapaxes(1, 2)"),
        "L without the log of the sum": _FWD.replace("L[:, i0:i1] = m + np.log(l)", "L[:, i0:i1] = m"),
        "running max initialised to 0": (_FWD.replace("m = np.full((N, i1 - i0), -np.inf, dtype=q.dtype)",
                                                      "m = np.zeros((N, i1 - i0), dtype=q.dtype)"),
                                         "all-negative scores"),
        "exp of the raw scores (no running max subtracted)": (_FWD.replace(
            "p = np.exp(s - m_new[..., None])", "p = np.exp(s)").replace(
            "alpha = np.exp(m - m_new)", "alpha = np.ones_like(m)").replace(
            "L[:, i0:i1] = m + np.log(l)", "L[:, i0:i1] = np.log(l)"), "scores ~1000"),
    },
    "T14.3": {
        "dk from k instead of q (copied from the dq line)": (_BWD.replace(
            "dk[:, j0:j1] += ds.swapaxes(1, 2) @ q[:, i0:i1]", "dk[:, j0:j1] += ds.swapaxes(1, 2) @ k[:, i0:i1]"), "dk"),
        "dk forgets the scale (scale applied twice to dq)": (_BWD.replace(
            "dk[:, j0:j1] += ds.swapaxes(1, 2) @ q[:, i0:i1]", "dk[:, j0:j1] += ds.swapaxes(1, 2) @ q[:, i0:i1] / scale"), "dk"),
        "D_i term left out (ds = p * dp)": _BWD.replace(" - Dr[:, i0:i1, None]", ""),
        "every query tile for every key tile (hidden pairs computed)": (_BWD.replace(
            "for i0 in range((j0 // block_q) * block_q, T, block_q):", "for i0 in range(0, T, block_q):"), "no query sees"),
        "causal mask forgotten in the recomputed P": _BWD.replace(
            "np.where(future, -np.inf, s)", "s"),
        "dv from p without the transpose": (_BWD.replace(
            "dv[:, j0:j1] += p.swapaxes(1, 2) @ dO[:, i0:i1]",
            "dv[:, j0:j1] += (p.sum(axis=1)[..., None] * dO[:, i0:i1].mean(axis=1, keepdims=True))"), "dv"),
        "P recomputed as exp(S) / exp(L)": (_BWD.replace(
            "p = np.exp(np.where(future, -np.inf, s) - L[:, i0:i1, None])",
            "p = np.exp(np.where(future, -np.inf, s)) / np.exp(L[:, i0:i1, None])"), "scores ~100"),
        "rowsum(dP * P) over the current key tile only (no D vector)": _BWD.replace(
            "ds = p * (dO[:, i0:i1] @ v[:, j0:j1].swapaxes(1, 2) - Dr[:, i0:i1, None]) * scale",
            "dp = dO[:, i0:i1] @ v[:, j0:j1].swapaxes(1, 2)\n        ds = p * (dp - (dp * p).sum(axis=-1, keepdims=True)) * scale"),
    },
}
