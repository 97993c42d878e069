"""Exercise checks: pass / not yet / fail, the first mismatch named, the fallback returned."""

import numpy as np
import pytest

from xtrain_lessons.course.checks import (Case, ClaimFailed, Mismatch, NotYet, assert_close, check, check_fn, claim,
                                          fallback, require_solved)


def stands_for(fn, reference):
    """fn is the fallback check_fn hands on for reference (it computes the same, and is marked)."""
    return getattr(fn, "__xtrain_reference__", (None,))[0] is reference


def ref(x):
    return x * 2.0


CASES = [(np.arange(6, dtype=np.float32).reshape(2, 3),), (np.ones(4, dtype=np.float32),)]


def test_pass_returns_the_learners_function(capsys):
    mine = lambda x: x + x  # noqa: E731
    assert check_fn("T99.1 double", mine, ref, CASES) is mine
    assert capsys.readouterr().out.strip() == "✅ T99.1 double: pass (2 cases)"


def test_not_yet_returns_the_reference(capsys):
    def stub(x):
        raise NotImplementedError("T99.1 double")
    assert stands_for(check_fn("T99.1 double", stub, ref, CASES), ref)
    out = capsys.readouterr().out
    assert "⏳ T99.1 double: not yet" in out and "using the reference version" in out


def test_fail_names_shape(capsys):
    assert stands_for(check_fn("T99.1 double", lambda x: x.sum(), ref, CASES), ref)
    out = capsys.readouterr().out
    assert "❌ T99.1 double: fail — case 1: output: shape () ≠ expected (2, 3)" in out


def test_fail_names_largest_error_and_where(capsys):
    def wrong(x):
        y = x * 2.0
        y[1, 2] += 1.0
        return y
    check_fn("T99.1 double", wrong, ref, CASES)
    out = capsys.readouterr().out
    assert "max |Δ| = 1 at index (1, 2)" in out and "got 11, expected 10" in out


def test_crash_is_reported_as_fail(capsys):
    check_fn("T99.1 double", lambda x: x.nope(), ref, CASES)
    assert "fail — case 1: AttributeError" in capsys.readouterr().out


def test_keyword_cases(capsys):
    assert check_fn("T99.2 kw", lambda x: 2 * x, ref, [{"x": np.ones(3)}])(1) == 2


def test_assert_close_tolerance_from_dtype():
    x = np.float32(1.0)
    assert_close(np.float32(x + 4e-6), x)  # within float32 tolerance
    with pytest.raises(Mismatch):
        assert_close(np.float64(1 + 1e-9), np.float64(1.0))  # float64 is held tighter
    with pytest.raises(Mismatch, match="dtype"):
        assert_close(np.array([1.5]), np.array([1]))


def test_assert_close_nan_mismatch_is_reported():
    with pytest.raises(Mismatch, match="index \\(1,\\)"):
        assert_close(np.array([1.0, np.nan]), np.array([1.0, 2.0]))


def test_assert_close_sequences():
    assert_close((np.ones(2), np.zeros(3)), (np.ones(2), np.zeros(3)))
    with pytest.raises(Mismatch, match=r"output\[1\]: shape"):
        assert_close((np.ones(2), np.zeros(2)), (np.ones(2), np.zeros(3)))


def test_require_solved_detects_cuda_stub(capsys):
    src = "__global__ void k(float* a){ /* EXERCISE T01.1 vector_add: your code here (about 3 lines) */ }"
    with pytest.raises(NotYet):
        require_solved(src)
    require_solved("__global__ void k(float* a){ a[0] = 1; }")
    assert check("T01.1 vector_add", lambda: require_solved(src)) is False
    assert "⏳ T01.1 vector_add: not yet — T01.1 vector_add is still a stub" in capsys.readouterr().out


def test_check_plain_assert_is_fail(capsys):
    def test():
        assert 1 == 2, "one is not two"
    assert check("T99.3 x", test) is False
    assert "❌ T99.3 x: fail — one is not two" in capsys.readouterr().out


