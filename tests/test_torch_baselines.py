"""The PyTorch baselines of `xtrain bench train` (measure/torch_twin.py) and the GPU bench's MFU
table (measure/gpu_specs.py), without a GPU: every kind is built from the engine's weights and
takes the engine's first step (same loss); the compiled kinds compile the loss and the optimizer
step (a fast backend stands in for inductor); the whole-step graph warms up, puts the weights and
AdamW back, and its first replay is the first step (a stand-in records instead of CUDA); a kind that
cannot run here says why in one line. On a GPU (`-m gpu`) every kind runs on the device."""

from __future__ import annotations

import numpy as np
import pytest

from xtrain_lessons.measure import torch_twin
from xtrain_lessons.measure.bench import _batches, engine_stepper
from xtrain_lessons.measure.gpu_specs import SPECS, spec_peak
from xtrain_lessons.model.qwen3 import PRESETS
from xtrain_lessons.runtime import device

torch = pytest.importorskip("torch")
CONFIG = PRESETS["test"].replace(vocab_size=64)


@pytest.fixture(scope="module")
def engine():
    """The engine's first losses on four batches, and its initial weights."""
    step, init = engine_stepper(CONFIG)
    batches = _batches(64, 2, 8, 4)
    return [step(b)[0] for b in batches], init, batches


def _losses(step, batches):
    return [float(step(b)[0]) for b in batches]


@pytest.mark.parametrize("kind", ["eager", "sdpa", "amp"])
def test_each_cpu_kind_takes_the_engines_first_step(engine, kind):
    want, init, batches = engine
    step, threads = torch_twin.torch_stepper(CONFIG, init, 1, kind)
    step.prepare(batches)  # a no-op on the CPU
    got = _losses(step, batches)
    tol = 4 * 2 ** -8 if kind == "amp" else 1e-5  # amp: bf16 logits
    assert abs(got[0] - want[0]) <= tol * want[0], (got, want)
    assert threads == 1 and step.warmup_steps == 0


def test_kinds_that_cannot_run_here_say_why_in_one_line(engine):
    init = engine[1]
    for kind in ("reduce-overhead", "cuda-graph"):
        with pytest.raises(torch_twin.BaselineUnavailable, match=f"^{kind} is a CUDA graph: it needs torch with CUDA"):
            torch_twin.torch_stepper(CONFIG, init, 1, kind)
    for kind in ("compile", "reduce-overhead", "cuda-graph"):
        with pytest.raises(torch_twin.BaselineUnavailable, match="fp16's GradScaler"):
            torch_twin.torch_stepper(CONFIG, init, 1, kind, device="cuda", precision="fp16")
    with pytest.raises(ValueError, match="kind must be one of"):
        torch_twin.torch_stepper(CONFIG, init, 1, "jit")
    with pytest.raises(ValueError, match="precision must be one of"):
        torch_twin.torch_stepper(CONFIG, init, 1, "sdpa", precision="int8")


def test_fp16_with_gradscaler_takes_the_first_step(engine):
    want, init, batches = engine
    step, _ = torch_twin.torch_stepper(CONFIG, init, 1, "sdpa", precision="fp16")
    assert abs(_losses(step, batches[:1])[0] - want[0]) <= 2 ** -6 * want[0]


@pytest.fixture
def fast_compile(monkeypatch):
    """torch.compile with the aot_eager backend (dynamo traces, AOTAutograd makes the backward, no
    code generation): what the compiled kinds hand to torch.compile, without inductor's minutes."""
    calls = []

    def compile_(torch, fn, mode):
        calls.append((fn.__name__, mode))
        return torch.compile(fn, backend="aot_eager")

    monkeypatch.setattr(torch_twin, "_compile", compile_)
    yield calls
    torch._dynamo.reset()  # the compiled graphs go: later tests start from a clean dynamo cache


@pytest.mark.slow
def test_compile_compiles_the_loss_and_the_optimizer_step(engine, fast_compile):
    want, init, batches = engine
    sdpa = _losses(torch_twin.torch_stepper(CONFIG, init, 1, "sdpa")[0], batches)
    got = _losses(torch_twin.torch_stepper(CONFIG, init, 1, "compile")[0], batches)
    assert fast_compile == [("loss_fn", None), ("update", None)]
    assert np.allclose(got, sdpa, rtol=1e-5) and abs(got[0] - want[0]) <= 1e-5 * want[0]


