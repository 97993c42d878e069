"""T15 grouped-query attention: repeat_kv against torch, group size 1 bit-identical to multi-head
attention, both attention paths (composed and flash) handle groups, and a GQA model exported
with `num_key_value_heads` passes the transformers closed loop."""

from __future__ import annotations

import json

import numpy as np
import pytest

import xtrain_lessons.model.qwen3 as model_module
from xtrain_lessons.autograd import ops
from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.model.flash_attention import flash_attention
from xtrain_lessons.model.gqa import (
    attention_param_count,
    gqa_attention,
    kv_cache_bytes,
    mha_attention,
    repeat_kv,
)
from xtrain_lessons.autograd.gradcheck import gradcheck
from xtrain_lessons.model.qwen3 import Config, Model, PRESETS
from xtrain_lessons.model.layers import causal_attention
from xtrain_lessons.runtime.host import fused_rows

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n_rep", [1, 2, 3])
def test_repeat_kv_matches_torch_repeat_interleave(n_rep, dtype):
    rng = np.random.default_rng(n_rep)
    x = rng.standard_normal((2, 5, 3, 4)).astype(dtype)  # (B, T, Hkv, D)
    g = rng.standard_normal((2, 5, 3 * n_rep, 4)).astype(dtype)
    t = Tensor(x, requires_grad=True)
    out = repeat_kv(t, n_rep)
    out.backward(g)
    tx = torch.tensor(x, requires_grad=True)
    tout = torch.repeat_interleave(tx, n_rep, dim=2)
    tout.backward(torch.tensor(g))
    np.testing.assert_array_equal(out.data, tout.detach().numpy())  # a copy: exact
    np.testing.assert_allclose(t.grad, tx.grad.numpy(), rtol=1e-6 if dtype == np.float32 else 1e-14)
    assert t.grad.dtype == dtype


def test_repeat_kv_backward_is_deterministic_and_gradchecks():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 4, 2, 3))
    assert gradcheck(lambda a: repeat_kv(a, 4), [x])
    assert gradcheck(lambda a: repeat_kv(a, 2, axis=1), [x])  # the (B, H, T, D) layout of HF
    g = rng.standard_normal((1, 4, 8, 3)).astype(np.float32)
    grads = []
    for _ in range(2):
        t = Tensor(x.astype(np.float32), requires_grad=True)
        repeat_kv(t, 4).backward(g)
        grads.append(t.grad)
    assert np.array_equal(*grads)
    with pytest.raises(ValueError):
        repeat_kv(Tensor(x), 0)


def _model_logits_and_grads(cfg, attention_fn, ids, targets, monkeypatch):
    monkeypatch.setattr(model_module, "causal_attention", attention_fn)
    model = Model(cfg, seed=0)
    logits = model(ids)
    ops.cross_entropy(logits, targets).backward()
    return logits.data, {k: p.grad for k, p in model.named_parameters().items()}


def test_group_size_one_is_bit_identical_to_multi_head(monkeypatch):
    """n_kv_heads = n_heads through the engine's grouped attention (nn.causal_attention) gives
    exactly the logits and gradients of plain multi-head attention built from T04's ops (on the
    NumPy path: runtime/host's C++ softmax is another sequence of roundings than T04's)."""
    with fused_rows.disabled():
        _group_size_one_is_bit_identical(monkeypatch)


def _group_size_one_is_bit_identical(monkeypatch):
    cfg = PRESETS["test"].replace(n_kv_heads=PRESETS["test"].n_heads)
    rng = np.random.default_rng(0)
    ids, targets = rng.integers(0, cfg.vocab_size, (2, 19)), rng.integers(0, cfg.vocab_size, (2, 19))
    grouped = _model_logits_and_grads(cfg, causal_attention, ids, targets, monkeypatch)
    mha = _model_logits_and_grads(cfg, mha_attention, ids, targets, monkeypatch)
    repeat = _model_logits_and_grads(cfg, gqa_attention, ids, targets, monkeypatch)
    for other in (mha, repeat):
        assert np.array_equal(grouped[0], other[0])
        for name in grouped[1]:
            assert np.array_equal(grouped[1][name], other[1][name]), name