def test_require_names_the_missing_package():
    from xtrain_lessons.course.deps import MissingDependency, require
    assert require("numpy", "these cells") is np
    with pytest.raises(MissingDependency) as info:
        require("no_such_package_xyz", "the parity cells")
    lines = info.value._render_traceback_()
    assert len(lines) == 1 and "no_such_package_xyz is not installed (needed by the parity cells)" in lines[0]
    assert 'pip install -e ".[course]"' in lines[0]


def test_composed_check_says_not_yet_with_only_reference_pieces(capsys):
    from xtrain_lessons.course.checks import check_composed
    ns = {"double": ref}
    assert check_composed("T99 composed", lambda: None, {"double": ref}, ns) is False
    assert "⏳ T99 composed: not yet — built from the reference pieces" in capsys.readouterr().out


def test_composed_check_names_the_piece_that_differs(capsys):
    from xtrain_lessons.course.checks import check_composed

    def square(x):
        return x * x
    ns = {"double": lambda x: x * 2.0, "square": lambda x: x * x * 1.5}
    refs = {"double": ref, "square": square}

    def test():
        assert_close(ns["square"](ns["double"](np.ones(3))), np.full(3, 4.0), what="composed")
    assert check_composed("T99 composed", test, refs, ns) is False
    out = capsys.readouterr().out
    assert "❌ T99 composed: fail — your square differs" in out and "True" not in out


def test_strict_check_rejects_an_overflowing_formula(capsys):
    def sigmoid_ref(a):
        return 0.5 * (1 + np.tanh(0.5 * a))
    naive = lambda a: 1 / (1 + np.exp(-a))  # noqa: E731
    assert check_fn("T99.3 sigmoid", naive, sigmoid_ref, [(np.array([-200.0, 0.0], np.float32),)],
                    strict=True) is not naive
    assert "overflow encountered in exp" in capsys.readouterr().out


def test_float_dtype_and_named_outputs():
    with pytest.raises(Mismatch, match="dtype float64 ≠ expected float32"):
        assert_close(np.ones(2), np.ones(2, np.float32))
    with pytest.raises(Mismatch, match=r"^dk: "):
        assert_close((np.ones(2), np.zeros(2)), (np.ones(2), np.ones(2)), names=("dq", "dk"))


def test_kernel_failure_lists_the_causes_and_the_sanitizer(capsys):
    def test():
        require_solved("__global__ void k(float* a){ a[0] = 1; }")
        assert_close(np.array([np.nan]), np.array([1.0]), what="C")
    check("T99.4 kernel", test)
    out = capsys.readouterr().out
    assert "bounds guard" in out and "__syncthreads()" in out and "XTRAIN_SANITIZE=1" in out


def test_widest_reduction_tells_a_streamed_softmax_from_a_full_one():
    from xtrain_lessons.course.checks import widest_reduction

    def full(x, chunk):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def streamed(x, chunk):
        m = np.full(x.shape[:-1], -np.inf)
        for j in range(0, x.shape[-1], chunk):
            m = np.maximum(m, x[..., j:j + chunk].max(axis=-1))
        return m
    x = np.random.default_rng(0).standard_normal((3, 50))
    assert widest_reduction(full, x, 8) == 50 and widest_reduction(streamed, x, 8) == 8


def test_ufunc_passes_logs_each_pass_with_its_bytes_and_rows():
    from xtrain_lessons.course.array_watch import ufunc_passes

    a, b = np.ones((6, 4), np.float32), np.ones((6, 4), np.float32)

    def whole(x, y):
        return x * y + 1

    def blocks(x, y):
        out = np.empty_like(x)
        for lo in range(0, 6, 2):
            np.multiply(x[lo:lo + 2], y[lo:lo + 2], out=out[lo:lo + 2])
            out[lo:lo + 2] += 1
        return out

    result, passes = ufunc_passes(whole, a, b)
    assert np.array_equal(np.asarray(result), a * b + 1)
    assert passes == [(3 * a.nbytes, 6), (2 * a.nbytes, 6)]  # a * b (two in, one out), then + 1
    result, passes = ufunc_passes(blocks, a, b)
    assert np.array_equal(np.asarray(result), a * b + 1)
    assert len(passes) == 6 and max(rows for _, rows in passes) == 2


