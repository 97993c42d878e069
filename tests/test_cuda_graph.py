"""The training step as a CUDA graph (training/loop/cuda_graph.py). Without a GPU, on the stand-in for
CuPy: the step records without a host copy or a host synchronisation (the stand-in refuses both
during a capture, as CUDA does), the graph's step gives the eager step's bits (its AdamW reads lr
and the bias corrections from the device), and a step that cannot be captured falls back to the
eager result. On a GPU (`-m gpu`): captured, replayed, and bit for bit the eager training."""

from __future__ import annotations

import numpy as np
import pytest

from xtrain_lessons.measure.bench import _batches
from xtrain_lessons.model.qwen3 import PRESETS, Model
from xtrain_lessons.runtime import cuda as cuda_kernels
from xtrain_lessons import cupy_standin
from xtrain_lessons.runtime import device
from xtrain_lessons.training.loop.cuda_graph import CudaGraphStep
from xtrain_lessons.training.optim import AdamW


@pytest.fixture
def standin(monkeypatch):
    before = cupy_standin.install()
    monkeypatch.setattr(device, "_gpu_ok", None)
    monkeypatch.setenv("XTRAIN_STANDIN_KERNELS", "reference")
    device.set_device("cuda")
    try:
        yield cupy_standin
    finally:
        device.set_device(None)
        device._gpu_ok = None
        for key in [k for k in cuda_kernels._loaded if k[2] == "gpu"]:
            del cuda_kernels._loaded[key]
        cupy_standin.uninstall(before)


def _model(config, dtype):
    m = Model(config, seed=0)
    m.to("cuda")
    m.compute_dtype = dtype
    return m, AdamW(m.named_parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)


def _eager_losses(config, dtype, batches):
    """The training loop's eager step (AdamW with lr and bias corrections by value)."""
    m, opt = _model(config, dtype)
    losses = []
    for i, b in enumerate(batches):
        m.zero_grad()
        loss = m.loss(b[:, :-1], b[:, 1:])
        loss.backward()
        opt.clip_grad_norm(1.0)
        opt.step(lr=1e-3 * (0.5 + 0.1 * i))  # a schedule: the graph must follow a changing lr
        losses.append(device.to_host(loss.data))
    return losses, device.to_host(opt.flat_param)


def _graph_losses(config, dtype, batches):
    m, opt = _model(config, dtype)
    step = CudaGraphStep(m, opt, max_norm=1.0)
    losses = []
    for i, b in enumerate(batches):
        opt.set_lr(1e-3 * (0.5 + 0.1 * i))
        losses.append(device.to_host(step(b)))
    return losses, device.to_host(opt.flat_param), step


@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_the_step_records_without_host_copies_or_waits_and_keeps_the_eager_bits(standin, dtype):
    config = PRESETS["test"].replace(vocab_size=300)
    batches = _batches(300, 2, 16, 5)
    want, want_params = _eager_losses(config, dtype, batches)
    got, params, step = _graph_losses(config, dtype, batches)
    # the capture itself went through (no host copy, no synchronisation in the step); the stand-in
    # then cannot replay, so the step fell back to its eager result
    assert step.reason is not None and "cannot replay a CUDA graph" in step.reason, step.reason
    assert [x.tobytes() for x in got] == [x.tobytes() for x in want]
    assert np.array_equal(params.view(np.uint32), want_params.view(np.uint32))


def test_a_step_that_copies_from_the_host_is_not_captured(standin, monkeypatch):
    """The mistake a capture cannot record: a host value copied to the device inside the step (a
    graph would re-read a stale buffer at every replay). The capture fails, the step says why and
    keeps the eager step's result."""
    body = CudaGraphStep._body

    def body_with_a_host_copy(self):
        loss = body(self)
        standin.asarray(np.float32(1.0))
        return loss

    monkeypatch.setattr(CudaGraphStep, "_body", body_with_a_host_copy)
    config = PRESETS["test"].replace(vocab_size=300)
    batches = _batches(300, 2, 16, 4)
    want, want_params = _eager_losses(config, "float32", batches)
    got, params, step = _graph_losses(config, "float32", batches)
    assert "cudaErrorStreamCaptureUnsupported" in step.reason and "host to device" in step.reason, step.reason
    assert [x.tobytes() for x in got] == [x.tobytes() for x in want]
    assert np.array_equal(params, want_params)


