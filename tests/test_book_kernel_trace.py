"""The kernel tracer behind T01's and T03's pictures (course/kernel_trace.py): it records exactly
the elements each thread reads and writes, leaves the kernel's results unchanged, and shows an
access past the end of an array."""

import numpy as np
import pytest

from xtrain_lessons.course.kernel_trace import TraceError, instrument, trace_kernel
from xtrain_lessons.runtime.cuda import KERNELS_DIR

ADD = r"""
extern "C" __global__ void add(const float* __restrict__ a, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (GUARD) c[i] = a[i] + 1.0f;
}
"""


def test_every_access_is_recorded_with_its_thread():
    n = 10
    a, c = np.arange(n + 2, dtype=np.float32), np.zeros(n + 2, np.float32)
    trace = trace_kernel(ADD.replace("GUARD", "i < n"), "add", (3,), (4,), (a, c, np.int32(n)))
    assert np.array_equal(c[:n], a[:n] + 1) and not c[n:].any()  # the kernel computes as written
    reads, writes = trace.accesses("a", write=False), trace.accesses("c", write=True)
    assert sorted(reads[:, 0]) == list(range(n)) and len(trace.accesses("a", write=True)) == 0
    for idx, _, bx, by, tx, ty in np.concatenate([reads, writes]):
        assert idx == bx * 4 + tx and by == ty == 0  # element i by thread i
    assert trace.counts("c", (n,), write=True).tolist() == [1] * n and trace.dropped == 0


def test_an_access_past_the_end_shows():
    n = 10
    a, c = np.zeros(n + 2, np.float32), np.zeros(n + 2, np.float32)
    trace = trace_kernel(ADD.replace("GUARD", "true"), "add", (3,), (4,), (a, c, np.int32(n)))
    assert sorted(trace.accesses("a")[:, 0]) == list(range(n + 2))
    with pytest.raises(TraceError, match=r"a\[10\] is outside its 10 elements"):
        trace.counts("a", (n,))


def test_the_package_tiled_gemm_reads_each_element_once_per_block():
    M, K, N, T = 6, 10, 8, 4
    r = np.random.default_rng(0)
    A, B = r.standard_normal((M, K)).astype(np.float32), r.standard_normal((K, N)).astype(np.float32)
    C = np.zeros((M, N), np.float32)
    args = (A, B, C, *map(np.int32, (M, N, K, K, 1, N, 1)))
    trace = trace_kernel((KERNELS_DIR / "gemm.cu").read_text(), "gemm_tiled", (2, 2), (T, T), args,
                         options=(f"-DTILE={T}",))
    np.testing.assert_allclose(C, A.astype(np.float64) @ B, rtol=1e-5, atol=1e-5)
    assert (trace.counts("A", (M, K)) == N // T).all()  # once per block column
    assert (trace.counts("B", (K, N)) == -(-M // T)).all()  # once per block row


def test_a_kernel_it_cannot_read_is_one_clear_error():
    with pytest.raises(TraceError, match="no `__global__ void missing"):
        instrument(ADD, "missing")
    with pytest.raises(TraceError, match="no pointer parameter"):
        instrument('extern "C" __global__ void k(int n) { }', "k")
