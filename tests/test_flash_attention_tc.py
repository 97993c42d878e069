"""Flash-attention on the tensor cores (kernels/flash_attention_tc.cu, issue 39): the bf16 kernels
on the CPU emulator against plain attention in float64, then the same checks at realistic sizes
on a GPU (`-m gpu`).

Oracle: `flash_attention_tc_reference` / `_bwd_reference`, the whole score matrix in float64 from
the same bf16 values. Tolerances follow from bf16's precision (8 bits, unit roundoff u = 2^-9):
the kernel rounds P to bf16 before P V (|dO| <= u max|v|) and rounds o once (<= u |o|), so
|o - o_ref| <= 2u max|v|; the backward rounds P and dS to bf16 and reads the rounded o in
rowsum(dO * O): its errors stay within 2% of each gradient's largest value (measured: 0.2-0.5%),
while every mistake tried (a mask off by one key, a missing scale, a dropped tile) is off by 10%
or more. Shapes are not multiples of the 64-row tiles and the head dims cover the buckets the
presets use (8 -> 16, 20 -> 32 (no 16-byte copies), 48 tiny, 64 20m / GPT-2-small, 128).
"""

from __future__ import annotations

import re
import tracemalloc

import numpy as np
import pytest

from xtrain_lessons.runtime.cuda import KERNELS_DIR, KernelError, Module
from xtrain_lessons.runtime.kernels.flash_attention_tc import (
    BF16,
    BUCKETS,
    NAME_EXPRESSIONS,
    flash_attention_tc_bwd,
    flash_attention_tc_bwd_reference,
    flash_attention_tc_fwd,
    flash_attention_tc_reference,
    head_bucket,
)

U = 2.0 ** -9  # bf16's unit roundoff
GRAD_TOL = 0.02  # of the largest |gradient|


def _qkv(B, Tq, H, Hkv, D, Tk=None, seed=0, xp=np):
    rng = np.random.default_rng(seed)
    Tk = Tq if Tk is None else Tk
    arrays = (rng.standard_normal((B, Tq, H, D)), rng.standard_normal((B, Tk, Hkv, D)),
              rng.standard_normal((B, Tk, Hkv, D)), rng.standard_normal((B, Tq, H, D)))
    return [xp.asarray(a.astype(np.float32).astype(BF16)) for a in arrays]


def _f64(a):
    return np.asarray(a.get() if hasattr(a, "get") else a).astype(np.float64)


def check_forward(q, k, v, o, lse, causal=True):
    o_ref, lse_ref = flash_attention_tc_reference(q, k, v, causal=causal)
    assert _f64(o).dtype == np.float64 and o.dtype == BF16 and lse.dtype == np.float32
    err = np.abs(_f64(o) - o_ref).max()
    assert err <= 2 * U * np.abs(_f64(v)).max(), f"o: max error {err:.4g}"
    assert np.abs(_f64(lse) - lse_ref).max() <= 1e-5 * (1 + np.abs(lse_ref).max())


def check_backward(q, k, v, g, grads, causal=True):
    refs = flash_attention_tc_bwd_reference(q, k, v, g, causal=causal)
    for name, a, ref in zip(("dq", "dk", "dv"), grads, refs):
        assert a.dtype == BF16 and a.shape == ref.shape, name
        err = np.abs(_f64(a) - ref).max() / np.abs(ref).max()
        assert err <= GRAD_TOL, f"{name}: max error {err:.3%} of the largest value"


@pytest.mark.parametrize("shape,causal", [
    ((1, 37, 37, 2, 1, 8), True),    # D 8 -> bucket 16, multi-query (Hkv = 1)
    ((2, 20, 29, 4, 2, 20), True),   # queries after a prefix (Tk > Tq), D 20: no 16-byte copies
    ((1, 70, 70, 2, 2, 48), True),   # tiny's head dim; a partial second tile of 64 rows
    ((1, 100, 100, 4, 2, 64), True),  # GQA, the presets' 64
    ((1, 33, 33, 2, 1, 128), True),  # the largest bucket: 32-key tiles in the backward
    ((1, 45, 45, 2, 1, 32), False),
])
def test_kernels_match_float64_attention(shape, causal):
    B, Tq, Tk, H, Hkv, D = shape
    q, k, v, g = _qkv(B, Tq, H, Hkv, D, Tk=Tk, seed=D)
    o, lse = flash_attention_tc_fwd(q, k, v, causal=causal)
    check_forward(q, k, v, o, lse, causal)
    grads = flash_attention_tc_bwd(q, k, v, o, lse, g, causal=causal)
    check_backward(q, k, v, g, grads, causal)


