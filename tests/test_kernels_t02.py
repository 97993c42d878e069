"""T02 kernels against their NumPy references: broadcasting elementwise ops, naive and tiled
transpose, embedding gather and scatter-add — at awkward sizes and several block sizes.

The kernels run on the CPU emulator (compiled once into the user cache); nvcc compiles the same
.cu files in test_nvcc_compile.py.
"""

from __future__ import annotations

import numpy as np
import pytest

from xtrain_lessons.runtime.kernels.elementwise import (
    OPS,
    binary_op,
    binary_op_reference,
    broadcast_shape,
    broadcast_strides,
)
from xtrain_lessons.runtime.kernels.embedding import (
    embedding_backward,
    embedding_backward_reference,
    embedding_forward,
    embedding_forward_reference,
)
from xtrain_lessons.runtime.kernels.transpose import transpose, transpose_reference

F32_EPS = float(np.finfo(np.float32).eps)


def rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# ------------------------------------------------------------------ broadcasting
@pytest.mark.parametrize("a, b", [((3,), (4,)), ((2, 3), (3, 2)), ((5, 1, 3), (1, 4, 2))])
def test_broadcast_shape_rejects_incompatible(a, b):
    with pytest.raises(ValueError):
        np.broadcast_shapes(a, b)  # the rule we copy agrees
    with pytest.raises(ValueError, match="cannot be broadcast"):
        broadcast_shape(a, b)


@pytest.mark.parametrize("a, b", [((), ()), ((1,), (5,)), ((3, 1, 5), (4, 1)), ((7,), (2, 3, 7)),
                                  ((1, 1), (1,)), ((8, 1, 6, 1), (7, 1, 5)), ((0, 3), (1, 3))])
def test_broadcast_shape_matches_numpy(a, b):
    assert broadcast_shape(a, b) == np.broadcast_shapes(a, b)


