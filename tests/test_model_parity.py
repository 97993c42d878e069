"""The Qwen3-style model against an independent PyTorch implementation (T05).

Same weights in both; logits and the gradient of every parameter must agree. The engine
runs in float32 (and float64), the oracle in float64. Tolerances derive from the dtype:
float32 eps is 1.2e-7, and a few layers of accumulation cost ~2 decimal digits.
"""

import json
import math
import os
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(__file__))

from torch_qwen3_reference import from_state_dict  # noqa: E402

from xtrain_lessons.autograd.tensor import Tensor  # noqa: E402
from xtrain_lessons.model.qwen3 import PRESETS, Config, Model, ffn_dim_for  # noqa: E402
from xtrain_lessons.model.layers import causal_attention, linear, rope, rope_tables, swiglu  # noqa: E402

RTOL32 = 2e-5  # relative to the largest |value| of the compared array
RTOL64 = 1e-10

CONFIGS = {
    "test-gqa": PRESETS["test"],
    "mha-no-qknorm": PRESETS["test"].replace(n_kv_heads=4, qk_norm=False),
    "mqa": PRESETS["test"].replace(n_kv_heads=1, n_layers=3),
    "headdim-ne-dim": Config(vocab_size=50, dim=24, n_layers=2, n_heads=4, n_kv_heads=2,
                             head_dim=8, ffn_dim=40, rope_theta=1e6, max_seq_len=40),
    "theta-small": Config(vocab_size=37, dim=48, n_layers=1, n_heads=3, head_dim=16,
                          ffn_dim=128, rope_theta=100.0, max_seq_len=24, norm_eps=1e-5),
}


def rel_err(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def batch(cfg, B, T, seed=0, ignore=True):
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, cfg.vocab_size, (B, T))
    targets = rng.integers(0, cfg.vocab_size, (B, T))
    if ignore:
        targets[0, : T // 3] = -100  # some ignored positions
    return ids, targets


def compare(cfg, B, T, dtype, tol, seed=0):
    model = Model(cfg, seed=seed, dtype=dtype)
    # random norm weights too, so a forgotten weight multiply cannot hide behind ones
    rng = np.random.default_rng(seed + 100)
    for name, p in model.named_parameters().items():
        if name.endswith("norm.weight"):
            p.data[...] = 1 + 0.3 * rng.standard_normal(p.shape)
    ids, targets = batch(cfg, B, T, seed)
    loss = model.loss(ids, targets)
    loss.backward()
    ref = from_state_dict(cfg.to_dict(), model.state_dict(), torch.float64)
    ref_loss = ref.loss(torch.tensor(ids), torch.tensor(targets))
    ref_loss.backward()
    assert abs(loss.item() - ref_loss.item()) <= tol * abs(ref_loss.item())
    logits = model(ids).data
    assert logits.dtype == dtype and logits.shape == (B, T, cfg.vocab_size)
    assert rel_err(logits, ref(torch.tensor(ids)).detach().numpy()) <= tol
    ref_params = dict(ref.named_parameters())
    assert sorted(ref_params) == sorted(model.named_parameters())  # the same names
    errs = {n: rel_err(p.grad, ref_params[n].grad.numpy())
            for n, p in model.named_parameters().items()}
    worst = max(errs, key=errs.get)
    assert errs[worst] <= tol, f"gradient of {worst}: rel err {errs[worst]:.2e}"


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("B,T", [(2, 7), (3, 16)])
def test_parity_float32(name, B, T):
    compare(CONFIGS[name], B, T, np.float32, RTOL32)


@pytest.mark.parametrize("name", ["test-gqa", "mha-no-qknorm", "headdim-ne-dim"])
def test_parity_float64(name):
    compare(CONFIGS[name], 2, 11, np.float64, RTOL64)


def test_parity_full_length_tiny_shapes():
    # the shapes of the default preset, shortened: every T up to max_seq_len works
    cfg = PRESETS["tiny"].replace(vocab_size=300, n_layers=1, max_seq_len=33)
    compare(cfg, 1, 33, np.float32, RTOL32)


# -- the fused ops on their own, against torch autograd ------------------------------------


def _torch_grads(fn, arrays, gout):
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out = fn(*ts)
    out.backward(torch.tensor(gout, dtype=torch.float64))
    return out.detach().numpy(), [t.grad.numpy() for t in ts]


def _engine_grads(fn, arrays, gout):
    ts = [Tensor(a, requires_grad=True) for a in arrays]
    out = fn(*ts)
    out.backward(gout)
    return out.data, [t.grad for t in ts]


def _check_op(fn_engine, fn_torch, arrays, tol=RTOL64):
    rng = np.random.default_rng(1)
    t_out = fn_torch(*[torch.tensor(a) for a in arrays]).numpy()
    gout = rng.standard_normal(t_out.shape)
    e_out, e_grads = _engine_grads(fn_engine, arrays, gout)
    r_out, r_grads = _torch_grads(fn_torch, arrays, gout)
    assert rel_err(e_out, r_out) <= tol
    for e, r in zip(e_grads, r_grads):
        assert rel_err(e, r) <= tol


def test_linear_op():
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 5, 7)), rng.standard_normal((3, 7))
    _check_op(linear, lambda a, b: a @ b.T, [x, w])