def test_the_tolerances_catch_mistakes():
    """A mask one key too wide, or a wrong scale, is far outside the tolerances above."""
    q, k, v, g = _qkv(1, 40, 2, 1, 16, seed=3)
    o, lse = flash_attention_tc_fwd(q, k, v, scale=1.1 / 4.0)
    with pytest.raises(AssertionError, match="o: max error"):
        check_forward(q, k, v, o, lse)
    # a mask one key too wide: query i also sees key i + 1 (a key appended at the end makes the
    # reference's queries the last Tq of Tq + 1 positions)
    wide, _ = flash_attention_tc_reference(q, np.concatenate([k, k[:, :1]], 1), np.concatenate([v, v[:, :1]], 1))
    o_ref, _ = flash_attention_tc_reference(q, k, v)
    assert np.abs(wide[:, :-1] - o_ref[:, :-1]).max() > 10 * 2 * U * np.abs(_f64(v)).max()
    dq, dk, dv = flash_attention_tc_bwd(q, k, v, *flash_attention_tc_fwd(q, k, v), g, scale=1.1 / 4.0)
    with pytest.raises(AssertionError, match="max error"):
        check_backward(q, k, v, g, (dq, dk, dv))


def test_deterministic_no_atomics():
    """One block owns each dK, dV row and each dQ row: two runs give the same bits."""
    q, k, v, g = _qkv(2, 50, 4, 2, 32, seed=4)
    o, lse = flash_attention_tc_fwd(q, k, v)
    o2, lse2 = flash_attention_tc_fwd(q, k, v)
    assert np.array_equal(o.view(np.uint16), o2.view(np.uint16)) and np.array_equal(lse, lse2)
    a, b = flash_attention_tc_bwd(q, k, v, o, lse, g), flash_attention_tc_bwd(q, k, v, o, lse, g)
    assert all(np.array_equal(x.view(np.uint16), y.view(np.uint16)) for x, y in zip(a, b))


def test_masked_tiles_are_skipped_not_computed():
    """A NaN in a key/value row can only reach a query that touches that row's tile. Rows whose
    whole 16-row warp is before key 40 stay finite: the tile of keys 40.. is never multiplied
    for them (a kernel that computed it and masked afterwards gets 0 * NaN = NaN). The same in
    the backward: a NaN query row 5 reaches no dK, dV row from key 16 on."""
    q, k, v, g = _qkv(1, 100, 2, 1, 16, seed=5)
    k[:, 40], v[:, 40] = np.nan, np.nan
    o, lse = flash_attention_tc_fwd(q, k, v)
    assert np.isfinite(_f64(o[:, :32])).all() and np.isfinite(lse[:, :, :32]).all()
    assert np.isnan(_f64(o[:, 40:])).all()  # the rows that see key 40
    dq, _, _ = flash_attention_tc_bwd(q, k, v, o, lse, g)
    assert np.isfinite(_f64(dq[:, :32])).all()
    q, k, v, g = _qkv(1, 100, 2, 1, 16, seed=6)
    o, lse = flash_attention_tc_fwd(q, k, v)
    q[:, 5], g[:, 5] = np.nan, np.nan
    _, dk, dv = flash_attention_tc_bwd(q, k, v, o, lse, g)
    assert np.isfinite(_f64(dk[:, 16:])).all() and np.isfinite(_f64(dv[:, 16:])).all()
    assert np.isnan(_f64(dk[:, :6])).all()  # keys 0..5 are seen by query 5


def test_memory_is_linear_in_t():
    """Nothing of size T x T: every allocation of forward and backward together (tracemalloc sees
    each NumPy array) stays under 8 copies of q, a sixteenth of one head's score matrix here."""
    T, H, D = 512, 2, 16
    q, k, v, g = _qkv(1, T, H, H, D, seed=7)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        o, lse = flash_attention_tc_fwd(q, k, v)
        grads = flash_attention_tc_bwd(q, k, v, o, lse, g)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    assert peak <= 8 * q.nbytes < T * T * 4 / 2, (peak, q.nbytes)
    check_backward(q, k, v, g, grads)


