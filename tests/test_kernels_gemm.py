"""GEMM kernels (xtrain_lessons/runtime/kernels/gemm.cu) against the float64 reference, and the backward.

Tolerances are Higham's forward-error bound for a float32 dot product of length K,
|fl(AB) − AB| ≤ K·eps·(|A|·|B|) elementwise (see `gemm_tolerance`), valid for any summation
order — nothing here was tuned on a machine. Sizes are not multiples of any tile.
"""

from __future__ import annotations

import numpy as np
import pytest

from xtrain_lessons.runtime.kernels.gemm import (
    DEFAULTS,
    VERSIONS,
    flops,
    gemm,
    gemm_backward,
    gemm_backward_reference,
    gemm_reference,
    gemm_tolerance,
    launch_config,
)

SIZES = [(37, 53, 29), (1, 1, 1), (65, 17, 130)]  # (M, K, N)
CONFIGS = [  # (version, tile settings): several block shapes per version
    (1, {}), (1, {"BLOCK_X": 32, "BLOCK_Y": 8}), (1, {"BLOCK_X": 1, "BLOCK_Y": 64}),
    (2, {}), (2, {"TILE": 8}), (2, {"TILE": 32}),
    (3, {}), (3, {"BM": 32, "BN": 32, "BK": 8, "TM": 2, "TN": 2}),
    (3, {"BM": 32, "BN": 64, "BK": 16, "TM": 4, "TN": 8}),
]


def _ids(c):
    return f"v{c[0]}-" + ("-".join(f"{k}{v}" for k, v in c[1].items()) or "default")


def _operands(m, k, n, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, k)).astype(np.float32),
            rng.standard_normal((k, n)).astype(np.float32))


def assert_within(got, ref, tol, what="C"):
    assert got.shape == ref.shape, f"{what}: shape {got.shape} != {ref.shape}"
    err = np.abs(np.asarray(got, np.float64) - np.asarray(ref, np.float64))
    bad = ~(err <= tol)  # NaN counts as bad
    if bad.any():
        i = np.unravel_index(int(np.argmax(np.where(bad, err / np.maximum(tol, 1e-300), -1))), err.shape)
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} values outside the bound; "
                             f"at {i}: |Δ| = {err[i]:.3g} > tol {tol[i]:.3g}")


@pytest.mark.parametrize("config", CONFIGS, ids=_ids)
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_versions_match_reference(config, size):
    version, cfg = config
    m, k, n = size
    a, b = _operands(m, k, n)
    c = gemm(a, b, version=version, **cfg)
    assert c.dtype == np.float32 and c.shape == (m, n)
    assert_within(c, gemm_reference(a, b), gemm_tolerance(a, b))


@pytest.mark.parametrize("version", sorted(VERSIONS))
@pytest.mark.parametrize("trans_a,trans_b", [(True, False), (False, True), (True, True)])
def test_transposed_operands(version, trans_a, trans_b):
    m, k, n = 37, 53, 29
    a, b = _operands(m, k, n, seed=1)
    a_st = np.ascontiguousarray(a.T) if trans_a else a  # stored (K, M) when transposed
    b_st = np.ascontiguousarray(b.T) if trans_b else b  # stored (N, K) when transposed
    c = gemm(a_st, b_st, version=version, trans_a=trans_a, trans_b=trans_b)
    assert_within(c, gemm_reference(a_st, b_st, trans_a, trans_b), gemm_tolerance(a, b))


def test_bound_is_not_vacuous():
    """Dropping one term of the K-sum (a classic off-by-one in a tile loop) breaks the bound."""
    m, k, n = 37, 53, 29
    a, b = _operands(m, k, n, seed=2)
    wrong = gemm_reference(a[:, :-1], b[:-1])
    with pytest.raises(AssertionError, match="outside the bound"):
        assert_within(wrong, gemm_reference(a, b), gemm_tolerance(a, b))


def test_zero_sizes():
    a, b = _operands(5, 0, 3)
    np.testing.assert_array_equal(gemm(a, b, version=2), np.zeros((5, 3), np.float32))
    a, b = _operands(0, 4, 3)
    assert gemm(a, b, version=3).shape == (0, 3)


def test_clear_errors():
    a, b = _operands(4, 5, 6)
    with pytest.raises(ValueError, match="inner dimensions"):
        gemm(a, b.T.copy())
    with pytest.raises(TypeError, match="float32"):
        gemm(a.astype(np.float64), b)
    with pytest.raises(ValueError, match="2-D"):
        gemm(a[0], b)
    with pytest.raises(ValueError, match="version"):
        gemm(a, b, version=4)
    with pytest.raises(ValueError, match="no setting"):
        gemm(a, b, version=2, BM=32)
    with pytest.raises(ValueError, match="multiple"):
        gemm(a, b, version=3, BM=30, TM=4)
    with pytest.raises(ValueError, match="dc is"):
        gemm_backward(a, b, np.zeros((4, 5), np.float32))


def test_launch_config_covers_the_output():
    for version in VERSIONS:
        grid, block, _ = launch_config(version, 65, 130)
        per_block = {1: block, 2: block,
                     3: (DEFAULTS[3]["BN"], DEFAULTS[3]["BM"])}[version]
        assert grid[0] * per_block[0] >= 130 and grid[1] * per_block[1] >= 65
        assert (grid[0] - 1) * per_block[0] < 130 and (grid[1] - 1) * per_block[1] < 65
    assert flops(37, 29, 53) == 2 * 37 * 29 * 53


