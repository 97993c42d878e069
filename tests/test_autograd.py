"""The engine itself: Tensor basics, graph recording, backward semantics, make_node, errors."""

import numpy as np
import pytest

from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import (
    Tensor,
    array_module,
    is_grad_enabled,
    make_node,
    no_grad,
    enable_grad,
    tensor,
    unbroadcast,
)


def test_tensor_attributes():
    x = Tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
    assert x.dtype == np.float32  # Python floats default to float32
    assert x.shape == (2, 3) and x.ndim == 2 and x.size == 6 and len(x) == 2
    assert x.T.shape == (3, 2)
    assert x.grad is None and x.requires_grad and x.is_leaf
    assert isinstance(x.numpy(), np.ndarray)
    assert Tensor(3.5).item() == 3.5
    assert Tensor([1, 2]).dtype == np.int64  # integer data (ids) stays integer
    assert Tensor(np.zeros(3)).dtype == np.float64  # an explicit float64 array stays float64
    assert tensor([1.0], dtype=np.float64).dtype == np.float64
    r = repr(x * 2)
    assert "Tensor(" in r and "float32" in r and "op=mul" in r
    assert array_module(x.data) is np


def test_integer_tensor_cannot_require_grad():
    with pytest.raises(TypeError, match="floating"):
        Tensor([1, 2], requires_grad=True)


def test_simple_chain_rule_by_hand():
    x = Tensor(np.array([2.0, -1.0]), requires_grad=True)
    y = (x * x * 3 + x).sum()  # dy/dx = 6x + 1
    y.backward()
    np.testing.assert_allclose(x.grad, 6 * x.data + 1)


def test_fan_out_accumulates():
    """x used in three places: its gradient is the sum of the three contributions."""
    x = Tensor(np.array([1.5, -2.0, 0.5]), requires_grad=True)
    a = x.exp()
    y = (a * x + a + x).sum()  # dy/dx = e^x * x + e^x + e^x + 1
    y.backward()
    e = np.exp(x.data)
    np.testing.assert_allclose(x.grad, e * x.data + 2 * e + 1, rtol=1e-14)


def test_same_tensor_both_operands():
    x = Tensor(np.array([3.0]), requires_grad=True)
    (x * x).backward(np.array([1.0]))
    assert x.grad[0] == 6.0
    y = Tensor(np.array([3.0]), requires_grad=True)
    (y + y).sum().backward()
    assert y.grad[0] == 2.0


def test_backward_twice_accumulates():
    """Pinned meaning of a second backward(): gradients ADD to .grad (like torch); the
    graph is kept, so this is allowed. zero_grad() resets."""
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = (x * x).sum()
    y.backward()
    np.testing.assert_array_equal(x.grad, [2.0, 4.0])
    y.backward()
    np.testing.assert_array_equal(x.grad, [4.0, 8.0])
    x.zero_grad()
    assert x.grad is None
    y.backward()
    np.testing.assert_array_equal(x.grad, [2.0, 4.0])


