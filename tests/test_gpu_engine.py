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

# ------------------------------------------------------------------ the GPU bench, on the stand-in
@pytest.fixture
def standin(monkeypatch):
    from xtrain_lessons.runtime import cuda as cuda_kernels  # noqa: PLC0415
    from xtrain_lessons import cupy_standin  # noqa: PLC0415

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


class _FakeTorchCuda:
    """What bench_gpu asks of torch.cuda: synchronisation and the allocator's counters."""

    def __init__(self):
        self.allocated, self.peak = 0, 0

    def synchronize(self):
        pass

    def memory_allocated(self):
        return self.allocated

    def reset_peak_memory_stats(self):
        self.peak = self.allocated

    def max_memory_allocated(self):
        return self.peak


def _fake_baselines(config, cuda):
    """Torch baselines standing in for torch_twin's: one that cannot be built here, one whose first
    step fails (a compile error), one of another model (its first loss differs), one that fails
    while timed, and a faithful one (the CPU engine from the same weights) holding 3 MiB between
    steps and 1 MiB more during one."""
    from xtrain_lessons.measure.bench import engine_stepper  # noqa: PLC0415
    from xtrain_lessons.measure.torch_twin import BaselineUnavailable  # noqa: PLC0415

    def make(config_, init, threads, kind, device=None, precision=None):
        if kind == "cuda-graph":
            raise BaselineUnavailable("cuda-graph is a CUDA graph: it needs torch with CUDA on a GPU")
        calls = [0]
        good, _ = engine_stepper(config)
        cuda.allocated += 3 * 2 ** 20 if kind == "sdpa" else 0

        def step(b):
            calls[0] += 1
            if kind == "compile":
                raise RuntimeError("InductorError: no C++ compiler\nmore detail")
            if kind == "eager" and calls[0] > 1:
                raise RuntimeError("CUDA graph trees: accessing an overwritten output")
            loss, t = good(b)
            cuda.peak = max(cuda.peak, cuda.allocated + 2 ** 20)
            return (loss + 1.0 if kind == "amp" else loss), t

        step.prepare = lambda batches: None
        return step, 1

    return make


def test_the_gpu_bench_reports_each_baseline_in_one_line_and_checks_the_first_losses(standin, monkeypatch, capsys):
    """Baselines that cannot run are one line each and the others go on; a baseline whose first loss
    is not the engine's is marked and makes the exit code 1; MFU falls back to the measured peak for
    a card not in the spec table; each stepper's peak memory is what it holds plus one step's extra."""
    import argparse  # noqa: PLC0415

    from xtrain_lessons.measure import bench_gpu, torch_twin  # noqa: PLC0415

    cuda = _FakeTorchCuda()
    config = PRESETS["test"].replace(vocab_size=300)
    monkeypatch.setattr(bench_gpu, "_torch_cuda", lambda: type("T", (), {"cuda": cuda})())
    monkeypatch.setattr(torch_twin, "torch_stepper", _fake_baselines(config, cuda))
    args = argparse.Namespace(preset="test", vocab_size=300, batch_size=2, seq_len=16, steps=1, rounds=2,
                              no_torch=False, against="sdpa,compile,cuda-graph,amp,eager", dtype="float32",
                              cuda_graph=False, peak_n=256, attention=None)
    assert bench_gpu.run_train_bench_gpu(args) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    said = {ln.split(":")[0]: ln for ln in lines if ln.startswith("torch ")}
    assert said["torch compile"] == "torch compile: not measured: RuntimeError: InductorError: no C++ compiler"
    assert said["torch cuda-graph"].startswith("torch cuda-graph: not measured: BaselineUnavailable: cuda-graph is")
    assert said["torch eager"].startswith("torch eager: not measured: failed while timed: RuntimeError")
    assert "LOSS MISMATCH" in said["torch amp"] and "LOSS MISMATCH" not in said["torch sdpa"]
    assert "step peak memory 4.0 MiB" in said["torch sdpa"]
    assert "is not in the table of spec peaks" in "\n".join(lines)
    assert lines[-1].startswith("throughput vs torch: sdpa ") and ", amp " in lines[-1] and "compile" not in lines[-1]
    assert "(float32), measured)" in lines[-1]


def test_environment_yml_asks_for_the_gpu_extra():
    """environment.yml's GPU line installs exactly pyproject's gpu extra: CuPy 14, NumPy >= 2.1.2."""
    import re  # noqa: PLC0415
    import tomllib  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    repo = Path(__file__).resolve().parents[1]
    gpu = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["optional-dependencies"]["gpu"]
    assert sorted(gpu) == ["cupy-cuda12x[ctk]>=14.0", "numpy>=2.1.2"]
    line = next(ln for ln in (repo / "environment.yml").read_text().splitlines() if "pip install" in ln and "cupy" in ln)
    assert sorted(re.findall(r'"([^"]+)"', line)) == sorted(gpu), line