# ------------------------------------------------------------------------- backward
def _central_differences(a, b, g, h=1e-3):
    """dL/dA and dL/dB of L(A, B) = sum((A·B) ⊙ G) by central differences, float64."""
    loss = lambda a_, b_: float(np.sum((a_ @ b_) * g))  # noqa: E731
    grads = []
    for x, which in ((a, 0), (b, 1)):
        gx = np.zeros_like(x)
        for i in np.ndindex(*x.shape):
            xp_, xm_ = x.copy(), x.copy()
            xp_[i] += h
            xm_[i] -= h
            args_p = (xp_, b) if which == 0 else (a, xp_)
            args_m = (xm_, b) if which == 0 else (a, xm_)
            gx[i] = (loss(*args_p) - loss(*args_m)) / (2 * h)
        grads.append(gx)
    return grads


def test_backward_formulas_vs_central_differences():
    """dA = dC·Bᵀ, dB = Aᵀ·dC in float64. L is bilinear, so central differences are exact up
    to rounding: the error is a few eps64·Σ|terms| / h."""
    rng = np.random.default_rng(3)
    m, k, n = 7, 5, 6
    a, b, g = (rng.standard_normal(s) for s in ((m, k), (k, n), (m, n)))
    da, db = gemm_backward_reference(a, b, g)
    na, nb = _central_differences(a, b, g)
    h, eps64 = 1e-3, np.finfo(np.float64).eps
    scale = (np.abs(a) @ np.abs(b) * np.abs(g)).sum()  # bounds |L| and its rounding error
    tol = 8 * eps64 * scale / h
    np.testing.assert_allclose(da, na, rtol=0, atol=tol)
    np.testing.assert_allclose(db, nb, rtol=0, atol=tol)
    # the test can fail: the classic slip dA = dC·B (not transposed) on a square case
    sq = rng.standard_normal((4, 4))
    wrong = g[:4, :4] @ sq
    assert np.abs(wrong - _central_differences(sq, sq, g[:4, :4])[0]).max() > 1e3 * tol


@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_kernel_backward_vs_reference_and_blas(version):
    rng = np.random.default_rng(4)
    m, k, n = 37, 53, 29
    a, b, dc = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (m, n)))
    da, db = gemm_backward(a, b, dc, version=version)
    ref_da, ref_db = gemm_backward_reference(a, b, dc)
    tol_da = gemm_tolerance(dc, b, trans_b=True)
    tol_db = gemm_tolerance(a, dc, trans_a=True)
    assert_within(da, ref_da, tol_da, "dA")
    assert_within(db, ref_db, tol_db, "dB")
    # BLAS (float32, its own summation order): both sides within the bound of the exact value
    assert_within(da, dc @ b.T, 2 * tol_da, "dA vs BLAS")
    assert_within(db, a.T @ dc, 2 * tol_db, "dB vs BLAS")


def test_kernel_backward_matches_autograd():
    from xtrain_lessons.autograd import ops
    from xtrain_lessons.autograd.tensor import tensor
    rng = np.random.default_rng(5)
    a, b, dc = (rng.standard_normal(s).astype(np.float32) for s in ((9, 13), (13, 11), (9, 11)))
    ta, tb = tensor(a, requires_grad=True), tensor(b, requires_grad=True)
    ops.matmul(ta, tb).backward(dc)
    da, db = gemm_backward(a, b, dc, version=3)
    assert_within(da, ta.grad, 2 * gemm_tolerance(dc, b, trans_b=True), "dA vs autograd")
    assert_within(db, tb.grad, 2 * gemm_tolerance(a, dc, trans_a=True), "dB vs autograd")


# ------------------------------------------------------------------------- GPU
def _gpu() -> bool:
    from xtrain_lessons.runtime.device import gpu_available
    return gpu_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs CuPy and an NVIDIA GPU")
@pytest.mark.parametrize("version", sorted(VERSIONS))
def test_backward_matches_cublas_on_gpu(version):
    """The course's claim: hand GEMM gradients match cuBLAS (to ~1e-7 relative)."""
    import cupy as cp
    rng = np.random.default_rng(6)
    m, k, n = 130, 257, 65
    a, b, dc = (rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (m, n)))
    da, db = gemm_backward(cp.asarray(a), cp.asarray(b), cp.asarray(dc), version=version)
    c_da, c_db = cp.asnumpy(cp.asarray(dc) @ cp.asarray(b).T), cp.asnumpy(cp.asarray(a).T @ cp.asarray(dc))
    assert_within(cp.asnumpy(da), c_da, 2 * gemm_tolerance(dc, b, trans_b=True), "dA vs cuBLAS")
    assert_within(cp.asnumpy(db), c_db, 2 * gemm_tolerance(a, dc, trans_a=True), "dB vs cuBLAS")
    c = gemm(cp.asarray(a), cp.asarray(b), version=version)
    assert_within(cp.asnumpy(c), gemm_reference(a, b), gemm_tolerance(a, b))
