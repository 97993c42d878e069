"""Plausible wrong solutions of T01's kernel exercises (format: tests/test_mutants.py)."""

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
}