def test_a_claim_prints_when_it_holds_and_raises_with_its_figures_when_not(capsys):
    claim("two is more than one", 2 > 1, "2 vs 1")
    assert capsys.readouterr().out == "✔ two is more than one\n"  # the figures only on a failure
    with pytest.raises(ClaimFailed, match=r"claim does not hold: one is more than two \(1 vs 2\)"):
        claim("one is more than two", np.bool_(1 > 2), "1 vs 2")
    assert capsys.readouterr().out == ""


def test_a_named_case_names_itself_and_its_hint_on_a_failure(capsys):
    def careless_softmax(x):
        e = np.exp(x)
        return e / e.sum(axis=-1, keepdims=True)

    def softmax(x):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    small = np.array([[0.5, -1.0, 2.0]], np.float32)
    big = Case(small * np.float32(1000), label="logits ~1000", hint="subtract the row maximum before exp")
    with np.errstate(all="ignore"):
        assert stands_for(check_fn("softmax", careless_softmax, softmax, [(small,), big]), softmax)
    out = capsys.readouterr().out
    assert "fail — case 2 (logits ~1000)" in out and "subtract the row maximum before exp" in out
    assert check_fn("softmax", softmax, softmax, [(small,), big]) is softmax
    assert "pass (2 cases)" in capsys.readouterr().out


# The T03.2 mistake of issue 36: tile loads without the k < K guard read past the end of B (and of
# A's last row). Unsanitized, what they read is whatever lies there, so a check comparing values
# passed or failed by the memory beyond the arrays; these tests run it 20 times each way.
NO_K_GUARD = r'''
#define TILE 16
extern "C" __global__ void matmul_tiled(const float* A, const float* B, float* C, int M, int N, int K) {
    __shared__ float As[TILE][TILE];
    __shared__ float Bs[TILE][TILE];
    int tx = threadIdx.x, ty = threadIdx.y;
    int row = blockIdx.y * TILE + ty, col = blockIdx.x * TILE + tx;
    float acc = 0.0f;
    for (int k0 = 0; k0 < K; k0 += TILE) {
        As[ty][tx] = (row < M) ? A[row * K + k0 + tx] : 0.0f;
        Bs[ty][tx] = (col < N) ? B[(k0 + ty) * N + col] : 0.0f;
        __syncthreads();
        for (int k = 0; k < TILE; k++) acc += As[ty][k] * Bs[k][tx];
        __syncthreads();
    }
    if (row < M && col < N) C[row * N + col] = acc;
}
'''
WRITES_PAST_THE_END = r'''
extern "C" __global__ void fill(float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n) y[i] = 1.0f;   // BUG: <= writes y[n]
}
'''


def _no_k_guard_check(sanitize: bool) -> bool:
    from xtrain_lessons.course.checks import poisoned
    from xtrain_lessons.runtime.cuda import Kernel

    kernel = Kernel(NO_K_GUARD, "matmul_tiled", backend="cpu", sanitize=sanitize)
    r = np.random.default_rng(0)
    a, b = r.standard_normal((37, 53)).astype(np.float32), r.standard_normal((53, 29)).astype(np.float32)

    def test():
        c = poisoned(np.zeros((37, 29), np.float32), "C")
        kernel((2, 3), (16, 16), (poisoned(a, "A"), poisoned(b, "B"), c, np.int32(37), np.int32(29), np.int32(53)))
        assert_close(c, a @ b, atol=1e-4, rtol=1e-4, what="C")
    return check("T03.2 without the k guard", test)


