"""Central differences (float64) agree with every op's hand-written backward; and
gradcheck really catches a wrong backward, naming the input, the index and both values."""

import numpy as np
import pytest

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor, make_node
from xtrain_lessons.autograd.gradcheck import GradcheckError, gradcheck

rng = np.random.default_rng(1234)


def R(*shape):
    return rng.standard_normal(shape)


def P(*shape):
    return rng.uniform(0.5, 2.0, shape)


MASK = np.tril(np.ones((4, 4), dtype=bool))
IDS = np.array([[0, 2, 2], [4, 1, 0]])
C32, C322, C22, C23 = R(3, 2), R(3, 2, 2), R(2, 2), R(2, 3)  # fixed constants inside fns

# (name, fn, inputs); small shapes: gradcheck costs two forwards per input element
GRADCHECKS = [
    ("add", ops.add, [R(3, 1), R(4)]),
    ("sub", ops.sub, [R(2, 3), R(3)]),
    ("mul", ops.mul, [R(2, 3), R(2, 1)]),
    ("div", ops.div, [R(2, 3), P(3)]),
    ("pow_scalar", lambda x: x ** 3, [R(2, 3)]),
    ("pow_tensor", ops.pow, [P(2, 3), R(3)]),
    ("rpow", lambda x: 1.5 ** x, [R(4)]),
    ("neg", ops.neg, [R(3)]),
    ("exp", ops.exp, [R(2, 3)]),
    ("log", ops.log, [P(2, 3)]),
    ("sqrt", ops.sqrt, [P(2, 3)]),
    ("sigmoid", ops.sigmoid, [R(2, 3)]),
    ("silu", ops.silu, [R(2, 3)]),
    ("relu", ops.relu, [R(2, 3)]),
    ("tanh", ops.tanh, [R(2, 3)]),
    ("sum", lambda x: x.sum(axis=0), [R(3, 2)]),
    ("mean", lambda x: x.mean(axis=(0, 2), keepdims=True), [R(2, 3, 2)]),
    ("max", lambda x: ops.max(x, axis=-1), [R(3, 4)]),
    ("logsumexp", ops.logsumexp, [R(3, 4)]),
    ("softmax", ops.softmax, [R(3, 4)]),
    ("log_softmax", lambda x: ops.log_softmax(x, axis=0), [R(3, 4)]),
    ("matmul", ops.matmul, [R(2, 3, 4), R(4, 2)]),
    ("matmul_batched", ops.matmul, [R(2, 1, 2, 3), R(2, 3, 2)]),
    ("reshape", lambda x: x.reshape(3, 2) * C32, [R(2, 3)]),
    ("transpose", lambda x: x.transpose(1, 2, 0) * C322, [R(2, 3, 2)]),
    ("swapaxes", lambda x: ops.swapaxes(x, 0, 1) @ C22, [R(2, 3)]),
    ("getitem", lambda x: x[np.array([0, 2, 2]), 1:], [R(3, 4)]),
    ("embedding", lambda w: ops.embedding(w, IDS), [R(5, 3)]),
    ("cat", lambda a, b: ops.cat([a, b], axis=-1), [R(2, 2), R(2, 3)]),
    ("stack", lambda a, b: ops.stack([a, b]), [R(2, 2), R(2, 2)]),
    ("split", lambda x: ops.split(x, [1, 3], axis=1), [R(2, 4)]),
    ("where", lambda a, b: ops.where(MASK, a, b), [R(4, 4), R(4)]),
    ("masked_fill", lambda x: ops.softmax(ops.masked_fill(x, ~MASK, -np.inf)), [R(4, 4)]),
    ("broadcast_to", lambda x: ops.broadcast_to(x, (2, 3)) * C23, [R(3)]),
    ("rmsnorm", lambda x, w: ops.rmsnorm(x, w), [R(3, 5), R(5)]),
    ("cross_entropy", lambda x: ops.cross_entropy(x, np.array([1, -100, 4])), [R(3, 5)]),
    ("sdpa_causal", lambda q, k, v: ops.scaled_dot_product_attention(q, k, v, causal=True),
     [R(2, 4, 3), R(2, 4, 3), R(2, 4, 2)]),
]


@pytest.mark.parametrize("name,fn,inputs", GRADCHECKS, ids=[g[0] for g in GRADCHECKS])
def test_gradcheck_every_op(name, fn, inputs):
    assert gradcheck(fn, inputs)


def test_gradcheck_skips_integer_and_constant_inputs():
    x = Tensor(R(3, 4), requires_grad=True)
    c = Tensor(R(3, 4))  # requires_grad=False: not checked
    ids = np.array([0, 1, 3])
    assert gradcheck(lambda x, c, t: ops.cross_entropy(x * c, t), [x, c, ids])


def test_gradcheck_accepts_float32_inputs():
    """Inputs are checked in float64 whatever their dtype."""
    x = Tensor(R(3, 4).astype(np.float32), requires_grad=True)
    assert gradcheck(ops.softmax, [x])


def test_gradcheck_non_contiguous_inputs():
    """Transposed and strided inputs are perturbed correctly (a copy must not hide the step)."""
    assert gradcheck(ops.mul, [R(4, 3).T, R(2, 1, 4)])
    assert gradcheck(ops.exp, [R(3, 8)[:, ::2]])
    assert gradcheck(lambda x: x * x, [Tensor(R(3, 2).T, requires_grad=True)])


def _wrong_square(x):
    # deliberately wrong backward: 3x instead of 2x
    return make_node(x.data ** 2, (x,), lambda g: (3 * x.data * g,), "wrong_square")


def test_gradcheck_catches_a_wrong_backward():
    x = np.array([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(GradcheckError, match=r"input 1 \(shape \(2, 2\)\) of op .*at index "
                                             r"\(\d, \d\) analytical .* vs numerical"):
        gradcheck(lambda a, b: a * _wrong_square(b), [np.ones((2, 2)), x])
    assert gradcheck(_wrong_square, [x], raise_exception=False) is False


def test_gradcheck_catches_a_missing_broadcast_sum():
    def bad_add(a, b):  # forgets that b was broadcast: returns only the first row's grad
        return make_node(a.data + b.data, (a, b), lambda g: (g, g[0]), "bad_add")

    with pytest.raises(GradcheckError, match="input 1"):
        gradcheck(bad_add, [R(3, 2), R(2)])


def test_every_op_has_a_gradcheck():
    # astype changes precision (float32 output), which central differences cannot resolve;
    # concatenate and permute are aliases of cat and transpose
    exempt = {"astype", "concatenate", "permute"}
    alias = {"scaled_dot_product_attention": "sdpa"}
    names = [g[0] for g in GRADCHECKS]
    for op in set(ops.__all__) - exempt:
        key = alias.get(op, op)
        assert any(n == key or n.startswith(key + "_") for n in names), f"no gradcheck for {op}"
