"""Plausible wrong solutions of T01's kernel exercises (format: tests/test_mutants.py)."""

_SUM = """
s[t] = (i < n) ? x[i] : 0.0f;
__syncthreads();
for (int stride = blockDim.x / 2; stride > 0; stride /= 2) {
    if (t < stride) s[t] += s[t + stride];
    __syncthreads();
}
if (t == 0) out[blockIdx.x] = s[0];
"""

MUTANTS = {
    "T01.1": {
        "no bounds guard": """
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            c[i] = a[i] + b[i];
        """,
        "off-by-one guard (i <= n)": """
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i <= n) c[i] = a[i] + b[i];
        """,
        "index without the block offset": """
            int i = threadIdx.x;
            if (i < n) c[i] = a[i] + b[i];
        """,
        "blockIdx * blockIdx (wrong index)": """
            int i = blockIdx.x * blockIdx.x + threadIdx.x;
            if (i < n) c[i] = a[i] + b[i];
        """,
    },
    "T01.2": {
        "no grid-stride loop (one element per thread)": """
            int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i < n) y[i] = alpha * x[i] + y[i];
        """,
        "stride of one block": """
            for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x) {
                y[i] = alpha * x[i] + y[i];
            }
        """,
        "y overwritten, not updated": """
            int stride = gridDim.x * blockDim.x;
            for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = alpha * x[i];
        """,
        "loop bound off by one (i <= n)": """
            int stride = gridDim.x * blockDim.x;
            for (int i = blockIdx.x * blockDim.x + threadIdx.x; i <= n; i += stride) {
                if (i < n) y[i] = alpha * x[i] + y[i]; else y[0] += 1.0f;
            }
        """,
    },
    "T01.3": {
        "no barrier after the load": _SUM.replace("0.0f;\n__syncthreads();", "0.0f;"),
        "no barrier inside the tree": _SUM.replace("s[t + stride];\n    __syncthreads();", "s[t + stride];"),
        "elements past n not zeroed (unguarded load)": _SUM.replace("(i < n) ? x[i] : 0.0f", "x[i]"),
        "the tree starts at blockDim.x (past the shared array)": _SUM.replace("blockDim.x / 2", "blockDim.x"),
        "the block offset forgotten (x[t])": _SUM.replace("(i < n) ? x[i] : 0.0f", "(i < n) ? x[t] : 0.0f"),
        "the result written before the tree": _SUM.replace("if (t == 0) out[blockIdx.x] = s[0];\n", "").replace(
            "__syncthreads();\nfor", "__syncthreads();\nif (t == 0) out[blockIdx.x] = s[0];\nfor"),
    },
}
