"""Per-op profiler (T07): every op is counted, times are exclusive, patches are undone."""

import numpy as np

from xtrain_lessons.model import layers
from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.training.optim import AdamW
from xtrain_lessons.measure.profiler import OpProfiler, host_profile, op_functions, step_phases
from xtrain_lessons.model.recompute import graph_nodes


def batch(cfg, B=2, T=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, cfg.vocab_size, (B, T)), rng.integers(0, cfg.vocab_size, (B, T))


def test_counts_every_node_of_a_model_step():
    cfg = PRESETS["test"]
    model = Model(cfg, seed=0)
    ids, targets = batch(cfg)
    with OpProfiler() as prof:
        loss = model.loss(ids, targets)
        loss.backward()
    nodes = graph_nodes(loss)
    expected = {}
    for t in nodes:
        expected[t.op] = expected.get(t.op, 0) + 1
    got = {op: s.calls for op, s in prof.stats.items()}
    assert got == expected
    assert {op: s.backward_calls for op, s in prof.stats.items()} == expected
    L = cfg.n_layers
    # 7 projections per layer; the lm_head is fused with the loss (layers.linear_cross_entropy)
    assert got["linear"] == 7 * L and got["linear_cross_entropy"] == 1 and got["causal_attention"] == L
    assert all(s.forward >= 0 and s.backward >= 0 for s in prof.stats.values())
    rows = prof.table()
    assert [r["total_ms"] for r in rows] == sorted((r["total_ms"] for r in rows), reverse=True)
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-9
    assert "linear" in prof.report(top=3) and "more" in prof.report(top=3)


def test_patches_are_undone_and_results_unchanged():
    originals = {fn: name for fn, name in op_functions().items()}
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3), requires_grad=True)
    with OpProfiler() as prof:
        y = (x.exp() * 2.0).sum()
        assert hasattr(ops.exp, "__wrapped__") and hasattr(Tensor.exp, "__wrapped__")
    y.backward()
    assert Tensor.exp is ops.exp and ops.exp in originals and layers.linear in originals
    assert not hasattr(ops.exp, "__wrapped__") and not hasattr(layers.linear, "__wrapped__")
    np.testing.assert_allclose(x.grad, 2 * np.exp(x.data), rtol=1e-6)
    assert prof.stats["exp"].calls == 1 and prof.stats["mul"].calls == 1 and prof.stats["sum"].calls == 1
    assert prof.stats["exp"].backward_calls == 1


def test_times_are_exclusive_under_checkpoint():
    cfg = PRESETS["test"].replace(recompute=True)
    model = Model(cfg, seed=0)
    ids, targets = batch(cfg)
    with OpProfiler() as prof:
        model.loss(ids, targets).backward()
    # forwards recomputed inside the checkpoints' backward count as calls of their own ops
    assert prof.stats["checkpoint"].calls == cfg.n_layers
    assert prof.stats["causal_attention"].calls == 2 * cfg.n_layers
    assert prof.stats["checkpoint"].backward < prof.total


def test_step_phases_and_host_profile():
    cfg = PRESETS["test"]
    model = Model(cfg, seed=0)
    opt = AdamW(model.named_parameters())
    phases = step_phases(model, opt, batch(cfg))
    assert list(phases) == ["forward", "backward", "clip", "optimizer"]
    assert all(v > 0 for v in phases.values())
    result, text = host_profile(lambda: 41 + 1, top=5)
    assert result == 42 and "ncalls" in text


def test_exclusive_times_of_a_trace_subtract_the_calls_inside():
    from xtrain_lessons.measure.profiler import exclusive_times
    trace = [("enter", "linear", 0.0), ("enter", "matmul", 1.0), ("enter", "reshape", 2.0), ("exit", "reshape", 2.5),
             ("exit", "matmul", 4.0), ("enter", "add", 5.0), ("exit", "add", 6.0), ("exit", "linear", 10.0),
             ("enter", "checkpoint", 10.0), ("enter", "checkpoint", 11.0), ("exit", "checkpoint", 13.0),
             ("exit", "checkpoint", 14.0)]
    got = exclusive_times(trace)
    assert got == {"reshape": 0.5, "matmul": 2.5, "add": 1.0, "linear": 6.0, "checkpoint": 4.0}
    assert sum(got.values()) == 14.0  # exclusive times add up to the wall time of the outermost calls
    for bad in ([("enter", "a", 0.0), ("exit", "b", 1.0)], [("enter", "a", 0.0)]):
        try:
            exclusive_times(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad} is not a nested trace")