def test_cupys_cublas_binding_is_refused_during_a_capture_as_on_a_gpu(standin):
    """What the first capture on an H100 met: CuPy's binding of cuBLAS raises inside a capture
    (cupy.matmul, and cupy_backends' gemmStridedBatchedEx); gpu_blas's products go through
    cuBLAS's own entry point (runtime/cublas_direct.py), which a capture may record."""
    from cupy_backends.cuda.libs import cublas  # noqa: PLC0415 - the stand-in's

    from xtrain_lessons.runtime import gpu_blas  # noqa: PLC0415

    cp = standin
    a = cp.ones((2, 4, 4), np.float32)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        s.begin_capture()
        try:
            with pytest.raises(NotImplementedError, match="calling cuBLAS API during stream capture"):
                cp.matmul(a, a)
            with pytest.raises(NotImplementedError, match="calling cuBLAS API during stream capture"):
                cublas.gemmStridedBatchedEx(cp.cuda.device.get_cublas_handle(), 0, 0, 4, 4, 4,
                                            gpu_blas._ALPHA.ctypes.data, a.data.ptr, 0, 4, 16, a.data.ptr, 0, 4, 16,
                                            gpu_blas._BETA.ctypes.data, a.data.ptr, 0, 4, 16, 2, 68, -1)
            y = gpu_blas.matmul(a, a)
        finally:
            s.end_capture()
    np.testing.assert_array_equal(y.get(), np.full((2, 4, 4), 4, np.float32))


def test_the_batch_is_checked_on_the_host(standin):
    config = PRESETS["test"].replace(vocab_size=300)
    step = CudaGraphStep(*_model(config, "float32"))
    bad = _batches(300, 2, 16, 1)[0].copy()
    bad[0, 3] = 300
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 300\)"):
        step(bad)
    with pytest.raises(ValueError, match="the batch must be"):
        step(bad[0])
    bad = _batches(300, 2, 16, 1)[0].copy()
    bad[1, -1] = -5  # a target only (the last column is never an input)
    with pytest.raises(ValueError, match=r"targets must lie in \[0, 300\)"):
        step(bad)


@pytest.mark.gpu
@pytest.mark.skipif(not device.gpu_available(), reason="needs CuPy and an NVIDIA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_on_a_gpu_the_replayed_step_trains_as_the_eager_one(dtype):
    """Captured (checked bit for bit at the capture) and replayed for the steps after: the losses
    and the final weights of 6 steps equal the eager loop's, bit for bit."""
    config = PRESETS["tiny"].replace(vocab_size=2048)
    batches = _batches(2048, 8, 128, 6)
    want, want_params = _eager_losses(config, dtype, batches)
    got, params, step = _graph_losses(config, dtype, batches)
    assert step.reason is None and step.graph is not None
    assert [x.tobytes() for x in got] == [x.tobytes() for x in want]
    assert np.array_equal(params.view(np.uint32), want_params.view(np.uint32))


def test_steps_with_host_state_are_refused(standin):
    config = PRESETS["test"].replace(vocab_size=300)
    m, opt = _model(config, "fp16")
    with pytest.raises(ValueError, match="fp16 loss scaling and dropout"):
        CudaGraphStep(m, opt)
    m, opt = _model(config.replace(dropout=0.1), "float32")
    with pytest.raises(ValueError, match="run those steps eagerly"):
        CudaGraphStep(m, opt)
