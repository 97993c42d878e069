"""Which thread reads and writes which element of a kernel's arrays, traced on the CPU emulator:
the pictures of T01 and T03 are drawn from the learner's own kernel, as GPU-Puzzles draws its
puzzles from the learner's code.

    trace = trace_kernel(VECTOR_ADD_SRC, "vector_add", (3,), (4,), (a, b, c, np.int32(10)))
    trace.accesses("a")        # rows (index, is_write, bx, by, tx, ty), in the order they happened
    trace.counts("A", (M, K))  # how many times each element was read (writes: write=True)

Every pointer parameter `T* p` of the kernel becomes, inside its body, a small C++ object whose
`p[i]` records the access (array, index, block, thread, read or write) in a log passed as one
more argument, then reads or writes the element as before. The body is compiled as written, so
the picture is of the kernel the learner wrote. Only `p[i]` is seen (not `*(p + i)`); accesses
past the log's capacity are counted but not recorded. Runs on the emulator whatever the device.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from xtrain_lessons.runtime.cuda import Kernel

__all__ = ["trace_kernel", "Trace", "TraceError"]

FIELDS = 7  # array id, index, write, blockIdx.x, blockIdx.y, threadIdx.x, threadIdx.y

_PROXY = r"""
template <class T> struct xt_tref {
    T* p; int* log; int id; long long i;
    void note(int write) const {
        int slot = atomicAdd(&log[0], 1);
        if (slot < log[1]) {
            int* e = log + 2 + 7 * slot;
            e[0] = id; e[1] = (int)i; e[2] = write;
            e[3] = blockIdx.x; e[4] = blockIdx.y; e[5] = threadIdx.x; e[6] = threadIdx.y;
        }
    }
    operator T() const { note(0); return p[i]; }
    template <class U> xt_tref& operator=(U v) { note(1); p[i] = v; return *this; }
    xt_tref& operator=(const xt_tref& o) { T v = o; return *this = v; }
    template <class U> xt_tref& operator+=(U u) { T v = *this; v += u; return *this = v; }
    template <class U> xt_tref& operator-=(U u) { T v = *this; v -= u; return *this = v; }
    template <class U> xt_tref& operator*=(U u) { T v = *this; v *= u; return *this = v; }
    template <class U> xt_tref& operator/=(U u) { T v = *this; v /= u; return *this = v; }
};
template <class T> struct xt_traced {
    T* p; int* log; int id;
    xt_tref<T> operator[](long long i) const { return xt_tref<T>{p, log, id, i}; }
};
"""

_SIGNATURE = r"__global__\s+void\s+{name}\s*\((?P<params>[^)]*)\)\s*\{{"
_POINTER = re.compile(r"^(?P<type>[\w\s]+?)\s*\*\s*(?:__restrict__\s+)?(?P<name>\w+)$")


class TraceError(ValueError):
    """A kernel whose source the tracer cannot instrument."""


@dataclass
class Trace:
    arrays: list[str]     # the pointer parameters, in order
    log: np.ndarray       # (n, FIELDS) int32 rows
    dropped: int          # accesses past the log's capacity

    def accesses(self, array: str, write: bool | None = None) -> np.ndarray:
        """(index, is_write, bx, by, tx, ty) rows of one array (only reads or writes if asked)."""
        rows = self.log[self.log[:, 0] == self.arrays.index(array)][:, 1:]
        return rows if write is None else rows[rows[:, 1] == int(write)]

    def counts(self, array: str, shape, write: bool = False) -> np.ndarray:
        """How many times each element of `array` (viewed as `shape`) was read (or written)."""
        idx = self.accesses(array, write)[:, 0]
        size = int(np.prod(shape))
        if len(idx) and (idx.min() < 0 or idx.max() >= size):
            bad = idx[(idx < 0) | (idx >= size)]
            raise TraceError(f"{array}[{int(bad[0])}] is outside its {size} elements: the kernel reads or "
                             f"writes past the end ({len(bad)} accesses)")
        return np.bincount(idx, minlength=size).reshape(shape)


def instrument(source: str, name: str) -> tuple[str, list[str]]:
    """The kernel's source with its pointer parameters traced, and their names."""
    m = re.search(_SIGNATURE.format(name=re.escape(name)), source)
    if m is None:
        raise TraceError(f"no `__global__ void {name}(...)` in the source")
    params, pointers, decls = [], [], []
    for raw in (p.strip() for p in m["params"].split(",") if p.strip()):
        pm = _POINTER.match(raw)
        if pm is None:
            params.append(raw)
            continue
        base, pname = pm["type"].strip(), pm["name"]
        params.append(f"{base}* {pname}__raw")
        decls.append(f"xt_traced<{base}> {pname}{{{pname}__raw, xt_trace_log, {len(pointers)}}};")
        pointers.append(pname)
    if not pointers:
        raise TraceError(f"{name} has no pointer parameter to trace")
    head = source[:m.start("params")] + ", ".join(params + ["int* xt_trace_log"]) + ") {\n    " + " ".join(decls)
    return _PROXY + head + source[m.end():], pointers


def trace_kernel(source: str, name: str, grid, block, args, *, options=(), capacity: int = 1 << 16) -> Trace:
    """Launch `name` from `source` on the emulator with NumPy `args`, recording every p[i]."""
    text, pointers = instrument(source, name)
    log = np.zeros(2 + FIELDS * capacity, np.int32)
    log[1] = capacity
    Kernel(text, name, options=tuple(options), backend="cpu")(tuple(grid), tuple(block), (*args, log))
    n = int(log[0])
    return Trace(pointers, log[2:2 + FIELDS * min(n, capacity)].reshape(-1, FIELDS).copy(), max(0, n - capacity))
