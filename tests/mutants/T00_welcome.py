"""Plausible wrong solutions of T00's exercise (format: tests/test_mutants.py, CONTRIBUTING.md)."""

MUTANTS = {
    "T00.1": {
        "no square root": "return np.mean(x * x, axis=-1, keepdims=True)",
        "mean over the wrong axis": "return np.sqrt(np.mean(x * x, axis=0, keepdims=True))",
        "axis dropped (keepdims forgotten)": "return np.sqrt(np.mean(x * x, axis=-1))",
        "sum instead of mean": "return np.sqrt(np.sum(x * x, axis=-1, keepdims=True))",
        "mean of |x| (not a root mean square)": "return np.mean(np.abs(x), axis=-1, keepdims=True)",
    },
}