def test_swiglu_op():
    rng = np.random.default_rng(0)
    g, u = 4 * rng.standard_normal((3, 9)), rng.standard_normal((3, 9))
    g[0, 0], g[0, 1] = 200.0, -200.0  # no overflow at large |gate|
    _check_op(swiglu, lambda a, b: torch.nn.functional.silu(a) * b, [g, u])


def test_rope_op_and_tables():
    T, D, theta = 6, 8, 500.0
    cos, sin = rope_tables(T, D, theta, np.float64)
    i = np.arange(D // 2)
    assert np.allclose(cos[3, i], np.cos(3 * theta ** (-2 * i / D)))
    assert np.allclose(cos[:, : D // 2], cos[:, D // 2:])  # rotate-half layout

    def ref(x):
        c, s = torch.tensor(cos)[None, :, None], torch.tensor(sin)[None, :, None]
        rot = torch.cat([-x[..., D // 2:], x[..., : D // 2]], -1)
        return x * c + rot * s

    x = np.random.default_rng(0).standard_normal((2, T, 3, D))
    _check_op(lambda t: rope(t, cos, sin), ref, [x])
    # a rotation: norms of each head vector are kept
    y = rope(Tensor(x), cos, sin).data
    assert np.allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1))


@pytest.mark.parametrize("Tq,Tk,H,Hkv", [(5, 5, 4, 2), (3, 7, 2, 2), (1, 6, 6, 3), (4, 4, 3, 1)])
def test_causal_attention_op(Tq, Tk, H, Hkv):
    rng = np.random.default_rng(0)
    B, D = 2, 4
    q = rng.standard_normal((B, Tq, H, D))
    k, v = rng.standard_normal((2, B, Tk, Hkv, D))

    def ref(q, k, v):  # queries are the last Tq positions of Tk
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        k, v = k.repeat_interleave(H // Hkv, 1), v.repeat_interleave(H // Hkv, 1)
        s = q @ k.transpose(-1, -2) / math.sqrt(D)
        mask = torch.arange(Tk)[None, :] > (Tk - Tq + torch.arange(Tq))[:, None]
        return (torch.softmax(s.masked_fill(mask, -torch.inf), -1) @ v).transpose(1, 2)

    _check_op(causal_attention, ref, [q, k, v])


# -- model behaviour ------------------------------------------------------------------------


def test_causal():
    cfg = PRESETS["test"]
    m = Model(cfg)
    ids, _ = batch(cfg, 2, 12)
    ids2 = ids.copy()
    ids2[:, 8:] = (ids2[:, 8:] + 1) % cfg.vocab_size  # change the future only
    a, b = m(ids).data, m(ids2).data
    assert np.array_equal(a[:, :8], b[:, :8]) or rel_err(a[:, :8], b[:, :8]) < 1e-6
    assert rel_err(a[:, 8:], b[:, 8:]) > 1e-3


def test_overfit_one_batch():
    """A plain Adam written here drives the loss on one fixed batch near zero."""
    cfg = PRESETS["test"]
    m = Model(cfg, seed=0)
    ids, targets = batch(cfg, 4, 16, seed=3, ignore=False)
    params = m.parameters()
    mom = [np.zeros_like(p.data) for p in params]
    vel = [np.zeros_like(p.data) for p in params]
    lr, b1, b2, eps = 1e-2, 0.9, 0.999, 1e-8
    first = None
    for step in range(1, 151):
        m.zero_grad()
        loss = m.loss(ids, targets)
        loss.backward()
        first = first if first is not None else loss.item()
        for p, mo, ve in zip(params, mom, vel):
            mo *= b1
            mo += (1 - b1) * p.grad
            ve *= b2
            ve += (1 - b2) * p.grad ** 2
            p.data -= lr * (mo / (1 - b1 ** step)) / (np.sqrt(ve / (1 - b2 ** step)) + eps)
        if loss.item() < 0.05:
            break
    assert first > 3.5  # ~ln(64) at init
    assert loss.item() < 0.05, f"loss {loss.item():.3f} after {step} steps"


def test_init_deterministic_and_documented():
    cfg = PRESETS["test"]
    a, b, c = Model(cfg, seed=0), Model(cfg, seed=0), Model(cfg, seed=1)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(np.array_equal(sa[k], sb[k]) for k in sa)
    assert not np.array_equal(sa["lm_head.weight"], sc["lm_head.weight"])
    assert all(v.dtype == np.float32 for v in sa.values())
    big = Model(PRESETS["tiny"], seed=0).state_dict()
    assert abs(big["model.embed_tokens.weight"].std() - 0.02) < 1e-3
    assert abs(big["model.layers.0.mlp.down_proj.weight"].std() - 0.02 / math.sqrt(8)) < 1e-3
    assert np.array_equal(big["model.norm.weight"], np.ones(192, np.float32))


def test_names_shapes_and_count():
    cfg = PRESETS["test"]
    m = Model(cfg)
    shapes = {k: v.shape for k, v in m.named_parameters().items()}
    assert shapes["model.embed_tokens.weight"] == (64, 32)
    assert shapes["model.layers.1.self_attn.q_proj.weight"] == (32, 32)
    assert shapes["model.layers.1.self_attn.k_proj.weight"] == (16, 32)  # 2 kv heads x 8
    assert shapes["model.layers.0.self_attn.q_norm.weight"] == (8,)
    assert shapes["model.layers.0.mlp.down_proj.weight"] == (32, 64)
    assert shapes["lm_head.weight"] == (64, 32)
    assert len(shapes) == 2 + 1 + 11 * cfg.n_layers  # embed, lm_head, norm, 11 per layer
    assert m.n_params() == cfg.n_params() == sum(int(np.prod(s)) for s in shapes.values())
    no_qk = cfg.replace(qk_norm=False)
    assert Model(no_qk).n_params() == no_qk.n_params() == cfg.n_params() - 2 * 2 * 8
    assert 1_000_000 <= PRESETS["tiny"].n_params() <= 5_000_000


def test_state_dict_round_trip_and_errors():
    cfg = PRESETS["test"]
    a, b = Model(cfg, seed=0), Model(cfg, seed=1)
    ids, _ = batch(cfg, 1, 9)
    ref_p = b.params["lm_head.weight"]
    b.load_state_dict(a.state_dict())
    assert b.params["lm_head.weight"] is ref_p  # in place: optimizer references stay valid
    assert np.array_equal(a(ids).data, b(ids).data)
    sd = a.state_dict()
    sd["lm_head.weight"][0, 0] += 1  # a copy, not a view of the parameter
    assert a.params["lm_head.weight"].data[0, 0] != sd["lm_head.weight"][0, 0]

    bad = a.state_dict()
    del bad["model.norm.weight"]
    bad["model.extra"] = np.zeros(3)
    with pytest.raises(KeyError, match=r"model\.norm\.weight.*model\.extra"):
        b.load_state_dict(bad)
    missing, unexpected = b.load_state_dict(bad, strict=False)
    assert missing == ["model.norm.weight"] and unexpected == ["model.extra"]
    wrong = a.state_dict()
    wrong["lm_head.weight"] = np.zeros((3, 3), np.float32)
    with pytest.raises(ValueError, match=r"lm_head\.weight.*\(3, 3\).*\(64, 32\)"):
        b.load_state_dict(wrong)


def test_config_round_trip_and_validation():
    cfg = PRESETS["tiny"]
    assert Config.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    assert Config.from_json(cfg.to_json()) == cfg
    c = Config(vocab_size=10, dim=64, n_layers=1, n_heads=4)
    assert (c.head_dim, c.n_kv_heads, c.ffn_dim) == (16, 4, ffn_dim_for(64)) and c.ffn_dim % 32 == 0
    assert cfg.replace(vocab_size=1000).vocab_size == 1000 and cfg.vocab_size == 4096
    with pytest.raises(ValueError, match="unknown keys.*n_head"):
        Config.from_dict({**cfg.to_dict(), "n_head": 4})
    with pytest.raises(ValueError, match="not divisible by n_heads"):
        Config(dim=30, n_heads=4)
    with pytest.raises(ValueError, match="multiple of n_kv_heads"):
        Config(dim=64, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="head_dim=7 must be even"):
        Config(dim=28, n_heads=4)
    with pytest.raises(ValueError, match="vocab_size must be a positive integer"):
        Config(vocab_size=0)
    with pytest.raises(ValueError, match="dropout"):
        Config(dropout=1.5)


def test_too_long_input_is_a_clear_error():
    m = Model(PRESETS["test"])
    with pytest.raises(ValueError, match="max_seq_len=32"):
        m(np.zeros((1, 33), dtype=np.int64))
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 64\)"):
        m(np.array([[1, 64]]))
    with pytest.raises(ValueError, match=r"ids must be \(B, T\)"):
        m(np.array([1, 2]))


def test_tiny_preset_initial_loss_is_uniform():
    """With std-0.02 weights the logits start near zero: loss ~ ln(vocab_size)."""
    cfg = PRESETS["tiny"]
    m = Model(cfg, seed=0)
    ids, targets = batch(cfg, 2, 64, ignore=False)
    loss = m.loss(ids, targets)
    loss.backward()
    assert abs(loss.item() - math.log(cfg.vocab_size)) < 0.05
    assert all(np.isfinite(p.grad).all() for p in m.parameters())


def test_to_cpu_is_a_no_op_and_bad_device():
    m = Model(PRESETS["test"])
    ids, _ = batch(PRESETS["test"], 1, 5)
    before = m(ids).data
    p = m.params["lm_head.weight"]
    assert m.to("cpu") is m and m.params["lm_head.weight"] is p
    assert np.array_equal(m(ids).data, before)
    with pytest.raises(ValueError, match="'cpu' or 'cuda'"):
        m.to("tpu")


@pytest.mark.gpu
def test_gpu_matches_cpu():
    from xtrain_lessons.runtime.device import gpu_available

    if not gpu_available():
        pytest.skip("no usable GPU")
    cfg = PRESETS["test"]
    cpu, gpu = Model(cfg, seed=0), Model(cfg, seed=0).to("cuda")
    ids, targets = batch(cfg, 2, 9)
    lc, lg = cpu.loss(ids, targets), gpu.loss(ids, targets)
    lc.backward()
    lg.backward()
    assert abs(lc.item() - lg.item()) < 1e-5
    for name, p in cpu.named_parameters().items():
        assert rel_err(gpu.params[name].grad.get(), p.grad) < RTOL32, name


# -- central differences (float64), independent of torch -----------------------------------


def test_fused_ops_gradcheck():
    from xtrain_lessons.autograd.gradcheck import gradcheck

    rng = np.random.default_rng(0)
    cos, sin = rope_tables(5, 6, 100.0, np.float64)
    assert gradcheck(lambda x: rope(x, cos, sin), [rng.standard_normal((2, 5, 3, 6))])
    assert gradcheck(linear, [rng.standard_normal((2, 3, 5)), rng.standard_normal((4, 5))])
    assert gradcheck(swiglu, [3 * rng.standard_normal((3, 4)), rng.standard_normal((3, 4))])
    q = rng.standard_normal((2, 3, 4, 5))
    k, v = rng.standard_normal((2, 2, 6, 2, 5))
    assert gradcheck(causal_attention, [q, k, v])  # GQA, queries = last 3 of 6 positions


def test_model_gradcheck_micro():
    from xtrain_lessons.autograd.gradcheck import gradcheck

    cfg = Config(vocab_size=11, dim=8, n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4,
                 ffn_dim=12, max_seq_len=8)
    m = Model(cfg, seed=0, dtype=np.float64)
    names = list(m.named_parameters())
    rng = np.random.default_rng(1)
    start = [p.data + 0.2 * rng.standard_normal(p.shape) for p in m.parameters()]
    ids, targets = batch(cfg, 2, 5)

    def fn(*params):
        m.params = dict(zip(names, params))
        return m.loss(ids, targets)

    assert gradcheck(fn, start)