@pytest.mark.parametrize("sanitize", [False, True], ids=["poisoned padding", "sanitizer"])
def test_a_read_past_the_end_fails_the_check_every_time(sanitize, capsys):
    verdicts = [_no_k_guard_check(sanitize) for _ in range(20)]
    lines = capsys.readouterr().out.splitlines()
    assert verdicts == [False] * 20
    fails = [ln for ln in lines if ln.startswith("❌ T03.2 without the k guard: fail")]
    assert len(fails) == 20 and len(set(fails)) == 1, "the same report every run"
    if sanitize:  # the sanitizer names the first bad read, block and thread
        assert "out-of-bounds global read of B[1537]" in fails[0] and "thread (0,5,0)" in fails[0]
    else:  # NaN read from the poison around B
        assert "got nan" in fails[0]


def test_poisoned_padding_finds_a_write_past_the_end(capsys):
    from xtrain_lessons.course.checks import poisoned
    from xtrain_lessons.runtime.cuda import Kernel

    kernel = Kernel(WRITES_PAST_THE_END, "fill", backend="cpu", sanitize=False)

    def test():
        y = poisoned(np.zeros(1000, np.float32), "y")
        kernel((4,), (256,), (y, np.int32(1000)))
        assert_close(y, np.ones(1000, np.float32), what="y")
    assert check("T99.5 fill", test) is False
    assert "the kernel wrote past the end of y (y[1000]; it has 1000 elements)" in capsys.readouterr().out


def test_poisoned_keeps_values_dtype_and_shape_with_poison_on_both_sides():
    from xtrain_lessons.course.checks import poisoned

    for dtype in (np.float32, np.int32, np.uint16):
        x = np.arange(12, dtype=dtype).reshape(3, 4)
        y = poisoned(x, "x")
        assert y.dtype == x.dtype and y.shape == x.shape and np.array_equal(y, x) and y.flags.c_contiguous
        raw = y.base  # the bytes around it: 0xFF (NaN, -1, 0xFFFF), at least 4096 elements each side
        start = y.ctypes.data - raw.ctypes.data
        assert start >= 4096 * x.itemsize and raw.size - start - y.nbytes >= 4096 * x.itemsize
        assert (raw[:start] == 0xFF).all() and (raw[start + y.nbytes:] == 0xFF).all()


# --- issue 37: every ✅ earned, every failure explained ---------------------------------------------

def test_a_check_that_ran_on_a_fallback_says_not_yet_and_names_it(capsys):
    def stub(x):
        raise NotImplementedError
    double = check_fn("T99.1 double", stub, ref, CASES)
    capsys.readouterr()

    def follow_up():
        assert_close(double(np.ones(2, np.float32)), np.full(2, 2, np.float32))
    assert check("T99.1 double twice", follow_up) is False
    out = capsys.readouterr().out
    assert out.startswith("⏳ T99.1 double twice: not yet — it ran on the reference T99.1 double") and "✅" not in out
    # the learner's own function that passes is handed on as it is, and a check on it says ✅
    mine = check_fn("T99.1 double", lambda x: x + x, ref, CASES)
    capsys.readouterr()
    double = mine
    assert check("T99.1 double twice", follow_up) is True
    assert capsys.readouterr().out.startswith("✅ T99.1 double twice: pass")


def test_a_learners_function_on_a_fallback_passes_as_not_yet_and_is_handed_on(capsys):
    square = fallback(lambda x: x * x, "T99.2 square")

    def mine(x):  # the learner's, built on the reference of an earlier exercise
        return square(x) * 2.0
    assert check_fn("T99.3 two squares", mine, lambda x: 2.0 * x * x, CASES) is mine
    assert capsys.readouterr().out.startswith("⏳ T99.3 two squares: not yet — it ran on the reference T99.2 square")


def test_a_check_of_code_that_is_not_the_learners_prints_another_mark(capsys):
    assert check("package kernels vs NumPy", lambda: None, yours=False) is True
    assert check_fn("T99.1 double (worked solution)", lambda x: 2 * x, ref, CASES, yours=False)
    out = capsys.readouterr().out
    assert "✅" not in out and out.count("✔ ") == 2


def test_a_fallback_kernel_object_keeps_its_attributes(capsys):
    class Kernel:
        array_module = np

        def __call__(self, x):
            return x + 1
    k = fallback(Kernel(), "T99.4 kernel")
    assert k.array_module is np
    assert check("T99.4 kernel used", lambda: k(1)) is False
    assert "it ran on the reference T99.4 kernel" in capsys.readouterr().out