@pytest.mark.parametrize("H,Hkv", [(4, 2), (6, 2), (4, 1)])
def test_composed_and_flash_handle_groups(H, Hkv):
    """Both attention paths against torch SDPA on repeat_interleave'd k, v (float64), and
    against the repeat formulation (float32)."""
    rng = np.random.default_rng(H * 10 + Hkv)
    B, T, D, G = 2, 23, 8, H // Hkv
    q = rng.standard_normal((B, T, H, D))
    k, v = rng.standard_normal((B, T, Hkv, D)), rng.standard_normal((B, T, Hkv, D))
    g = rng.standard_normal((B, T, H, D))
    tq, tk, tv = (torch.tensor(a.transpose(0, 2, 1, 3), requires_grad=True) for a in (q, k, v))
    tout = torch.nn.functional.scaled_dot_product_attention(
        tq, torch.repeat_interleave(tk, G, dim=1), torch.repeat_interleave(tv, G, dim=1), is_causal=True)
    tout.backward(torch.tensor(g.transpose(0, 2, 1, 3)))
    expect = [tout.detach().numpy().transpose(0, 2, 1, 3)] + \
             [t.grad.numpy().transpose(0, 2, 1, 3) for t in (tq, tk, tv)]
    for attn in (causal_attention, gqa_attention,
                 lambda a, b, c: flash_attention(a, b, c, block_q=8, block_k=8)):
        for dtype, tol in ((np.float64, 1e-12), (np.float32, 1e-5)):
            ts = [Tensor(a.astype(dtype), requires_grad=True) for a in (q, k, v)]
            out = attn(*ts)
            out.backward(g.astype(dtype))
            got = [out.data] + [t.grad for t in ts]
            for a, b in zip(got, expect):
                np.testing.assert_allclose(a, b, atol=tol * 10, rtol=tol)


def test_kv_cache_and_parameter_accounting():
    base = PRESETS["tiny"]
    for hkv in (4, 2, 1):
        cfg = base.replace(n_kv_heads=hkv)
        model = Model(cfg.replace(n_layers=1, vocab_size=16), seed=0)
        cache = model.new_cache(batch=2)
        measured = sum(a.nbytes for a in cache.k + cache.v)
        assert measured == kv_cache_bytes(cfg.replace(n_layers=1), batch=2)
        assert kv_cache_bytes(cfg) * base.n_kv_heads == kv_cache_bytes(base) * hkv  # shrinks by G
        attn = sum(p.size for n, p in model.named_parameters().items() if "self_attn" in n and "norm" not in n)
        assert attn == attention_param_count(cfg)
        assert model.n_params() == cfg.replace(n_layers=1, vocab_size=16).n_params()


@pytest.mark.slow
def test_gqa_model_exports_and_passes_the_transformers_closed_loop(tmp_path):
    pytest.importorskip("transformers")
    from xtrain_lessons.interop.hf import closed_loop_check, export_hf
    from xtrain_lessons.training.tokenizer import train_tokenizer_from_text

    text = ("Once upon a time there was a little girl named Lily. She liked to play in the park "
            "with her dog. One day, Tom saw a big red ball. \"Can I play?\" he asked. ") * 30
    tok = train_tokenizer_from_text(text, vocab_size=300)
    cfg = Config(vocab_size=tok.get_vocab_size(), dim=64, n_layers=2, n_heads=4, n_kv_heads=1,
                 head_dim=16, ffn_dim=128, max_seq_len=64)
    model = Model(cfg, seed=0)
    rng = np.random.default_rng(1)  # larger weights and non-unit norms: clear greedy margins
    model.load_state_dict({k: (v * 3 if v.ndim == 2 else 1 + 0.1 * rng.standard_normal(v.shape)).astype(np.float32)
                           for k, v in model.state_dict().items()})
    out = export_hf(model, tok, tmp_path / "hf")
    hf = json.loads((out / "config.json").read_text())
    assert hf["num_key_value_heads"] == 1 and hf["num_attention_heads"] == 4
    report = closed_loop_check(model, tok, out, ["Once upon a time", " Tom saw a big"], n_tokens=8)
    assert report["max_abs_dlogit"] < 1e-4, report["summary"]
    assert all(report["greedy_identical"]), report["summary"]
