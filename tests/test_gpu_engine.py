"""The GPU engine, measured without a GPU (issue "The GPU engine"): the device calls of a training
step against PyTorch eager's ATen ops for the same step, no host synchronisation inside a step;
and, where a GPU is present (`-m gpu`), a float32 and a bf16 step on the device against the CPU's.

Device calls are counted on the CPU stand-in for CuPy (cupy_standin) through the loop's
own train_step (measure/device_calls.py); they do not depend on the batch, the sequence length
or the vocabulary (one launch per op), so a small batch counts a large one."""

from __future__ import annotations

import numpy as np
import pytest

from xtrain_lessons.measure.device_calls import engine_step_calls, torch_step_ops
from xtrain_lessons.model.qwen3 import PRESETS
from xtrain_lessons.runtime import device


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["tiny", "20m"])
def test_device_calls_per_step_are_at_most_torch_eagers_aten_ops(preset):
    """Measured before the GPU engine (the CPU's row blocks and matmul chunks on the GPU): 2,478
    device calls a tiny float32 step; PyTorch eager: 1,367 ATen ops (583 of them views)."""
    pytest.importorskip("torch")
    torch_ops = torch_step_ops(PRESETS[preset])
    for dtype in ("float32", "bf16"):
        engine = engine_step_calls(preset, dtype=dtype)
        assert engine.host_syncs == 0, (dtype, engine.by_name)
        assert engine.total <= torch_ops.total, (preset, dtype, engine.total, torch_ops.total)
    assert engine_step_calls(preset, dtype="float32").total <= torch_ops.total - torch_ops.views  # even without views


def test_a_step_makes_one_launch_per_op_whatever_its_size():
    """The count is a property of the code path: batch 2 x 16 and 4 x 32 make the same calls."""
    small, large = engine_step_calls("test", 2, 16), engine_step_calls("test", 4, 32)
    assert small.total == large.total and small.by_name == large.by_name


# ------------------------------------------------------------------ on a real GPU
requires_gpu = pytest.mark.skipif(not device.gpu_available(), reason="needs CuPy and an NVIDIA GPU")


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("dtype", ["float32", "bf16", "fp16"])
def test_a_gpu_step_matches_the_cpu_step(dtype):
    """One forward + backward of the tiny model on the GPU (cuBLAS, the course's kernels) and on
    the CPU from the same weights and batch: the loss within the rounding of the dtype (float32:
    1e-5 relative, as two float32 implementations of a 4-layer model agree; bf16: 2^-6, a few bf16
    roundings of the logits; fp16 the same), every gradient within 1e-3 (float32) / 5e-2 (bf16,
    fp16) of its norm."""
    from xtrain_lessons.model.qwen3 import Model  # noqa: PLC0415

    config = PRESETS["tiny"].replace(vocab_size=2048)
    ids = np.random.default_rng(0).integers(0, 2048, (8, 129))
    results = {}
    for where in ("cpu", "cuda"):
        m = Model(config, seed=0)
        if where == "cuda":
            m.to("cuda")
        m.compute_dtype = dtype
        loss = m.loss(ids[:, :-1], ids[:, 1:])
        scale = 2.0 ** 16 if dtype == "fp16" else 1.0  # fp16 needs the loss scale, as the loop's GradScaler
        (loss * scale).backward()  # gives it (without, the small gradients underflow float16)
        results[where] = (float(loss.item()), {k: device.to_host(p.grad) / scale for k, p in m.params.items()})
    (l_cpu, g_cpu), (l_gpu, g_gpu) = results["cpu"], results["cuda"]
    assert abs(l_gpu - l_cpu) <= (1e-5 if dtype == "float32" else 2 ** -6) * abs(l_cpu)
    tol = 1e-3 if dtype == "float32" else 5e-2
    for k in g_cpu:
        assert np.linalg.norm(g_gpu[k] - g_cpu[k]) <= tol * np.linalg.norm(g_cpu[k]), k


@pytest.mark.gpu
@requires_gpu
def test_bf16_products_on_the_device():
    """runtime/gpu_blas.matmul on real CuPy (2-D bf16: CuPy's own cuBLAS call; stacked: one
    cublasGemmStridedBatchedEx of gpu_blas's): 2-D, stacked, transposed views, attention's heads
    view and a float32 destination, as the engine calls it; the result is the float32 product of
    the bf16 values rounded to bf16 once, within float32 summation order (1 bf16 ulp)."""
    import ml_dtypes  # noqa: PLC0415

    from xtrain_lessons.runtime import gpu_blas  # noqa: PLC0415

    cp = device.import_cupy()
    rng = np.random.default_rng(0)
    bf = ml_dtypes.bfloat16
    # (a's shape, b's shape, how b is seen, how a is seen, float32 out)
    cases = [((64, 96), (96, 80), None, None, False), ((4, 3, 33, 16), (4, 3, 16, 40), None, None, False),
             ((50, 96), (80, 96), "T", None, False), ((4, 3, 33, 16), (4, 3, 40, 16), "T", None, False),
             ((4, 3, 16, 33), (4, 3, 16, 40), None, "T", True), ((4, 3, 33, 40), (4, 40, 3, 16), "heads", None, False)]
    for sa, sb, b_view, a_view, f32_out in cases:
        a, b = rng.standard_normal(sa).astype(bf), rng.standard_normal(sb).astype(bf)
        see = {None: lambda x: x, "T": lambda x: x.swapaxes(-1, -2), "heads": lambda x: x.transpose(0, 2, 1, 3)}
        da, db = see[a_view](cp.asarray(a)), see[b_view](cp.asarray(b))
        want = see[a_view](a.astype(np.float32)) @ see[b_view](b.astype(np.float32))
        out = cp.empty(want.shape, np.float32) if f32_out else None
        got = gpu_blas.matmul(da, db, out)
        assert got.dtype == (np.float32 if f32_out else bf) and got.shape == want.shape
        err = np.abs(cp.asnumpy(got).astype(np.float32) - want)
        assert np.all(err <= 2.0 ** -7 * np.abs(want) + 1e-5), (sa, sb, float(err.max()))