def test_a_function_that_changes_its_input_in_place_fails(capsys):
    def mask(t, n):  # the text asks for a copy
        t[:, n:] = -100
        return t
    t = np.arange(8).reshape(2, 4)
    check_fn("T99.5 mask", mask, lambda t, n: np.where(np.arange(4) < n, t, -100),
             [Case(t, 2, label="two rows", hint="copy first")])
    out = capsys.readouterr().out
    assert "your function changed its input t in place" in out and "copy first" in out
    assert np.array_equal(t, np.arange(8).reshape(2, 4)), "the case's array is given back"
    # a parameter the exercise updates in place is allowed to change
    def step(p, g):
        p -= g
        return p.copy()
    assert check_fn("T99.6 step", step, lambda p, g: p - g, [Case(np.ones(3), np.ones(3), label="ones")],
                    in_place=("p",)) is step


def test_a_crash_names_the_case_its_arguments_and_the_line(capsys):
    def rope(x, pos):
        angles = pos[:, None] * np.ones(3)
        return x * np.cos(angles).reshape(7)  # the learner's mistake
    check_fn("T99.7 rope", rope, lambda x, pos: x, [Case(np.ones((4, 3)), np.arange(4.0), label="4 positions")])
    out = capsys.readouterr().out
    assert "case 1 (4 positions): ValueError" in out
    assert "in rope()" in out and "`return x * np.cos(angles).reshape(7)  # the learner's mistake`" in out
    assert "arguments x: float64 (4, 3), pos: float64 (4,)" in out


def test_an_invalid_value_is_called_a_nan_not_an_overflow(capsys):
    def careless(x):
        m = x.max(axis=-1, keepdims=True)
        e = np.exp(x - m) * (m > -np.inf)  # -inf - -inf: NaN for an all -inf row
        return e / e.sum(axis=-1, keepdims=True)
    check_fn("T99.8 softmax", careless, lambda x: np.full_like(x, 0.5),
             [Case(np.full((1, 2), -np.inf), label="all -inf row")], strict=True)
    out = capsys.readouterr().out
    assert "invalid value" in out and "0/0" in out and "overflow" not in out


def test_integer_widths_and_tensors_are_compared():
    with pytest.raises(Mismatch, match="dtype uint32 ≠ expected uint16"):
        assert_close(np.array([1, 2], np.uint32), np.array([1, 2], np.uint16))
    assert_close(np.int32(3), 3)  # a Python int expected: any integer width
    from xtrain_lessons.autograd.tensor import Tensor
    with pytest.raises(Mismatch, match="autograd Tensor where an array is expected"):
        assert_close(Tensor(np.ones(2, np.float32)), np.ones(2, np.float32))


def test_a_mismatch_shows_enough_digits_to_see_the_difference():
    with pytest.raises(Mismatch, match=r"got -0\.11061, expected -0\.11061001;"):
        assert_close(np.array([-0.11061]), np.array([-0.11061001]), what="theta")


def test_product_entries_counts_the_scores_a_tiled_attention_computes():
    from xtrain_lessons.course.checks import product_entries

    r = np.random.default_rng(0)
    q, k, v = (r.standard_normal((32, 4)) for _ in range(3))

    def tiled(q, k, v, tile, skip):
        out = np.zeros_like(q)
        for i0 in range(0, 32, tile):
            for j0 in range(0, i0 + tile if skip else 32, tile):
                s = q[i0:i0 + tile] @ k[j0:j0 + tile].T       # scores: counted
                out[i0:i0 + tile] += np.exp(s - 10) @ v[j0:j0 + tile]   # with v: not counted
        return out
    assert product_entries(tiled, q, k, v, 8, False) == 32 * 32
    assert product_entries(tiled, q, k, v, 8, True) == 8 * 8 * (1 + 2 + 3 + 4)
    assert product_entries(lambda a, b: np.einsum("td,sd->ts", a, b), q, k) == 32 * 32