def test_leaf_grads_are_independent_arrays():
    """z = x + y hands the same upstream array to x and y; each .grad must be its own
    array, so an in-place update of one (an optimizer, clipping) cannot touch the other."""
    x = Tensor(np.ones(3), requires_grad=True)
    y = Tensor(np.ones(3), requires_grad=True)
    g = np.array([1.0, 2.0, 3.0])
    (x + y).backward(g)
    x.grad *= 10
    np.testing.assert_array_equal(y.grad, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(g, [1.0, 2.0, 3.0])  # the caller's array is untouched
    # a broadcast (read-only) gradient view is copied into a writable .grad
    w = Tensor(np.ones((2, 3)), requires_grad=True)
    w.sum().backward()
    w.grad += 1
    assert w.grad.flags.writeable and w.grad.flags.c_contiguous


def test_only_leaves_keep_grad_unless_retained():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = x * 2
    k = (x * 3).retain_grad()
    ((h + k) ** 2).sum().backward()
    assert h.grad is None
    np.testing.assert_allclose(k.grad, 2 * (h.data + k.data))
    c = Tensor(np.array([1.0, 1.0]))  # a constant leaf: no grad
    (c * x).sum().backward()
    assert c.grad is None


def test_no_grad_records_nothing():
    x = Tensor(np.ones(3), requires_grad=True)
    assert is_grad_enabled()
    with no_grad():
        assert not is_grad_enabled()
        y = x * 2 + 1
        with enable_grad():
            z = x * 2
    assert is_grad_enabled()
    assert not y.requires_grad and y.is_leaf and y._parents == ()
    assert z.requires_grad
    with pytest.raises(RuntimeError, match="does not require grad"):
        y.sum().backward()


def test_no_grad_restores_state_after_exception():
    with pytest.raises(ZeroDivisionError):
        with no_grad():
            1 / 0
    assert is_grad_enabled()


def test_grad_mode_is_per_thread():
    """no_grad() in one thread must not stop another thread from recording."""
    import threading

    inside, recorded = threading.Event(), {}

    def other():
        inside.wait()
        x = Tensor(np.ones(2), requires_grad=True)
        recorded["other"] = (x * 2).requires_grad

    t = threading.Thread(target=other)
    t.start()
    with no_grad():
        inside.set()
        t.join()
        recorded["main"] = (Tensor(np.ones(2), requires_grad=True) * 2).requires_grad
    assert recorded == {"other": True, "main": False}


def test_detach_shares_data_and_cuts_graph():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x * 3
    d = y.detach()
    assert d.data is y.data and not d.requires_grad and d.is_leaf
    (x * d).sum().backward()
    np.testing.assert_array_equal(x.grad, d.data)  # no gradient flowed through d


def test_backward_needs_grad_for_non_scalar():
    x = Tensor(np.ones((2, 2)), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"scalar output, got shape \(2, 2\)"):
        (x * 2).backward()
    with pytest.raises(ValueError, match=r"grad shape \(3,\) != tensor shape \(2, 2\)"):
        (x * 2).backward(np.ones(3))


def test_deep_graph_no_recursion_limit():
    x = Tensor(np.array([1.0]), requires_grad=True)
    y = x
    for _ in range(20_000):
        y = y * 1.0001
    y.sum().backward()
    np.testing.assert_allclose(x.grad, [1.0001 ** 20_000], rtol=1e-9)


def test_diamond_graph_visits_each_node_once():
    x = Tensor(np.array([0.3]), requires_grad=True)
    a = x.tanh()
    b, c = a * 2, a * 3
    (b * c).sum().backward()  # 6 a^2 -> 12 a (1 - a^2)
    a0 = np.tanh(0.3)
    np.testing.assert_allclose(x.grad, [12 * a0 * (1 - a0 ** 2)], rtol=1e-14)


def test_scalars_and_arrays_as_operands():
    x = Tensor(np.array([1.0, 2.0], dtype=np.float32), requires_grad=True)
    for y in (x + 1, 1 + x, x - 1, 1 - x, 2 * x, x / 2, 2 / x, x ** 2, 2 ** x, -x,
              np.ones(2, np.float32) * x, np.ones(2, np.float32) + x):
        assert isinstance(y, Tensor) and y.dtype == np.float32 and y.requires_grad
    y = 3.0 - 2.0 / x
    y.sum().backward()
    np.testing.assert_allclose(x.grad, 2.0 / x.data ** 2)


def test_comparisons_return_plain_arrays():
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    for r in (x < 2, x <= 2, x > 2, x >= 2, x == 2, x != 2, x > Tensor(np.ones(3))):
        assert isinstance(r, np.ndarray) and r.dtype == bool
    np.testing.assert_array_equal(x > 1.5, [False, True, True])
    assert len({x, x}) == 1  # still hashable by identity


def test_methods_match_functions():
    rng = np.random.default_rng(0)
    x = Tensor(rng.standard_normal((2, 3, 4)))
    np.testing.assert_array_equal(x.sum(axis=1).data, ops.sum(x, axis=1).data)
    np.testing.assert_array_equal(x.reshape(6, 4).data, x.data.reshape(6, 4))
    np.testing.assert_array_equal(x.reshape((4, 6)).data, x.data.reshape(4, 6))
    np.testing.assert_array_equal(x.transpose(0, 2, 1).data, x.data.transpose(0, 2, 1))
    np.testing.assert_array_equal(x.T.data, x.data.T)
    np.testing.assert_array_equal(x.softmax().data, ops.softmax(x).data)


# ---- make_node: the extension API ------------------------------------------------------


def test_make_node_custom_op():
    """A user-defined op (cube) made with make_node: backward returns one grad per parent."""
    def cube(x):
        return make_node(x.data ** 3, (x,), lambda g: (3 * x.data ** 2 * g,), "cube")

    x = Tensor(np.array([1.0, -2.0]), requires_grad=True)
    y = cube(x)
    assert y.op == "cube" and y.requires_grad
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 12.0])