def test_the_sanitizer_runs_the_kernels_and_finds_a_missing_barrier(monkeypatch):
    """Under the sanitizer (every shared access checked) the kernels give the same bits. Without
    the barrier after the block fills its row statistics (Ls, Ds), a warp reads them before
    they are written: the sanitizer names the array."""
    q, k, v, g = _qkv(1, 20, 2, 1, 16, seed=8)
    o, lse = flash_attention_tc_fwd(q, k, v)
    grads = flash_attention_tc_bwd(q, k, v, o, lse, g)
    monkeypatch.setenv("XTRAIN_SANITIZE", "1")
    o2, lse2 = flash_attention_tc_fwd(q, k, v)
    grads2 = flash_attention_tc_bwd(q, k, v, o2, lse2, g)
    assert np.array_equal(o.view(np.uint16), o2.view(np.uint16)) and np.array_equal(lse, lse2)
    assert all(np.array_equal(x.view(np.uint16), y.view(np.uint16)) for x, y in zip(grads, grads2))
    monkeypatch.delenv("XTRAIN_SANITIZE")
    src = (KERNELS_DIR / "flash_attention_tc.cu").read_text()
    barrier = "            }\n            __syncthreads();\n            const int q_last"
    assert src.count(barrier) == 1
    broken = src.replace(barrier, "            }\n            const int q_last")
    mod = Module(broken, name_expressions=["flash_tc_bwd_dkdv<16>"], backend="cpu", sanitize=True)
    dk, dv = np.empty_like(k), np.empty_like(v)
    dsum = (_f64(o) * _f64(g)).sum(-1).transpose(0, 2, 1).astype(np.float32).copy()
    i32 = np.int32
    with pytest.raises(KernelError, match=r"shared memory never written: (Ls|Ds)\[|race on (Ls|Ds)\["):
        mod.get_function("flash_tc_bwd_dkdv<16>")((1, 1), (128,), (
            q, k, v, lse, dsum, g, dk, dv, i32(1), i32(20), i32(20), i32(2), i32(1), i32(16), np.float32(0.25),
            i32(1), i32(0)))


def test_input_checks():
    q, k, v, g = _qkv(1, 8, 2, 1, 16)
    with pytest.raises(TypeError, match="bfloat16"):
        flash_attention_tc_fwd(q.astype(np.float32), k, v)
    with pytest.raises(ValueError, match="head dim 130"):
        flash_attention_tc_fwd(*_qkv(1, 4, 1, 1, 130)[:3])
    with pytest.raises(ValueError, match="not a multiple"):
        flash_attention_tc_fwd(*_qkv(1, 4, 3, 2, 16)[:3])
    with pytest.raises(ValueError, match="Tq <= Tk"):
        flash_attention_tc_fwd(q, k[:, :4], v[:, :4])
    o, lse = flash_attention_tc_fwd(q, k, v)
    with pytest.raises(TypeError, match="lse"):
        flash_attention_tc_bwd(q, k, v, o, lse[:, :1], g)


def test_buckets_are_the_files_instantiations():
    src = (KERNELS_DIR / "flash_attention_tc.cu").read_text()
    assert tuple(int(x) for x in re.findall(r"^FA_INSTANTIATE\((\d+)\)", src, re.M)) == BUCKETS
    assert len(NAME_EXPRESSIONS) == 3 * len(BUCKETS)
    assert [head_bucket(d) for d in (1, 16, 17, 48, 64, 65, 100, 128)] == [16, 16, 32, 48, 64, 96, 128, 128]


# ---- in the model, on the CPU stand-in for CuPy (kernels on the emulator) -------------------
@pytest.fixture
def standin(monkeypatch):
    """`import cupy` gives the CPU stand-in and the device is "cuda" (as tests/test_fake_cupy.py)."""
    from xtrain_lessons.runtime import cupy_standin, device
    from xtrain_lessons.runtime import cuda as cuda_kernels

    before = cupy_standin.install()
    monkeypatch.setattr(device, "_gpu_ok", None)
    device.set_device("cuda")
    try:
        yield cupy_standin
    finally:
        device.set_device(None)
        device._gpu_ok = None
        for key in [k for k in cuda_kernels._loaded if k[2] == "gpu"]:
            del cuda_kernels._loaded[key]
        cupy_standin.uninstall(before)


