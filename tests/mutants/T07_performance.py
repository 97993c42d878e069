"""Plausible wrong solutions of T07's kernel exercise (format: tests/test_mutants.py)."""

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

MUTANTS = {
    "T07.1": {
        "every parameter decayed (n_decay ignored)": _ADAMW.replace("if (i < n_decay) theta", "theta"),
        "eps inside the square root": _ADAMW.replace("sqrtf(vi) / bc2_sqrt + eps", "sqrtf(vi + eps) / bc2_sqrt"),
        "v not written back": _ADAMW.replace("v[i] = vi;\n", ""),
        "update from the old m (m read after the store)": _ADAMW.replace("(mi / denom)", "(m[i] / denom)"),
    },
}