def test_broadcast_strides_match_numpy_broadcast_to():
    for shape, out in [((4, 1), (3, 4, 5)), ((3, 1, 5), (3, 4, 5)), ((5,), (2, 5)), ((1,), (6,))]:
        view = np.broadcast_to(np.empty(shape, np.float32), out)
        assert broadcast_strides(shape, out) == tuple(s // 4 for s in view.strides)


# ------------------------------------------------------------------ elementwise kernel
SHAPES = [((1,), (1,)), ((1, 1), (1, 1)), ((33, 65), (33, 65)), ((100, 37), (37,)), ((100, 37), (100, 1)),
          ((3, 1, 5), (4, 1)), ((4, 1), (3, 1, 5)), ((2, 1, 3, 1), (5, 1, 7)), ((1,), (257,)), ((), (3, 2))]


@pytest.mark.parametrize("sa, sb", SHAPES, ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_binary_op_matches_numpy(sa, sb, op):
    a, b = rand(sa, 1), rand(sb, 2)
    if op == "divide":
        b = np.where(np.abs(b) < 0.1, np.float32(0.5), b)
    got, want = binary_op(a, b, op), binary_op_reference(a, b, op)
    assert got.shape == want.shape and got.dtype == np.float32
    np.testing.assert_array_equal(got, want)  # one IEEE op per element: bit-identical


@pytest.mark.parametrize("block", [1, 32, 100, 1024])
def test_binary_op_block_sizes(block):
    a, b = rand((3, 1, 5), 3), rand((4, 1), 4)
    np.testing.assert_array_equal(binary_op(a, b, "multiply", block=block), a * b)


def test_binary_op_clear_errors():
    a = rand((4, 3))
    with pytest.raises(TypeError, match="float32"):
        binary_op(a.astype(np.float64), a)
    with pytest.raises(ValueError, match="C-contiguous"):
        binary_op(a.T, rand((3, 4)))
    with pytest.raises(ValueError, match="cannot be broadcast"):
        binary_op(a, rand((4,)))
    with pytest.raises(ValueError, match="unknown op"):
        binary_op(a, a, "power")


# ------------------------------------------------------------------ transpose
MATRICES = [(1, 1), (1, 33), (33, 1), (33, 65), (100, 37), (64, 64), (31, 129)]


@pytest.mark.parametrize("shape", MATRICES, ids=str)
@pytest.mark.parametrize("tiled", [False, True], ids=["naive", "tiled"])
def test_transpose_matches_numpy(shape, tiled):
    x = rand(shape, 5)
    got = transpose(x, tiled=tiled)
    assert got.flags.c_contiguous
    np.testing.assert_array_equal(got, transpose_reference(x))


@pytest.mark.parametrize("block", [(32, 1), (32, 4), (32, 8), (32, 32)])
def test_transpose_tiled_block_rows(block):
    x = rand((100, 37), 6)
    np.testing.assert_array_equal(transpose(x, tiled=True, block=block), x.T)


@pytest.mark.parametrize("block", [(1, 1), (16, 16), (7, 5), (32, 32)])
def test_transpose_naive_block_sizes(block):
    x = rand((33, 65), 7)
    np.testing.assert_array_equal(transpose(x, tiled=False, block=block), x.T)


def test_transpose_does_not_write_past_the_end():
    x = rand((33, 65), 8)
    from xtrain_lessons.runtime.cuda import load_kernel
    k = load_kernel("transpose.cu", "transpose_tiled", backend="cpu")
    buf = np.full(33 * 65 + 64, -7.0, np.float32)
    k((3, 2), (32, 8), (x, buf[: 33 * 65], np.int32(33), np.int32(65)))
    np.testing.assert_array_equal(buf[: 33 * 65].reshape(65, 33), x.T)
    assert (buf[33 * 65:] == -7).all()


def test_transpose_clear_errors():
    with pytest.raises(TypeError, match="float32"):
        transpose(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="2-D"):
        transpose(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        transpose(np.zeros((4, 3), np.float32).T)
    with pytest.raises(ValueError, match="block"):
        transpose(np.zeros((4, 3), np.float32), block=(16, 16))


# ------------------------------------------------------------------ embedding
@pytest.mark.parametrize("vocab, dim, ids_shape", [(1, 1, (1,)), (5, 3, (2, 7)), (100, 37, (33,)),
                                                   (65, 33, (4, 16)), (7, 300, (1, 1))])
@pytest.mark.parametrize("block", [32, 256])
def test_embedding_forward_matches_numpy(vocab, dim, ids_shape, block):
    rng = np.random.default_rng(vocab + dim)
    w = rand((vocab, dim), 9)
    ids = rng.integers(0, vocab, ids_shape)  # int64, as NumPy makes them
    got = embedding_forward(ids, w, block=block)
    np.testing.assert_array_equal(got, embedding_forward_reference(ids, w))


@pytest.mark.parametrize("vocab, dim, ids_shape", [(1, 1, (1,)), (5, 3, (2, 7)), (100, 37, (33,)),
                                                   (3, 65, (200,))])
@pytest.mark.parametrize("block", [64, 1024])
def test_embedding_backward_matches_numpy(vocab, dim, ids_shape, block):
    rng = np.random.default_rng(vocab * dim)
    ids = rng.integers(0, vocab, ids_shape).astype(np.int32)
    dout = rand((*ids_shape, dim), 10)
    got = embedding_backward(ids, dout, vocab, block=block)
    want = embedding_backward_reference(ids, dout, vocab)
    # float32 atomics sum in any order: bound by (count per row) * eps * sum |dout|
    count = np.bincount(ids.reshape(-1), minlength=vocab)[:, None]
    abs_sum = embedding_backward_reference(ids, np.abs(dout), vocab)
    assert (np.abs(got - want) <= count * F32_EPS * abs_sum + 1e-30).all()
    unused = count[:, 0] == 0
    assert (got[unused] == 0).all()


def test_embedding_out_of_range_ids_raise():
    w = rand((10, 4))
    with pytest.raises(IndexError, match="token id 10 at position 2 is out of range"):
        embedding_forward(np.array([0, 3, 10, 1]), w)
    with pytest.raises(IndexError, match="token id -1"):
        embedding_forward(np.array([[0, -1]]), w)
    with pytest.raises(IndexError, match="out of range"):
        embedding_backward(np.array([12]), rand((1, 4)), 10)
    with pytest.raises(TypeError, match="integer"):
        embedding_forward(np.array([0.0, 1.0]), w)
    with pytest.raises(TypeError, match="float32"):
        embedding_forward(np.array([0]), w.astype(np.float64))


def test_embedding_kernel_guards_bad_ids_with_nan():
    """The kernel itself never reads outside weight: a bad id (bypassing the launcher) gives NaN."""
    from xtrain_lessons.runtime.cuda import load_kernel
    k = load_kernel("embedding.cu", "embedding_forward", backend="cpu")
    w = rand((10, 4))
    out = np.zeros((3, 4), np.float32)
    k((1,), (32,), (np.array([1, 99, -5], np.int32), w, out, np.int32(3), np.int32(10), np.int32(4)))
    np.testing.assert_array_equal(out[0], w[1])
    assert np.isnan(out[1:]).all()


@pytest.mark.parametrize("mode", ["fibers", "ucontext", "threads"])
def test_transpose_tiled_in_every_emulator_mode(mode, monkeypatch):
    """The tiled kernel is the one with a barrier: it must agree however a block's threads run."""
    monkeypatch.setenv("XTRAIN_EMULATOR_MODE", mode)
    x = rand((33, 65), 11)
    np.testing.assert_array_equal(transpose(x, tiled=True, block=(32, 4)), x.T)


def _gpu() -> bool:
    from xtrain_lessons.runtime.device import gpu_available
    return gpu_available()


@pytest.mark.gpu
@pytest.mark.skipif(not _gpu(), reason="needs CuPy and an NVIDIA GPU")
def test_t02_kernels_on_gpu():
    import cupy as cp
    a, b = rand((3, 1, 5), 1), rand((4, 1), 2)
    np.testing.assert_array_equal(cp.asnumpy(binary_op(cp.asarray(a), cp.asarray(b), "add")), a + b)
    x = rand((100, 37), 3)
    for tiled in (False, True):
        np.testing.assert_array_equal(cp.asnumpy(transpose(cp.asarray(x), tiled=tiled)), x.T)
    w = rand((65, 33), 4)
    ids = np.random.default_rng(5).integers(0, 65, (4, 16))
    np.testing.assert_array_equal(cp.asnumpy(embedding_forward(cp.asarray(ids), cp.asarray(w))), w[ids])
    dout = rand((4, 16, 33), 6)
    got = cp.asnumpy(embedding_backward(cp.asarray(ids), cp.asarray(dout), 65))
    np.testing.assert_allclose(got, embedding_backward_reference(ids, dout, 65), rtol=1e-5, atol=1e-5)
