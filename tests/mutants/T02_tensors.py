"""Plausible wrong solutions of T02's exercises (format: tests/test_mutants.py)."""

_INDEX = """
int idx = rem % shape[d];
rem /= shape[d];
oa += idx * a_strides[d];
ob += idx * b_strides[d];
"""

MUTANTS = {
    "T02.1": {
        "itemsize forgotten (strides in elements)": """
            strides, step = [], 1
            for size in reversed(shape):
                strides.append(step)
                step *= size
            return tuple(reversed(strides))
        """,
        "column-major order (shape not reversed)": """
            strides, step = [], itemsize
            for size in shape:
                strides.append(step)
                step *= size
            return tuple(strides)
        """,
        "multiplied before appending (off by one axis)": """
            strides, step = [], itemsize
            for size in reversed(shape):
                step *= size
                strides.append(step)
            return tuple(reversed(strides))
        """,
    },
    "T02.2": {
        "always reinterprets the storage (a non-contiguous view too)": """
            return View(self.storage, shape, contiguous_strides(shape), self.offset)
        """,
        "always copies (a contiguous view too)": """
            return View(self.to_numpy().copy().reshape(-1), shape)
        """,
        "offset dropped": """
            if self.is_contiguous():
                return View(self.storage, shape, contiguous_strides(shape))
            return self.contiguous().reshape(shape)
        """,
    },
    "T02.3": {
        "shapes aligned on the left (no leading ones)": """
            out = []
            for x, y in zip(a, b):
                if x != y and 1 not in (x, y):
                    raise ValueError(f"shapes {a} and {b} cannot be broadcast")
                out.append(y if x == 1 else x)
            return tuple(out)
        """,
        "max of the sizes (size 0 against 1 gives 1)": """
            n = max(len(a), len(b))
            a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
            for x, y in zip(a, b):
                if x != y and 1 not in (x, y):
                    raise ValueError(f"shapes {a} and {b} cannot be broadcast")
            return tuple(max(x, y) for x, y in zip(a, b))
        """,
        "no error for incompatible sizes": """
            n = max(len(a), len(b))
            a, b = (1,) * (n - len(a)) + tuple(a), (1,) * (n - len(b)) + tuple(b)
            return tuple(y if x == 1 else x for x, y in zip(a, b))
        """,
    },
    "T02.4": {
        "divided before taking the index": _INDEX.replace("int idx = rem % shape[d];\nrem /= shape[d];",
                                                          "rem /= shape[d];\nint idx = rem % shape[d];"),
        "rem never divided (every axis sees the flat index)": _INDEX.replace("rem /= shape[d];\n", ""),
        "b's offset forgotten (b broadcast everywhere)": _INDEX.replace("ob += idx * b_strides[d];\n", ""),
    },
}