def test_make_node_none_gradient_and_constant_parents():
    calls = []

    def first_only(a, b):
        def backward(g):
            calls.append(1)
            return g, None  # b gets no gradient

        return make_node(a.data + b.data, (a, b), backward, "first_only")

    a = Tensor(np.ones(2), requires_grad=True)
    b = Tensor(np.ones(2), requires_grad=True)
    first_only(a, b).sum().backward()
    assert b.grad is None and a.grad is not None
    c = first_only(Tensor(np.ones(2)), Tensor(np.ones(2)))  # no parent requires grad:
    assert not c.requires_grad and c._backward is None      # nothing recorded


def test_make_node_unbroadcast_flag():
    a = Tensor(np.ones((3, 4)), requires_grad=True)
    b = Tensor(np.ones(4), requires_grad=True)
    out = a.data + b.data
    # without unbroadcast the engine rejects a gradient of the wrong shape, naming the op
    bad = make_node(out, (a, b), lambda g: (g, g), "my_add")
    with pytest.raises(ValueError, match=r"my_add: .*shape \(3, 4\) for a parent of shape \(4,\)"):
        bad.sum().backward()
    a.zero_grad()
    good = make_node(out, (a, b), lambda g: (g, g), "my_add", unbroadcast=True)
    good.sum().backward()
    np.testing.assert_array_equal(b.grad, [3.0] * 4)


def test_make_node_wrong_number_of_gradients():
    a = Tensor(np.ones(2), requires_grad=True)
    y = make_node(a.data * 2, (a,), lambda g: (g, g), "two")
    with pytest.raises(RuntimeError, match="two: backward must return a tuple of 1"):
        y.sum().backward()


def test_make_node_casts_gradient_dtype():
    a = Tensor(np.ones(2, np.float32), requires_grad=True)
    y = make_node(a.data * 2, (a,), lambda g: (g.astype(np.float64) * 2,), "f64grad")
    y.sum().backward()
    assert a.grad.dtype == np.float32


def test_make_node_rejects_non_tensor_parents_and_wraps_scalars():
    with pytest.raises(TypeError, match=r"my_op: make_node parents must be Tensors, got ndarray "
                                        r"at position 1"):
        make_node(np.ones(2), (Tensor(np.ones(2)), np.ones(2)), lambda g: (g, g), "my_op")
    x = Tensor(np.ones(3), requires_grad=True)
    s = make_node(x.data.sum(), (x,), lambda g: (np.broadcast_to(g, x.shape),), "my_sum")
    assert isinstance(s.data, np.ndarray) and s.shape == ()
    s.backward()
    np.testing.assert_array_equal(x.grad, np.ones(3))


def test_unbroadcast_helper():
    g = np.ones((2, 3, 4))
    assert unbroadcast(g, (3, 4)).shape == (3, 4)
    assert unbroadcast(g, (3, 1)).tolist() == [[8.0]] * 3
    assert unbroadcast(g, ()).item() == 24.0
    assert unbroadcast(g, (2, 3, 4)) is g


# ---- errors name the op and the shapes ------------------------------------------------


