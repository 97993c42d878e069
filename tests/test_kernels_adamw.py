"""AdamW over flat buffers: the fused kernel (T07b) on the CPU emulator against the CPU update."""

import numpy as np
import pytest

from xtrain_lessons.runtime.cuda import load_kernel
from xtrain_lessons.runtime.kernels.adamw import adamw_flat, adamw_reference
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.training.optim import AdamW


@pytest.mark.parametrize("n,n_decay", [(1, 1), (300, 0), (1000, 777), (4099, 4099)])
def test_kernel_equals_reference(n, n_decay):
    rng = np.random.default_rng(n)
    p = rng.standard_normal(n, dtype=np.float32)
    m = np.zeros(n, np.float32)
    v = np.zeros(n, np.float32)
    q, m2, v2 = p.copy(), m.copy(), v.copy()
    for step in range(1, 4):
        g = rng.standard_normal(n, dtype=np.float32)
        adamw_flat(p, g, m, v, step, 1e-2, (0.9, 0.95), 1e-8, 0.1, n_decay)
        adamw_reference(q, g, m2, v2, step, 1e-2, (0.9, 0.95), 1e-8, 0.1, n_decay)
    # float32 to rounding (a GPU may fuse multiply-adds); the emulator does exactly the same ops
    np.testing.assert_allclose(p, q, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(m, m2, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(v, v2, rtol=2e-6, atol=1e-9)


def test_reference_equals_optim_adamw():
    rng = np.random.default_rng(0)

    class P:
        def __init__(self, a):
            self.data, self.grad = a, None

    w = P(rng.standard_normal(50, dtype=np.float32))
    flat = w.data.copy()
    m, v = np.zeros(50, np.float32), np.zeros(50, np.float32)
    opt = AdamW([w], lr=3e-3, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)
    for step in range(1, 5):
        g = rng.standard_normal(50, dtype=np.float32)
        w.grad = g
        opt.step()
        adamw_reference(flat, g, m, v, step, 3e-3, (0.8, 0.99), 1e-6, 0.05)
    np.testing.assert_array_equal(flat, w.data)


def train(steps=3, seed=0, kernel=None):
    cfg = PRESETS["test"]
    model = Model(cfg, seed=0)
    opt = AdamW(model.named_parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1, kernel=kernel)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        ids, targets = rng.integers(0, cfg.vocab_size, (2, 8)), rng.integers(0, cfg.vocab_size, (2, 8))
        model.zero_grad()
        model.loss(ids, targets).backward()
        opt.step()
    return model, opt


def test_the_cuda_kernel_trains_like_the_cpu_update():
    """AdamW's update by kernels/adamw.cu (here on the emulator, as on a GPU) against the CPU's (C++
    or NumPy), over the same flat buffers."""
    ma, oa = train()
    mb, ob = train(kernel=load_kernel("adamw.cu", "adamw_step", backend="cpu"))
    for name, p in ma.named_parameters().items():
        np.testing.assert_allclose(mb.params[name].data, p.data, rtol=1e-5, atol=1e-7, err_msg=name)
    sa, sb = oa.state_dict(), ob.state_dict()
    assert sa["meta"]["step"] == sb["meta"]["step"]
    for k in sa["tensors"]:
        np.testing.assert_allclose(sb["tensors"][k], sa["tensors"][k], rtol=1e-5, atol=1e-9, err_msg=k)


def test_the_parameters_live_in_the_flat_buffer_decayed_first():
    m, opt = train(steps=1)
    assert all(np.shares_memory(p.data, opt.flat_param) for p in m.parameters())
    assert all(np.shares_memory(p.grad_buffer, opt.flat_grad) for p in m.parameters())
    offsets = {id(p): p.data.__array_interface__["data"][0] for p in m.parameters()}
    decayed = [offsets[id(p)] for p in m.parameters() if p.ndim >= 2]
    assert max(decayed) < min(offsets[id(p)] for p in m.parameters() if p.ndim < 2)


def test_state_dict_round_trip():
    mb, ob = train(steps=2)
    sd = ob.state_dict()
    model = Model(PRESETS["test"], seed=0)
    model.load_state_dict(mb.state_dict())
    opt = AdamW(model.named_parameters(), lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    opt.load_state_dict(sd)
    assert opt.step_count == 2
    np.testing.assert_array_equal(opt.flat_exp_avg, ob.flat_exp_avg)
    for st in opt.state.values():
        assert np.shares_memory(st["exp_avg"], opt.flat_exp_avg)


def test_adamw_refuses_parameters_of_two_dtypes():
    model = Model(PRESETS["test"], seed=0)
    ps = model.named_parameters()
    ps["model.norm.weight"].data = ps["model.norm.weight"].data.astype(np.float64)
    with pytest.raises(ValueError, match="one dtype"):
        AdamW(ps)


def test_step_where_false_keeps_everything_and_true_is_a_plain_step():
    """AdamW.step(where=...) (the device-side skip of `xtrain train --log-every N`)."""
    ma, oa = train(steps=1)
    mb, ob = train(steps=1)
    rng = np.random.default_rng(7)
    for pa, pb in zip(ma.parameters(), mb.parameters()):
        pa.grad = rng.standard_normal(pa.data.shape).astype(np.float32)
        pb.grad = pa.grad.copy()
    before = [b.copy() for b in (ob.flat_param, ob.flat_exp_avg, ob.flat_exp_avg_sq)]
    ob.step(where=np.array(False))
    for b, old in zip((ob.flat_param, ob.flat_exp_avg, ob.flat_exp_avg_sq), before):
        np.testing.assert_array_equal(b, old)
    oa.step()
    ob.step_count -= 1  # the skipped step advanced the count; compare one real step with another
    ob.step(where=np.array(True))
    for a, b in ((oa.flat_param, ob.flat_param), (oa.flat_exp_avg, ob.flat_exp_avg),
                 (oa.flat_exp_avg_sq, ob.flat_exp_avg_sq)):
        np.testing.assert_array_equal(a, b)


def test_the_clip_folded_into_the_step_equals_clip_grad_norm_then_step():
    """opt.clip_grad_norm(c); opt.step() (the loop's way: the factor applied inside the update) gives
    the bits of clip_grad_norm(params, c) (torch's way: gradients scaled in place); the same norm."""
    from xtrain_lessons.training.optim import clip_grad_norm

    ma, oa = train(steps=1)
    mb, ob = train(steps=1)
    rng = np.random.default_rng(8)
    for pa, pb in zip(ma.parameters(), mb.parameters()):
        pa.grad = rng.standard_normal(pa.data.shape).astype(np.float32)
        pb.grad = pa.grad.copy()
    na = clip_grad_norm(ma.named_parameters(), 1.0)
    oa.step()
    nb = ob.clip_grad_norm(1.0)
    ob.step()
    assert na > 1.0 and float(nb) == na
    np.testing.assert_array_equal(oa.flat_param, ob.flat_param)


def test_the_run_has_one_adamw():
    from xtrain_lessons.training.config import TrainConfig
    from xtrain_lessons.training.loop import make_optimizer

    cfg = TrainConfig(max_lr=1e-3, weight_decay=0.1)
    model = Model(PRESETS["test"], seed=0)
    opt = make_optimizer(model.named_parameters(), cfg)
    assert type(opt) is AdamW and opt.groups[0]["lr"] == 1e-3 and opt.groups[0]["weight_decay"] == 0.1
