"""Plausible wrong solutions of T06's exercises (format: tests/test_mutants.py)."""

_CE = """
m = z.max(axis=1, keepdims=True)
lse = m[:, 0] + np.log(np.exp(z - m).sum(axis=1))
return np.mean(lse - z[np.arange(len(t)), t]).astype(logits.dtype)
"""
_ADAMW = """
theta = theta * (1 - lr * weight_decay)
m = b1 * m + (1 - b1) * grad
v = b2 * v + (1 - b2) * grad * grad
m_hat = m / (1 - b1 ** t)
v_hat = v / (1 - b2 ** t)
theta = theta - lr * m_hat / (np.sqrt(v_hat) + eps)
return theta, m, v
"""
_LR = """
if t < warmup:
    return max_lr * t / warmup
if t > cosine_steps:
    return min_lr
frac = (t - warmup) / (cosine_steps - warmup)
return min_lr + 0.5 * (1 + math.cos(math.pi * frac)) * (max_lr - min_lr)
"""
_CLIP = """
grads = [p.grad for p in params if p.grad is not None]
norm = math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))
scale = max_norm / (norm + eps)
if scale < 1.0:
    for g in grads:
        g *= g.dtype.type(scale)
return norm
"""
_BATCH = """
starts = rng.integers(0, len(tokens) - seq_len, size=batch_size)
idx = starts[:, None] + np.arange(seq_len + 1)
win = np.asarray(tokens[idx], dtype=np.int64)
return win[:, :-1], win[:, 1:]
"""
_TOPP = """
if p >= 1.0:
    return logits.copy()
order = np.argsort(-logits, kind="stable")
probs = np.exp(logits - logits.max())
probs = probs[order] / probs.sum()
before = np.cumsum(probs) - probs
out = logits.copy()
out[order[before >= p]] = -np.inf
return out
"""

MUTANTS = {
    "T06.1": {
        "no max subtracted (overflows)": (_CE.replace("m = z.max(axis=1, keepdims=True)", "m = 0 * z[:, :1]"),
                                          "logits ~100"),
        "the maximum of the whole batch, not of each row": (_CE.replace("z.max(axis=1, keepdims=True)", "z.max() + 0 * z[:, :1]"),
                                                            "all-negative rows"),
        "the row maximum clipped at 0": (_CE.replace("z.max(axis=1, keepdims=True)",
                                                     "np.maximum(z.max(axis=1, keepdims=True), 0)"),
                                         "all-negative rows"),
        "float64 result for float32 logits": _CE.replace(".astype(logits.dtype)", ".astype(np.float64)"),
        "sum over positions instead of mean": _CE.replace("np.mean(", "np.sum("),
        "max subtracted but not added back": _CE.replace("lse = m[:, 0] + ", "lse = "),
    },
    "T06.2": {
        "no bias correction": _ADAMW.replace("m / (1 - b1 ** t)", "m").replace("v / (1 - b2 ** t)", "v"),
        "L2 penalty in the gradient (Adam, not AdamW)": _ADAMW.replace(
            "theta = theta * (1 - lr * weight_decay)\n", "grad = grad + weight_decay * theta\n"),
        "eps inside the square root": _ADAMW.replace("(np.sqrt(v_hat) + eps)", "np.sqrt(v_hat + eps)"),
        "weight decay without the learning rate": _ADAMW.replace("(1 - lr * weight_decay)", "(1 - weight_decay)"),
        # issue 37: the text asks for new arrays; updating the caller's in place must fail
        "theta, m and v updated in place": ("""
            theta *= 1 - lr * weight_decay
            m *= b1
            m += (1 - b1) * grad
            v *= b2
            v += (1 - b2) * grad * grad
            theta -= lr * (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
            return theta, m, v
        """, "in place"),
    },
    "T06.3": {
        "warmup off by one ((t + 1) / warmup)": _LR.replace("max_lr * t / warmup", "max_lr * (t + 1) / warmup"),
        "cosine from 0 to max_lr (min_lr forgotten)": _LR.replace(
            "min_lr + 0.5 * (1 + math.cos(math.pi * frac)) * (max_lr - min_lr)",
            "0.5 * (1 + math.cos(math.pi * frac)) * max_lr"),
        "cosine progress over cosine_steps, not after warmup": _LR.replace(
            "(t - warmup) / (cosine_steps - warmup)", "t / cosine_steps"),
    },
    "T06.4": {
        "always rescaled (small gradients scaled up)": _CLIP.replace("if scale < 1.0:\n", "if True:\n"),
        "norm returned after clipping": _CLIP.replace("return norm", "return min(norm, float(max_norm))"),
        "each gradient clipped by its own norm": """
            norms = []
            for p in params:
                if p.grad is None:
                    continue
                n = float(np.sqrt(np.sum(p.grad.astype(np.float64) ** 2)))
                norms.append(n)
                if n > max_norm:
                    p.grad *= p.grad.dtype.type(max_norm / (n + eps))
            return math.sqrt(sum(n * n for n in norms))
        """,
        # issue 37: the text asks for a float64 sum; in float32 the squares of a spike overflow
        "squares summed in float32": (_CLIP.replace("g.astype(np.float64) ** 2", "g * g"), "float64"),
        "np.linalg.norm of each float32 gradient": (_CLIP.replace(
            "math.sqrt(sum(float(np.sum(g.astype(np.float64) ** 2)) for g in grads))",
            "math.sqrt(sum(float(np.linalg.norm(g)) ** 2 for g in grads))"), "float64"),
        "sum of squares without the square root": _CLIP.replace("norm = math.sqrt(", "norm = float(").replace(
            "for g in grads))", "for g in grads))"),
    },
    "T06.5": {
        "last window not allowed (len - seq_len - 1)": _BATCH.replace("len(tokens) - seq_len,", "len(tokens) - seq_len - 1,"),
        "y not shifted (y = x)": _BATCH.replace("return win[:, :-1], win[:, 1:]", "return win[:, :-1], win[:, :-1]"),
        "global NumPy RNG instead of rng": _BATCH.replace("rng.integers(", "np.random.randint(").replace(
            ", size=batch_size)", ", size=batch_size)"),
        "token ids left in the stream's dtype": _BATCH.replace(", dtype=np.int64)", ")"),
    },
    "T06.6": {
        "cumulative mass includes the token itself (drops the one that crosses p)": _TOPP.replace(
            "np.cumsum(probs) - probs", "np.cumsum(probs)"),
        "tokens not sorted by probability": _TOPP.replace('np.argsort(-logits, kind="stable")', "np.arange(len(logits))"),
        "strict > p (keeps one token too many at exactly p)": _TOPP.replace("before >= p", "before > p"),
        "p = 1 not special-cased and mass from unnormalised exp": _TOPP.replace(
            "probs[order] / probs.sum()", "probs[order]"),
        "no max subtracted (exp of the raw logits)": (_TOPP.replace("np.exp(logits - logits.max())", "np.exp(logits)"),
                                                      "logits ~1000"),
        "the maximum clipped at 0": (_TOPP.replace("np.exp(logits - logits.max())",
                                                   "np.exp(logits - max(logits.max(), 0.0))"),
                                     "all-negative logits"),
    },
}
