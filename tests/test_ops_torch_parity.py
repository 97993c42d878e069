"""Every op of xtrain_lessons.autograd.ops against torch.autograd: values and input gradients.

Each case builds seeded random inputs (some broadcast, some non-contiguous: transposed
or strided views), runs the op in our engine and in torch, then back-propagates the
same random upstream gradient through both. float64 must agree to ~1e-10 relative;
a float32 run checks the same cases with float32 tolerances.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from hypothesis import given, settings, strategies as st  # noqa: E402
from hypothesis.extra.numpy import mutually_broadcastable_shapes  # noqa: E402

from xtrain_lessons.autograd import ops  # noqa: E402
from xtrain_lessons.autograd.tensor import Tensor  # noqa: E402

TOL = {np.float64: dict(rtol=1e-10, atol=1e-12), np.float32: dict(rtol=2e-5, atol=2e-5)}


def randn(rng, *shape):
    return rng.standard_normal(shape)


def positive(rng, *shape):
    return rng.uniform(0.5, 2.0, shape)


def transposed(rng, *shape):
    """A non-contiguous array of `shape` (the transpose of a contiguous one)."""
    return rng.standard_normal(shape[::-1]).T


def strided(rng, *shape):
    """A non-contiguous array of `shape`: every other column of a wider one."""
    return rng.standard_normal(shape[:-1] + (2 * shape[-1],))[..., ::2]


IDS = np.array([[1, 3, 3], [0, 6, 1]])  # repeated ids: scatter-add must sum
CAUSAL = np.tril(np.ones((5, 5), dtype=bool))

# (name, inputs(rng) -> list of arrays, ours(*Tensors), theirs(*torch tensors))
# float arrays become inputs requiring grad; integer/bool arrays are constants.
CASES = [
    ("add_broadcast", lambda r: [randn(r, 3, 1, 5), randn(r, 4, 5)], ops.add, torch.add),
    ("add_scalar_reflected", lambda r: [randn(r, 3, 4)], lambda x: 2.5 + x, lambda x: 2.5 + x),
    ("sub_broadcast", lambda r: [randn(r, 4, 1), strided(r, 3, 4, 6)], lambda a, b: a - b,
     lambda a, b: a - b),
    ("rsub", lambda r: [randn(r, 3)], lambda x: 1 - x, lambda x: 1 - x),
    ("mul_broadcast", lambda r: [transposed(r, 4, 3), randn(r, 2, 1, 3)], lambda a, b: a * b,
     lambda a, b: a * b),
    ("mul_same_input", lambda r: [randn(r, 5)], lambda x: x * x, lambda x: x * x),
    ("div_broadcast", lambda r: [randn(r, 2, 3, 4), positive(r, 3, 1)], lambda a, b: a / b,
     lambda a, b: a / b),
    ("rdiv", lambda r: [positive(r, 3, 2)], lambda x: 3.0 / x, lambda x: 3.0 / x),
    ("neg", lambda r: [randn(r, 3, 4)], lambda x: -x, lambda x: -x),
    ("pow_3", lambda r: [randn(r, 3, 4)], lambda x: x ** 3, lambda x: x ** 3),
    ("pow_2", lambda r: [transposed(r, 3, 4)], lambda x: x ** 2, lambda x: x ** 2),
    ("pow_half", lambda r: [positive(r, 6)], lambda x: x ** 0.5, lambda x: x ** 0.5),
    ("pow_tensor", lambda r: [positive(r, 3, 4), randn(r, 4)], lambda a, b: a ** b,
     lambda a, b: a ** b),
    ("rpow", lambda r: [randn(r, 5)], lambda x: 2.0 ** x, lambda x: 2.0 ** x),
    ("exp", lambda r: [strided(r, 3, 4)], ops.exp, torch.exp),
    ("log", lambda r: [positive(r, 3, 4)], ops.log, torch.log),
    ("sqrt", lambda r: [positive(r, 3, 4)], ops.sqrt, torch.sqrt),
    ("sigmoid", lambda r: [3 * randn(r, 3, 4)], ops.sigmoid, torch.sigmoid),
    ("silu", lambda r: [3 * randn(r, 3, 4)], ops.silu, F.silu),
    ("relu", lambda r: [randn(r, 3, 4)], ops.relu, torch.relu),
    ("tanh", lambda r: [transposed(r, 3, 4)], ops.tanh, torch.tanh),
    ("sum_all", lambda r: [randn(r, 3, 4)], lambda x: x.sum(), lambda x: x.sum()),
    ("sum_axis", lambda r: [transposed(r, 2, 3, 4)], lambda x: x.sum(axis=1),
     lambda x: x.sum(dim=1)),
    ("sum_axes_keepdims", lambda r: [randn(r, 2, 3, 4)],
     lambda x: x.sum(axis=(0, -1), keepdims=True), lambda x: x.sum(dim=(0, -1), keepdim=True)),
    ("mean_axis", lambda r: [randn(r, 2, 3, 4)], lambda x: x.mean(axis=-1),
     lambda x: x.mean(dim=-1)),
    ("mean_all", lambda r: [strided(r, 3, 4)], lambda x: x.mean(), lambda x: x.mean()),
    ("max_all", lambda r: [transposed(r, 3, 4)], lambda x: x.max(), lambda x: x.amax()),
    ("max_axis_ties", lambda r: [np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 2.0]])],
     lambda x: ops.max(x, axis=1, keepdims=True), lambda x: x.amax(dim=1, keepdim=True)),
    ("max_axes", lambda r: [randn(r, 2, 3, 4)], lambda x: x.max(axis=(0, 2)),
     lambda x: x.amax(dim=(0, 2))),
    ("logsumexp", lambda r: [10 * randn(r, 3, 7)], ops.logsumexp,
     lambda x: torch.logsumexp(x, dim=-1)),
    ("logsumexp_axis0_keepdims", lambda r: [randn(r, 4, 3)],
     lambda x: ops.logsumexp(x, axis=0, keepdims=True),
     lambda x: torch.logsumexp(x, dim=0, keepdim=True)),
    ("softmax", lambda r: [5 * randn(r, 2, 3, 6)], ops.softmax, lambda x: torch.softmax(x, -1)),
    ("softmax_axis1", lambda r: [transposed(r, 2, 5, 3)], lambda x: ops.softmax(x, axis=1),
     lambda x: torch.softmax(x, 1)),
    ("log_softmax", lambda r: [5 * randn(r, 3, 6)], ops.log_softmax,
     lambda x: torch.log_softmax(x, -1)),
    ("matmul_2d", lambda r: [randn(r, 3, 4), randn(r, 4, 5)], ops.matmul, torch.matmul),
    ("matmul_transposed", lambda r: [transposed(r, 3, 4), transposed(r, 4, 5)],
     lambda a, b: a @ b, lambda a, b: a @ b),
    ("matmul_batched_weight", lambda r: [randn(r, 2, 3, 4), randn(r, 4, 5)],
     lambda a, b: a @ b, lambda a, b: a @ b),
    ("matmul_batch_broadcast", lambda r: [randn(r, 2, 1, 3, 4), strided(r, 5, 4, 2)],
     lambda a, b: a @ b, lambda a, b: a @ b),
    ("matmul_2d_by_batched", lambda r: [randn(r, 3, 4), randn(r, 2, 4, 5)],
     lambda a, b: a @ b, lambda a, b: a @ b),
    ("matmul_vec_left", lambda r: [randn(r, 4), randn(r, 2, 4, 5)], ops.matmul, torch.matmul),
    ("matmul_vec_right", lambda r: [randn(r, 2, 3, 4), randn(r, 4)], ops.matmul, torch.matmul),
    ("rmatmul_array", lambda r: [randn(r, 4, 5)], lambda x: np.eye(3, 4, dtype=x.dtype) @ x,
     lambda x: torch.tensor(np.eye(3, 4), dtype=x.dtype) @ x),
    ("reshape", lambda r: [transposed(r, 3, 4)], lambda x: x.reshape(2, 6),
     lambda x: x.reshape(2, 6)),
    ("transpose_T", lambda r: [randn(r, 3, 4)], lambda x: x.T * 1.5, lambda x: x.T * 1.5),
    ("permute", lambda r: [randn(r, 2, 3, 4)], lambda x: x.permute(2, 0, 1) * x.permute(2, 0, 1),
     lambda x: x.permute(2, 0, 1) * x.permute(2, 0, 1)),
    ("swapaxes", lambda r: [randn(r, 2, 3, 4)], lambda x: x.swapaxes(1, -1).exp(),
     lambda x: x.transpose(1, -1).exp()),
    ("getitem_slices", lambda r: [randn(r, 5, 6)], lambda x: x[1:4, ::2],
     lambda x: x[1:4, ::2]),
    ("getitem_int_and_none", lambda r: [randn(r, 5, 6)], lambda x: x[2, None, 1:],
     lambda x: x[2, None, 1:]),
    ("getitem_repeated_ids", lambda r: [randn(r, 5, 3)], lambda x: x[np.array([0, 2, 2, 4, 0])],
     lambda x: x[torch.tensor([0, 2, 2, 4, 0])]),
    ("getitem_int_arrays", lambda r: [randn(r, 4, 5)],
     lambda x: x[np.array([0, 1, 1]), np.array([2, 3, 3])],
     lambda x: x[torch.tensor([0, 1, 1]), torch.tensor([2, 3, 3])]),
    ("getitem_bool_mask", lambda r: [randn(r, 4, 5)], lambda x: x[CAUSAL[:4]],
     lambda x: x[torch.tensor(CAUSAL[:4])]),
    ("embedding", lambda r: [randn(r, 7, 4)], lambda w: ops.embedding(w, IDS),
     lambda w: F.embedding(torch.tensor(IDS), w)),
    ("cat", lambda r: [randn(r, 2, 3), transposed(r, 2, 4), randn(r, 2, 1)],
     lambda *xs: ops.cat(xs, axis=1), lambda *xs: torch.cat(xs, dim=1)),
    ("stack", lambda r: [randn(r, 2, 3), randn(r, 2, 3)], lambda *xs: ops.stack(xs, axis=1),
     lambda *xs: torch.stack(xs, dim=1)),
    ("split_int", lambda r: [randn(r, 7, 3)], lambda x: ops.split(x, 3, axis=0),
     lambda x: torch.split(x, 3, dim=0)),
    ("split_sizes", lambda r: [randn(r, 2, 9)], lambda x: x.split([3, 2, 4], axis=-1),
     lambda x: torch.split(x, [3, 2, 4], dim=-1)),
    ("where", lambda r: [randn(r, 4, 5), randn(r, 5)],
     lambda a, b: ops.where(CAUSAL[:4], a, b),
     lambda a, b: torch.where(torch.tensor(CAUSAL[:4]), a, b)),
    ("masked_fill_causal", lambda r: [randn(r, 2, 5, 5)],
     lambda x: ops.softmax(x.masked_fill(~CAUSAL, -np.inf)),
     lambda x: torch.softmax(x.masked_fill(torch.tensor(~CAUSAL), -np.inf), -1)),
    ("broadcast_to", lambda r: [randn(r, 3, 1)], lambda x: x.broadcast_to((2, 3, 4)) * 1.0,
     lambda x: x.expand(2, 3, 4) * 1.0),
    ("rmsnorm", lambda r: [randn(r, 2, 3, 8), randn(r, 8)], lambda x, w: ops.rmsnorm(x, w, 1e-6),
     lambda x, w: F.rms_norm(x, (8,), w, 1e-6)),
    ("rmsnorm_noweight_strided", lambda r: [strided(r, 4, 6)], lambda x: ops.rmsnorm(x, None, 1e-5),
     lambda x: F.rms_norm(x, (6,), None, 1e-5)),
    ("cross_entropy", lambda r: [3 * randn(r, 6, 11)],
     lambda x: ops.cross_entropy(x, np.array([0, 10, 3, 3, 7, 1])),
     lambda x: F.cross_entropy(x, torch.tensor([0, 10, 3, 3, 7, 1]))),
    ("cross_entropy_3d_ignore", lambda r: [3 * randn(r, 2, 3, 7)],
     lambda x: ops.cross_entropy(x, np.array([[1, -100, 6], [0, 0, -100]])),
     lambda x: F.cross_entropy(x.reshape(-1, 7), torch.tensor([1, -100, 6, 0, 0, -100]))),
    ("sdpa_causal", lambda r: [randn(r, 2, 3, 5, 4), randn(r, 2, 3, 5, 4), randn(r, 2, 3, 5, 6)],
     lambda q, k, v: ops.scaled_dot_product_attention(q, k, v, causal=True),
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
    ("sdpa_mask_scale", lambda r: [randn(r, 2, 4, 3), transposed(r, 2, 3, 6)[:, :, :5]
                                   .swapaxes(1, 2), randn(r, 2, 5, 3)],
     lambda q, k, v: ops.scaled_dot_product_attention(q, k, v, scale=0.3,
                                                      mask=np.ones((4, 5), dtype=bool)),
     lambda q, k, v: F.scaled_dot_product_attention(q, k, v, scale=0.3)),
    ("sdpa_bool_mask", lambda r: [randn(r, 1, 5, 4), randn(r, 1, 5, 4), randn(r, 1, 5, 4)],
     lambda q, k, v: ops.scaled_dot_product_attention(
         q, k, v, mask=CAUSAL.T | np.eye(5, dtype=bool)),
     lambda q, k, v: F.scaled_dot_product_attention(
         q, k, v, attn_mask=torch.tensor(CAUSAL.T | np.eye(5, dtype=bool)))),
    ("astype", lambda r: [randn(r, 3, 2)], lambda x: x.astype(np.float32) * 2.0,
     lambda x: x.float() * 2.0),
    ("composite_mlp", lambda r: [randn(r, 2, 3, 4), randn(r, 4, 6), randn(r, 4, 6), randn(r, 6, 4)],
     lambda x, w1, w3, w2: (ops.silu(x @ w1) * (x @ w3)) @ w2,
     lambda x, w1, w3, w2: (F.silu(x @ w1) * (x @ w3)) @ w2),
]


def _outputs(out):
    return list(out) if isinstance(out, (list, tuple)) else [out]


def run_parity(inputs, ours, theirs, dtype, seed=0):
    """Run both engines on `inputs`; assert equal values and gradients."""
    tol = TOL[dtype]
    inputs = [a.astype(dtype) if a.dtype.kind == "f" else a for a in inputs]
    xs = [Tensor(a, requires_grad=a.dtype.kind == "f") for a in inputs]
    ts = [torch.tensor(np.array(a, order="C"), requires_grad=a.dtype.kind == "f") for a in inputs]
    outs, touts = _outputs(ours(*xs)), _outputs(theirs(*ts))
    assert len(outs) == len(touts)
    rng = np.random.default_rng(seed + 1)
    for o, to in zip(outs, touts):
        assert o.shape == tuple(to.shape), (o.shape, to.shape)
        assert o.dtype == to.detach().numpy().dtype
        np.testing.assert_allclose(o.data, to.detach().numpy(), **tol, err_msg="forward")
    # back-propagate the same upstream gradients through both
    gs = [rng.standard_normal(o.shape).astype(o.dtype) for o in outs]
    loss = sum((o * g).sum() for o, g in zip(outs, gs))
    tloss = sum((to * torch.tensor(g)).sum() for to, g in zip(touts, gs))
    loss.backward()
    tloss.backward()
    for i, (x, t) in enumerate(zip(xs, ts)):
        if x.requires_grad:
            assert x.grad is not None and x.grad.shape == x.shape
            assert x.grad.dtype == x.dtype
            np.testing.assert_allclose(x.grad, t.grad.numpy(), **tol, err_msg=f"grad of input {i}")


@pytest.mark.parametrize("dtype", [np.float64, np.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("name,make,ours,theirs", CASES, ids=[c[0] for c in CASES])
def test_op_matches_torch(name, make, ours, theirs, dtype):
    rng = np.random.default_rng(sum(map(ord, name)))  # seeded per case, stable across runs
    run_parity(make(rng), ours, theirs, dtype)


def test_every_public_op_is_covered():
    """Each op in ops.__all__ appears in at least one parity case."""
    import inspect

    src = inspect.getsource(inspect.getmodule(test_every_public_op_is_covered))
    cases_src = src[src.index("CASES = ["):src.index("def _outputs")]
    operators = {"add": "+", "sub": " - ", "mul": "*", "div": "/", "pow": "**", "neg": "-x",
                 "matmul": "@", "getitem": "x[", "transpose": ".T", "concatenate": "ops.cat",
                 "permute": ".permute"}
    for op in ops.__all__:
        assert op in cases_src or operators.get(op, "@@") in cases_src, f"no parity case for {op}"


# ---- property-based: broadcasting binary ops over random shapes ----------------------

BINARY = {"add": (ops.add, torch.add), "sub": (ops.sub, torch.sub), "mul": (ops.mul, torch.mul),
          "div": (ops.div, torch.div)}


@settings(max_examples=40, deadline=None)
@given(shapes=mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
       op=st.sampled_from(sorted(BINARY)), seed=st.integers(0, 2**16),
       noncontig=st.booleans())
def test_broadcasting_binary_ops_match_torch(shapes, op, seed, noncontig):
    rng = np.random.default_rng(seed)
    a_shape, b_shape = shapes.input_shapes
    a = transposed(rng, *a_shape) if noncontig else randn(rng, *a_shape)
    b = positive(rng, *b_shape)  # positive: safe divisor
    ours, theirs = BINARY[op]
    run_parity([np.asarray(a), np.asarray(b)], ours, theirs, np.float64, seed)


@settings(max_examples=20, deadline=None)
@given(batch=st.lists(st.integers(1, 3), min_size=0, max_size=2), m=st.integers(1, 4),
       k=st.integers(1, 4), n=st.integers(1, 4), seed=st.integers(0, 2**16),
       broadcast_b=st.booleans())
def test_matmul_shapes_match_torch(batch, m, k, n, seed, broadcast_b):
    rng = np.random.default_rng(seed)
    a = randn(rng, *batch, m, k)
    b = randn(rng, *([1] * len(batch) if broadcast_b else batch), k, n)
    run_parity([a, b], ops.matmul, torch.matmul, np.float64, seed)


def test_float32_stays_float32_through_a_block():
    """No silent upcast: a float32 MLP block with Python-number constants stays float32."""
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((2, 3, 8)).astype(np.float32), requires_grad=True)
    w = Tensor(rng.standard_normal((8, 8)).astype(np.float32), requires_grad=True)
    h = ops.rmsnorm(x, None) @ w * 0.5 + 1
    h = ops.silu(h) / 3 - 2 ** h.tanh()
    loss = ops.cross_entropy(h, np.array([[1, 2, 3], [4, 5, -100]]))
    assert h.dtype == np.float32 and loss.dtype == np.float32
    loss.backward()
    assert x.grad.dtype == np.float32 and w.grad.dtype == np.float32


REDUCTIONS = {
    "sum": (lambda x, ax: x.sum(axis=ax), lambda x, ax: x.sum(dim=ax)),
    "mean": (lambda x, ax: x.mean(axis=ax), lambda x, ax: x.mean(dim=ax)),
    "max": (lambda x, ax: x.max(axis=ax), lambda x, ax: x.amax(dim=ax)),
    "logsumexp": (lambda x, ax: ops.logsumexp(x, axis=ax), lambda x, ax: torch.logsumexp(x, ax)),
    "softmax": (lambda x, ax: ops.softmax(x, axis=ax), lambda x, ax: torch.softmax(x, ax)),
    "log_softmax": (lambda x, ax: ops.log_softmax(x, axis=ax),
                    lambda x, ax: torch.log_softmax(x, ax)),
}


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data(),
       op=st.sampled_from(sorted(REDUCTIONS)), seed=st.integers(0, 2**16))
def test_reductions_over_random_axes_match_torch(shape, data, op, seed):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    rng = np.random.default_rng(seed)
    ours, theirs = REDUCTIONS[op]
    run_parity([transposed(rng, *shape)], lambda x: ours(x, axis), lambda x: theirs(x, axis),
               np.float64, seed)