def test_shape_errors_name_op_and_shapes():
    a, b = Tensor(np.ones((4, 3))), Tensor(np.ones((5, 2)))
    with pytest.raises(ValueError, match=r"matmul: shapes \(4, 3\) and \(5, 2\) do not match: "
                                         r"inner dimensions 3 != 5"):
        a @ b
    with pytest.raises(ValueError, match=r"matmul: .*batch dimensions \(2,\) and \(3,\)"):
        Tensor(np.ones((2, 4, 3))) @ Tensor(np.ones((3, 3, 2)))
    with pytest.raises(ValueError, match=r"add: shapes \(4, 3\) and \(5, 2\) cannot be broadcast"):
        a + b
    with pytest.raises(ValueError, match=r"mul: shapes \(4, 3\) and \(2,\)"):
        a * np.ones(2)
    with pytest.raises(ValueError, match=r"reshape: cannot reshape \(4, 3\)"):
        a.reshape(5, 2)
    with pytest.raises(ValueError, match=r"cat: shapes \[\(4, 3\), \(5, 2\)\]"):
        ops.cat([a, b], axis=0)
    with pytest.raises(ValueError, match=r"rmsnorm: weight shape \(4,\) .* x \(4, 3\)"):
        ops.rmsnorm(a, Tensor(np.ones(4)))
    with pytest.raises(ValueError, match=r"cross_entropy: logits shape \(4, 3\) and targets "
                                         r"shape \(3,\)"):
        ops.cross_entropy(a, np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"split: sizes \[1, 1\] do not sum to 4"):
        ops.split(a, [1, 1])


def test_embedding_bad_ids():
    w = Tensor(np.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"embedding: ids must lie in \[0, 4\), got min -1"):
        ops.embedding(w, np.array([0, -1]))
    with pytest.raises(ValueError, match=r"max 4"):
        ops.embedding(w, np.array([[0, 4]]))
    with pytest.raises(TypeError, match="integers"):
        ops.embedding(w, np.array([0.0]))


def test_cross_entropy_bad_target():
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 3\)"):
        ops.cross_entropy(Tensor(np.zeros((2, 3))), np.array([0, 3]))


def test_cross_entropy_all_ignored_is_nan():
    x = Tensor(np.zeros((2, 3)), requires_grad=True)
    loss = ops.cross_entropy(x, np.array([-100, -100]))
    assert np.isnan(loss.item())


def test_embedding_repeated_ids_sum():
    w = Tensor(np.zeros((4, 2)), requires_grad=True)
    ops.embedding(w, np.array([[1, 1, 3], [1, 0, 3]])).sum().backward()
    np.testing.assert_array_equal(w.grad[:, 0], [1, 3, 0, 2])


def test_float_and_root_grad_cast():
    x = Tensor(np.array([1.0, 2.0], dtype=np.float32), requires_grad=True)
    y = x * 3
    y.backward(np.array([1.0, 1.0]))  # a float64 upstream gradient is cast to the output dtype
    assert x.grad.dtype == np.float32
    assert float(y.sum()) == 9.0


def test_bfloat16_tensor_can_require_grad():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = Tensor(np.ones(3, dtype=ml_dtypes.bfloat16), requires_grad=True)
    assert x.requires_grad


def test_getitem_variants_scatter_back():
    rng = np.random.default_rng(3)
    base = rng.standard_normal((4, 5))
    for idx in [(slice(None, None, -1), 2), (Ellipsis, 1), [0, 0, 3], (Tensor([1, 1]), slice(1, 3)),
                (np.array([[0, 1], [1, 1]]),), 3, (base > 0)]:
        x = Tensor(base, requires_grad=True)
        out = x[idx]
        g = rng.standard_normal(out.shape)
        out.backward(g)
        expected = np.zeros_like(base)
        key = idx
        if isinstance(idx, tuple):
            key = tuple(i.data if isinstance(i, Tensor) else i for i in idx)
        np.add.at(expected, key, g)
        np.testing.assert_allclose(x.grad, expected, err_msg=str(idx))


def test_graph_is_freed_without_garbage_collector():
    """No reference cycles: dropping the output frees the whole graph by refcounting, so a
    training loop that rebinds `loss` never keeps two steps of activations alive."""
    import gc
    import weakref

    gc.disable()
    try:
        x = Tensor(np.ones((3, 4)), requires_grad=True)
        h = ops.softmax(x * 2) @ Tensor(np.ones((4, 2)))
        loss = ops.cross_entropy(h, np.array([0, 1, 1]))
        refs = [weakref.ref(h), weakref.ref(loss)]
        loss.backward()
        del h
        assert refs[0]() is not None  # still reachable from loss
        del loss
        assert all(r() is None for r in refs)
    finally:
        gc.enable()
