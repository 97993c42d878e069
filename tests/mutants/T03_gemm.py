"""Plausible wrong solutions of T03's exercises (format: tests/test_mutants.py)."""

# the solutions' bodies; each mutant below is one plausible slip in them
_NAIVE = """
float acc = 0.0f;
for (int k = 0; k < K; k++) acc += A[row * K + k] * B[k * N + col];
C[row * N + col] = acc;
"""

_TILED = """
As[ty][tx] = (row < M && k0 + tx < K) ? A[row * K + k0 + tx] : 0.0f;
Bs[ty][tx] = (k0 + ty < K && col < N) ? B[(k0 + ty) * N + col] : 0.0f;
__syncthreads();
for (int k = 0; k < TILE; k++) acc += As[ty][k] * Bs[k][tx];
__syncthreads();
"""

MUTANTS = {
    "T03.1": {
        "B indexed as B[col * K + k] (B transposed)": _NAIVE.replace("B[k * N + col]", "B[col * K + k]"),
        "row stride N for A": _NAIVE.replace("A[row * K + k]", "A[row * N + k]"),
        "loop stops one short (k < K - 1)": _NAIVE.replace("k < K;", "k < K - 1;"),
        "C written transposed (col * M + row)": _NAIVE.replace("C[row * N + col]", "C[col * M + row]"),
        "row and col swapped (A[col * K + k], B[k * N + row])":
            _NAIVE.replace("A[row * K + k] * B[k * N + col]", "A[col * K + k] * B[k * N + row]"),
        "loop runs one past the end (k <= K)": _NAIVE.replace("k < K;", "k <= K;"),
    },
    "T03.2": {
        "no k < K bounds guard on the tile loads": _TILED.replace(" && k0 + tx < K", "").replace("k0 + ty < K && ", ""),
        "no k < K guard on the A tile only": _TILED.replace(" && k0 + tx < K", ""),
        # issue 37: loads that guard only K read past the last row of A / the last column of B;
        # the result is right, only the sanitizer the check runs (and a GPU's memory) sees them
        "no row < M guard on the A tile": (_TILED.replace("(row < M && k0 + tx < K)", "(k0 + tx < K)"),
                                           "out-of-bounds global read of A"),
        "no col < N guard on the B tile": (_TILED.replace("(k0 + ty < K && col < N)", "(k0 + ty < K)"),
                                           "out-of-bounds global read of B"),
        "first barrier missing": _TILED.replace("__syncthreads();", "", 1),
        "second barrier missing": _TILED.rsplit("__syncthreads();", 1)[0],
        "row and column swapped in the inner product (As[k][ty] * Bs[tx][k])":
            _TILED.replace("As[ty][k] * Bs[k][tx]", "As[k][ty] * Bs[tx][k]"),
        "As indexed [tx][ty] (wrong transpose)": _TILED.replace("As[ty][tx] =", "As[tx][ty] ="),
        "inner loop stops one short (k < TILE - 1)": _TILED.replace("k < TILE", "k < TILE - 1"),
    },
    "T03.3": {
        "da and db swapped": "return a.T @ dc, dc @ b.T",
        "db transposed (dc.T @ a)": "return dc @ b.T, dc.T @ a",
        "negated gradients": "return -(dc @ b.T), -(a.T @ dc)",
        "dc left out of db (a.T @ ones)": "return dc @ b.T, a.T @ np.ones_like(dc)",
        # the square case comes first: a forgotten transpose fits its shapes and is caught by value
        "transpose forgotten in dA (dc @ b)": ("return dc @ b, a.T @ dc", "square 6×6×6"),
        "dB with A instead of Aᵀ (a @ dc)": ("return dc @ b.T, a @ dc", "square 6×6×6"),
        "both transposes forgotten": ("return dc @ b, a @ dc", "square 6×6×6"),
    },
}