def _model_loss(attention, device, dtype, ids):
    from xtrain_lessons.model.qwen3 import PRESETS, Model
    from xtrain_lessons.model.recompute import saved_bytes

    m = Model(PRESETS["test"].replace(vocab_size=64, max_seq_len=64, attention=attention), seed=0)
    if device == "cuda":
        m = m.to("cuda")
    m.compute_dtype = dtype
    loss = m.loss(ids, ids)
    kept = saved_bytes(loss)
    loss.backward()
    grads = {k: _f64(p.grad) for k, p in m.params.items()}
    return float(loss.data), grads, kept


@pytest.mark.standin
@pytest.mark.parametrize("attention", ["composed", "flash"])
def test_gpu_bf16_training_runs_attention_on_the_tensor_core_kernels(standin, monkeypatch, attention):
    """On the GPU in bf16 the model's attention is the tensor-core kernel (either attention
    setting: `--attention flash` is no longer refused in bf16 there). Its loss and gradients are
    the float32 model's within bf16's rounding, as close as composed bf16 attention's (measured:
    1.01x its distance over all gradients), and it keeps O(T) for backward instead of P (here
    127 KB less: P's 128 KB, less the 4 KB of lse)."""
    from xtrain_lessons.model import precision
    from xtrain_lessons.model.layers import causal_attention

    ids = np.random.default_rng(0).integers(0, 64, (2, 64))
    loss32, grads32, _ = _model_loss("composed", "cpu", "float32", ids)
    launches = dict(standin.calls)
    loss, grads, kept = _model_loss(attention, "cuda", "bf16", ids)
    used = {name for name, n in standin.calls.items() if n > launches.get(name, 0)}
    assert {"kernel:flash_tc_fwd<16>", "kernel:flash_tc_bwd_dq<16>", "kernel:flash_tc_bwd_dkdv<16>"} <= used
    monkeypatch.setattr(precision, "gpu_attention", causal_attention)  # composed bf16 attention
    loss_c, grads_c, kept_c = _model_loss("composed", "cuda", "bf16", ids)

    def dist(g):
        return np.sqrt(sum(((g[k] - grads32[k]) ** 2).sum() for k in g) / sum((grads32[k] ** 2).sum() for k in g))

    assert abs(loss - loss32) <= 0.01 * abs(loss32) and abs(loss_c - loss32) <= 0.01 * abs(loss32)
    assert dist(grads) <= 1.25 * dist(grads_c), (dist(grads), dist(grads_c))
    p_bytes = 2 * 2 * 4 * 64 * 64 * 2  # P of one layer: (B, Hkv, G * T, T) bf16, 2 layers
    assert kept_c - kept >= 0.9 * p_bytes, (kept_c, kept)


@pytest.mark.standin
def test_gpu_float32_flash_runs_on_the_cuda_core_kernel(standin):
    """`--attention flash` in float32 on the GPU: the CUDA-core kernel (kernels/flash_attention.cu),
    not the array code's Python loops; the same values as the array code on the CPU."""
    from xtrain_lessons.autograd.tensor import Tensor
    from xtrain_lessons.model.flash_attention import flash_attention

    rng = np.random.default_rng(1)
    q, k, v, g = (rng.standard_normal(s).astype(np.float32) for s in ((2, 30, 4, 16), (2, 30, 2, 16),
                                                                      (2, 30, 2, 16), (2, 30, 4, 16)))
    ts = [Tensor(a, requires_grad=True) for a in (q, k, v)]
    out = flash_attention(*ts)
    out.backward(g)
    before = standin.calls["kernel:flash_attention_fwd"]
    dts = [Tensor(standin.asarray(a), requires_grad=True) for a in (q, k, v)]
    dout = flash_attention(*dts)
    dout.backward(standin.asarray(g))
    assert standin.calls["kernel:flash_attention_fwd"] == before + 1
    assert np.abs(dout.data.get() - out.data).max() <= 1e-5
    for a, b in zip(dts, ts):
        assert np.abs(a.grad.get() - b.grad).max() <= 1e-4
