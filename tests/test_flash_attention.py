"""T14 flash-attention: the tiled NumPy version and the CUDA C kernels against composed attention.

Oracles: `nn.causal_attention` (the composed path the model uses, float32), the plain formula
in float64 (`attention_reference`, for the logsumexp), central differences in float64
(`gradcheck`). Sequence lengths are not multiples of the tiles, so partial tiles and the
causal diagonal crossing a tile are exercised.
"""

from __future__ import annotations

import numpy as np
import pytest

from xtrain_lessons.autograd.tensor import Tensor
from xtrain_lessons.model.flash_attention import (
    attention_memory,
    attention_reference,
    flash_attention,
    flash_attention_bwd,
    flash_attention_fwd,
    saved_bytes,
)
from xtrain_lessons.autograd.gradcheck import gradcheck
from xtrain_lessons.model.qwen3 import Config, Model, PRESETS
from xtrain_lessons.model.layers import causal_attention, square_attention

F32_OUT, F32_GRAD = 1e-5, 1e-4  # the tolerances of the phase (float32)


def _qkv(B, Tq, H, Hkv, D, Tk=None, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    Tk = Tq if Tk is None else Tk
    q = rng.standard_normal((B, Tq, H, D)).astype(dtype)
    k = rng.standard_normal((B, Tk, Hkv, D)).astype(dtype)
    v = rng.standard_normal((B, Tk, Hkv, D)).astype(dtype)
    g = rng.standard_normal((B, Tq, H, D)).astype(dtype)
    return q, k, v, g


def _run(attn, q, k, v, g):
    ts = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = attn(*ts)
    out.backward(g)
    return out.data, [t.grad for t in ts]


def _maxdiff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.mark.parametrize("T", [1, 17, 100])
@pytest.mark.parametrize("block_q,block_k", [(16, 16), (32, 8), (7, 64)])
@pytest.mark.parametrize("H,Hkv", [(4, 4), (4, 2)])
def test_flash_equals_composed(T, block_q, block_k, H, Hkv):
    q, k, v, g = _qkv(2, T, H, Hkv, 16, seed=T)
    out_c, grads_c = _run(causal_attention, q, k, v, g)
    out_f, grads_f = _run(lambda a, b, c: flash_attention(a, b, c, block_q=block_q, block_k=block_k),
                          q, k, v, g)
    assert out_f.dtype == np.float32 and out_f.shape == out_c.shape
    assert _maxdiff(out_f, out_c) <= F32_OUT
    for name, a, b in zip("qkv", grads_f, grads_c):
        assert a.shape == b.shape, name
        assert _maxdiff(a, b) <= F32_GRAD, f"d{name}"
    # the saved logsumexp equals the formula's (float64 oracle, float32 tolerance)
    _, lse = flash_attention_fwd(q, k, v, True, block_q, block_k)
    _, lse_ref = attention_reference(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    assert lse.shape == (2, H, T)
    np.testing.assert_allclose(lse, lse_ref, rtol=1e-6, atol=F32_OUT)


def test_queries_after_a_prefix_and_non_causal():
    """Tk > Tq (decoding with a KV cache: the queries are the last Tq positions), and
    causal=False against the float64 formula."""
    q, k, v, g = _qkv(1, 5, 4, 2, 8, Tk=23, seed=3)
    out_c, grads_c = _run(causal_attention, q, k, v, g)
    out_f, grads_f = _run(lambda a, b, c: flash_attention(a, b, c, block_q=2, block_k=4), q, k, v, g)
    assert _maxdiff(out_f, out_c) <= F32_OUT
    assert max(_maxdiff(a, b) for a, b in zip(grads_f, grads_c)) <= F32_GRAD
    q, k, v, g = _qkv(1, 19, 2, 1, 8, seed=4)
    out, lse = flash_attention_fwd(q, k, v, causal=False, block_q=8, block_k=5)
    out_r, lse_r = attention_reference(*(a.astype(np.float64) for a in (q, k, v)), causal=False)
    assert _maxdiff(out, out_r) <= F32_OUT and _maxdiff(lse, lse_r) <= F32_OUT


@pytest.mark.parametrize("H,Hkv", [(2, 2), (4, 2)])
def test_gradcheck_float64(H, Hkv):
    q, k, v, _ = _qkv(1, 6, H, Hkv, 4, seed=5, dtype=np.float64)
    assert gradcheck(lambda a, b, c: flash_attention(a, b, c, block_q=4, block_k=4), [q, k, v])
    assert gradcheck(lambda a, b, c: flash_attention(a, b, c, causal=False, block_q=5, block_k=2),
                     [q, k, v])


def test_float64_matches_formula_tightly():
    q, k, v, g = _qkv(1, 33, 4, 2, 8, seed=6, dtype=np.float64)
    out, lse = flash_attention_fwd(q, k, v, True, 8, 16)
    out_r, lse_r = attention_reference(q, k, v)
    assert _maxdiff(out, out_r) < 1e-12 and _maxdiff(lse, lse_r) < 1e-12


def test_input_checks():
    q, k, v, _ = _qkv(1, 4, 3, 2, 8)
    with pytest.raises(ValueError, match="not divisible"):
        flash_attention_fwd(q, k, v)
    q, k, v, _ = _qkv(1, 4, 2, 2, 8, Tk=3)
    with pytest.raises(ValueError, match="Tk=3 < Tq=4"):
        flash_attention_fwd(q, k, v)


def test_model_flash_equals_composed():
    cfg = PRESETS["test"]  # GQA: 4 query heads, 2 kv heads
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (2, 29))
    targets = rng.integers(0, cfg.vocab_size, (2, 29))
    results = {}
    for attention in ("composed", "flash"):
        model = Model(cfg.replace(attention=attention), seed=0)
        loss = model.loss(ids, targets)
        loss.backward()
        results[attention] = (float(loss.data), {k: p.grad for k, p in model.named_parameters().items()})
    (lc, gc), (lf, gf) = results["composed"], results["flash"]
    assert abs(lc - lf) <= 1e-5
    for name in gc:
        assert _maxdiff(gf[name], gc[name]) <= 1e-5, name
    # decoding through the KV cache takes the flash path too (Tk > Tq)
    model = Model(cfg.replace(attention="flash"), seed=0)
    cache = model.new_cache(batch=2)
    model.forward_cached(ids[:, :20], cache, 0)
    step = model.forward_cached(ids[:, 20:], cache, 20)
    full = Model(cfg, seed=0).forward_cached(ids, Model(cfg, seed=0).new_cache(2), 0)
    assert _maxdiff(step, full[:, 20:]) <= 1e-5


def test_config_attention_field():
    d = PRESETS["test"].to_dict()
    assert d["attention"] == "composed"
    d.pop("attention")  # a config.json written before T14
    assert Config.from_dict(d).attention == "composed"
    assert Config.from_dict({**d, "attention": "flash"}).attention == "flash"
    with pytest.raises(ValueError, match="attention"):
        PRESETS["test"].replace(attention="fast")


def test_memory_flash_keeps_no_scores():
    """What each path keeps for backward and its peak (tracemalloc), at T = 512."""
    T, H, D = 512, 2, 32
    q, k, v, g = _qkv(1, T, H, H, D, seed=7)
    ts = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    composed = attention_memory(square_attention, *ts, g)  # the whole square, as T05 builds it
    flash = attention_memory(flash_attention, *ts, g)
    scores = H * T * T * 4
    assert composed["saved"] >= scores  # the probabilities P, (H, T, T) float32
    assert flash["saved"] == q.nbytes + H * T * 4  # O and L, nothing else
    assert saved_bytes(flash_attention(*ts)) == flash["saved"]
    assert flash["peak"] < scores and flash["peak"] < 0.5 * composed["peak"]


# ---- the CUDA C kernels on the CPU emulator ------------------------------------------------

@pytest.mark.parametrize("shape,blocks,causal", [
    ((1, 37, 37, 4, 2, 16), (16, 16), True),   # T = 37: partial tiles, GQA
    ((2, 9, 20, 2, 1, 8), (4, 32), True),      # queries after a prefix (Tk > Tq)
    ((1, 13, 13, 2, 2, 8), (8, 5), False),
])
def test_cuda_kernels_match_numpy(shape, blocks, causal):
    from xtrain_lessons.runtime.kernels.flash_attention import (
        flash_attention_bwd_cuda,
        flash_attention_fwd_cuda,
    )
    B, Tq, Tk, H, Hkv, D = shape
    q, k, v, g = _qkv(B, Tq, H, Hkv, D, Tk=Tk, seed=8)
    out, lse = flash_attention_fwd_cuda(q, k, v, causal, *blocks)
    out_r, lse_r = flash_attention_fwd(q, k, v, causal, *blocks)
    assert _maxdiff(out, out_r) <= F32_OUT and _maxdiff(lse, lse_r) <= F32_OUT
    grads = flash_attention_bwd_cuda(q, k, v, out, lse, g, causal, *blocks)
    grads_r = flash_attention_bwd(q, k, v, out_r, lse_r, g, causal, *blocks)
    for name, a, b in zip("qkv", grads, grads_r):
        assert _maxdiff(a, b) <= F32_GRAD, f"d{name}"
    # deterministic: no atomics, one writer per output row
    again = flash_attention_bwd_cuda(q, k, v, out, lse, g, causal, *blocks)
    assert all(np.array_equal(a, b) for a, b in zip(grads, again))


@pytest.mark.gpu
def test_cuda_kernels_and_array_code_on_gpu():
    from xtrain_lessons.runtime.device import gpu_available
    if not gpu_available():
        pytest.skip("needs CuPy and an NVIDIA GPU")
    import cupy as cp
    from xtrain_lessons.runtime.kernels.flash_attention import (
        flash_attention_bwd_cuda,
        flash_attention_fwd_cuda,
    )
    q, k, v, g = _qkv(2, 77, 4, 2, 64, seed=9)
    out_r, lse_r = flash_attention_fwd(q, k, v)
    grads_r = flash_attention_bwd(q, k, v, out_r, lse_r, g)
    dq, dk, dv, dg = (cp.asarray(a) for a in (q, k, v, g))
    out, lse = flash_attention_fwd_cuda(dq, dk, dv)
    assert _maxdiff(cp.asnumpy(out), out_r) <= F32_OUT and _maxdiff(cp.asnumpy(lse), lse_r) <= F32_OUT
    grads = flash_attention_bwd_cuda(dq, dk, dv, out, lse, dg)
    for a, b in zip(grads, grads_r):
        assert _maxdiff(cp.asnumpy(a), b) <= F32_GRAD
    out_x, lse_x = flash_attention_fwd(dq, dk, dv)  # the array code on CuPy
    assert _maxdiff(cp.asnumpy(out_x), out_r) <= F32_OUT