@pytest.mark.slow
def test_reduce_overhead_marks_each_step_for_cuda_graph_trees(engine, fast_compile, monkeypatch):
    """Its mode reaches torch.compile, each step begins a new CUDA-graph-trees iteration, and the
    bench gives it two untimed steps (a warm-up run, then the recording) before timing."""
    want, init, batches = engine
    marks = []
    monkeypatch.setattr(torch_twin, "_check", lambda *a: None)  # let it build on the CPU
    monkeypatch.setattr(torch.compiler, "cudagraph_mark_step_begin", lambda: marks.append(1))
    step, _ = torch_twin.torch_stepper(CONFIG, init, 1, "reduce-overhead")
    got = _losses(step, batches)
    assert fast_compile == [("loss_fn", "reduce-overhead"), ("update", "reduce-overhead")]
    assert len(marks) == len(batches) and step.warmup_steps == 2
    assert abs(got[0] - want[0]) <= 1e-5 * want[0]


def test_the_whole_step_graph_replays_from_the_engines_weights(engine, monkeypatch):
    """cuda-graph's capture logic on the CPU: the recorder stands for torch.cuda.graph (recording
    runs nothing; each replay runs the step, refilling its output), so the three warm-up steps
    before the capture must be undone for the first replay to be the engine's first step, and the
    replays must then follow the eager sdpa twin step by step (its batch copied in each time)."""
    want, init, batches = engine
    recorded = []

    def record(torch, fn, stream):
        out = torch.zeros(())
        recorded.append(fn)
        return (lambda: out.copy_(fn())), out

    monkeypatch.setattr(torch_twin, "_check", lambda *a: None)
    monkeypatch.setattr(torch_twin, "_record", record)
    step, _ = torch_twin.torch_stepper(CONFIG, init, 1, "cuda-graph")
    got = _losses(step, batches)
    sdpa = _losses(torch_twin.torch_stepper(CONFIG, init, 1, "sdpa")[0], batches)
    assert len(recorded) == 1  # captured once, at the first step
    assert abs(got[0] - want[0]) <= 1e-5 * want[0]
    assert np.allclose(got, sdpa, rtol=1e-6), (got, sdpa)


def test_the_spec_table_finds_cards_by_their_cuda_names():
    cases = {"NVIDIA H100 80GB HBM3": ("H100 SXM", 989.4), "NVIDIA H100 PCIe": ("H100 PCIe", 756.5),
             "NVIDIA H200": ("H200", 989.4), "NVIDIA A100-SXM4-80GB": ("A100", 312.0),
             "NVIDIA A100 80GB PCIe": ("A100", 312.0), "NVIDIA L40S": ("L40S", 362.05), "NVIDIA L4": ("L4", 121.0),
             "NVIDIA A10": ("A10", 125.0), "NVIDIA GeForce RTX 4090": ("RTX 4090", 165.2)}
    for name, (card, tflops) in cases.items():
        spec = spec_peak(name, "bf16")
        assert (spec.card, spec.flops) == (card, tflops * 1e12), name
    for other in ("NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GH200 480GB", "NVIDIA A10G", "NVIDIA L40",
                  "NVIDIA GeForce RTX 4090 D", "Tesla T4", "CuPy stand-in (NumPy on the CPU)"):
        assert spec_peak(other, "bf16") is None, other  # unknown: the bench falls back to the measured peak
    h100 = {d: spec_peak("NVIDIA H100 80GB HBM3", d).flops / 1e12 for d in ("float32", "tf32", "bf16", "fp16")}
    assert h100 == {"float32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4}
    for card, _, peaks, source in SPECS:  # dense tensor peaks above the CUDA cores', tf32 at most bf16's
        assert peaks["fp32"] <= peaks["tf32"] <= peaks["bf16"] == peaks["fp16"], card
        assert source.startswith("NVIDIA"), card
    with pytest.raises(ValueError, match="unknown dtype"):
        spec_peak("NVIDIA H100 PCIe", "int8")


requires_gpu = pytest.mark.skipif(not (device.gpu_available() and torch.cuda.is_available()),
                                  reason="needs CuPy, torch with CUDA and an NVIDIA GPU")


@pytest.mark.gpu
@requires_gpu
@pytest.mark.parametrize("kind", ["sdpa", "cuda-graph", "compile", "reduce-overhead"],
                         ids=lambda k: k.replace("-", "_"))  # gpu_check's quick run deselects the compiled two
@pytest.mark.parametrize("precision", ["float32", "bf16"])
def test_each_kind_on_the_gpu_takes_the_engines_first_step(engine, kind, precision):
    """On the device: pinned batches, fused AdamW (capturable for the graph), autocast in bf16; the
    first loss is the engine's CPU float32 one within the precision's rounding."""
    want, init, batches = engine
    step, _ = torch_twin.torch_stepper(CONFIG, init, None, kind, device="cuda", precision=precision)
    step.prepare(batches)
    got = [float(step(b)[0]) for b in batches]
    tol = 1e-4 if precision == "float32" else 2 ** -6
    assert abs(got[0] - want[0]) <= tol * want[0], (kind, precision, got, want)
    assert all(np.isfinite(got))
