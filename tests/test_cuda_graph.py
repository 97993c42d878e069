"""The training step as a CUDA graph (training/loop/cuda_graph.py): the bench's step (CudaGraphStep)
and the training loop's (LoopGraph, `xtrain train --device cuda` by default).

Without a GPU, on the stand-in for CuPy: a capture refuses a host copy or a host synchronisation
(as CUDA does), so every capture here checks the step's legality; by default the stand-in cannot
replay (the step then falls back to its eager result), and inside `cupy_standin.replaying_graphs()`
it replays what the capture recorded (arguments by value, arrays by their memory), so a graphed
loop can be compared bit for bit with the eager loop: losses, metrics, samples, checkpoints, for
float32, bf16, fp16 with a moving loss scale, dropout, gradient accumulation, a resume, evaluation
and sampling between replays, and batches of two shapes. On a GPU (`-m gpu`): the same against
the eager loop over 200 steps with a resume, and the bench's step replayed."""

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


def _graph_losses(config, dtype, batches, **kw):
    m, opt = _model(config, dtype)
    step = CudaGraphStep(m, opt, max_norm=1.0, **kw)
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

    def body_with_a_host_copy(self, entry):
        out = body(self, entry)
        standin.asarray(np.float32(1.0))
        return out

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


def test_the_bench_step_has_no_fp16_scaling_or_dropout(standin):
    config = PRESETS["test"].replace(vocab_size=300)
    m, opt = _model(config, "fp16")
    with pytest.raises(ValueError, match="no fp16 loss scaling or dropout"):
        CudaGraphStep(m, opt)
    m, opt = _model(config.replace(dropout=0.1), "float32")
    with pytest.raises(ValueError, match="LoopGraph, captures both"):
        CudaGraphStep(m, opt)


@pytest.mark.parametrize("cache_size,captures", [(2, 2), (1, 3)])
def test_the_bench_step_replayed_on_the_stand_in_trains_as_the_eager_one(standin, cache_size, captures):
    """Replays on the stand-in (replaying_graphs): 7 steps of a changing lr, batches of 2 rows but 1 at
    steps 4 and 5 (after 2 warmup steps), give the eager loop's losses and weights bit for bit.
    With room for two graphs each shape is captured once; with room for one, each change of shape
    captures again (the least recently used graph is dropped)."""
    config = PRESETS["test"].replace(vocab_size=300)
    batches = [b[:1] if i in (3, 4) else b for i, b in enumerate(_batches(300, 2, 16, 7))]
    want, want_params = _eager_losses(config, "float32", batches)
    with cupy_standin.replaying_graphs():
        got, params, step = _graph_losses(config, "float32", batches, cache_size=cache_size)
    assert step.reason is None and step.graph is not None
    assert (step.captures, step.replays, len(step.cache)) == (captures, 5 - captures, cache_size)
    assert [x.tobytes() for x in got] == [x.tobytes() for x in want]
    assert np.array_equal(params.view(np.uint32), want_params.view(np.uint32))


# ------------------------------------------------------------------ the stand-in's replays
def test_the_stand_ins_graph_replays_what_the_capture_recorded(standin):
    """Values the capture read from device memory are read again at each replay, a host scalar
    keeps the value it had, and every result lands in the memory the capture's call wrote (a copy
    that a reshape made included); outside replaying_graphs a graph cannot be launched."""
    cp = standin
    a, s = cp.arange(6, dtype=np.float32).reshape(2, 3), cp.empty((), np.float32)
    s.fill(2.0)
    lr = 0.5
    stream = cp.cuda.Stream(non_blocking=True)
    with cupy_standin.replaying_graphs(), stream:
        stream.begin_capture()
        b = (a * s + lr).T.reshape(-1)  # a reshape of a transposed view copies
        total = b.sum()
        a += 1
        e = a[0, 0]  # an element is a view, as in CuPy
        graph = stream.end_capture()
    assert total.item() == 33.0 and e.item() == 1.0
    s.fill(10.0)
    lr = 100.0  # noqa: F841 - the graph kept 0.5
    graph.launch()
    np.testing.assert_array_equal(b.get(), [10.5, 40.5, 20.5, 50.5, 30.5, 60.5])
    assert total.item() == 213.0 and a.get()[1, 2] == 7.0 and e.item() == 2.0
    with stream:
        stream.begin_capture()
        a += 1
        graph = stream.end_capture()
    with pytest.raises(RuntimeError, match="cannot replay a CUDA graph"):
        graph.launch()


def test_philox_keyed_reads_its_stream_from_device_memory():
    """The dropout kernel of a captured step: seed and offset read from a uint64 array [seed, offset]
    (plus `add`) on the device, bit for bit the by-value kernel; dropout with a DeviceKey is dropout
    at that stream (the emulator, NumPy arrays)."""
    from xtrain_lessons.model.dropout import DeviceKey, dropout  # noqa: PLC0415
    from xtrain_lessons.runtime.kernels.philox import philox_uniform, philox_uniform_keyed  # noqa: PLC0415

    key = np.array([1234, 2 ** 40 + 7], np.uint64)
    for n in (1, 5, 1001):
        got, want = philox_uniform_keyed(key, 5, n), philox_uniform(1234, 2 ** 40 + 12, n)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    with pytest.raises(ValueError, match="uint64 array of 2"):
        philox_uniform_keyed(key.astype(np.int64), 0, 4)
    x = np.random.default_rng(0).standard_normal((3, 50)).astype(np.float32)
    assert np.array_equal(dropout(x, 0.3, 99, DeviceKey(key, 2) + 3).data, dropout(x, 0.3, 1234, 2 ** 40 + 12).data)


# ------------------------------------------------------------------ the training loop's graph
@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    from test_train import small_corpus  # noqa: PLC0415

    return small_corpus(tmp_path_factory.mktemp("corpus") / "small.txt")


def _config(corpus, out, graph: bool, **kw):
    from xtrain_lessons.training.config import TrainConfig  # noqa: PLC0415

    base = dict(preset="test", vocab_size=300, steps=8, batch_size=4, seq_len=16, max_lr=1e-2, warmup=2,
                eval_every=4, eval_batches=2, sample_every=4, sample_tokens=3, checkpoint_every=4, keep_checkpoints=5,
                log_every=2, threads=1, tokenizer_impl="hf")
    return TrainConfig(**{**base, **kw, "data": str(corpus), "out": str(out), "cuda_graph": graph})


def _train(cfg=None, lines=None, **kw):
    from xtrain_lessons.training.loop import train  # noqa: PLC0415

    r = train(cfg, progress=False, log=(lines.append if lines is not None else lambda _: None), **kw)
    assert r.status in ("done", "stopped"), r.summary
    return r


def _run_record(out):
    """What a run leaves, less what differs between two runs of it (run id, timing, the folder, the
    setting itself): metrics, samples, and per checkpoint the tensors, their metadata and state.json."""
    import json  # noqa: PLC0415

    from safetensors import safe_open  # noqa: PLC0415

    timing = ("tokens_per_s", "tokens_per_s_per_rank", "elapsed_s")
    metrics = [{k: v for k, v in json.loads(line).items() if k not in timing}
               for line in (out / "metrics.jsonl").read_text().splitlines()]
    ckpts = {}
    for d in sorted((out / "checkpoints").glob("step_*")):
        state = json.loads((d / "state.json").read_text())
        for k in ("run_id", "files", "config_hash"):
            state.pop(k)
        state["train_config"].pop("out"), state["train_config"].pop("cuda_graph")
        files = {}
        for f in ("model.safetensors", "optimizer.safetensors"):  # (the header's key order is the library's)
            with safe_open(str(d / f), "np") as t:
                files[f] = (t.metadata(), {k: t.get_tensor(k).tobytes() for k in t.keys()})
        ckpts[d.name] = (state, files)
    return metrics, (out / "samples.txt").read_text(), ckpts


def _assert_same_run(a, b):
    ma, sa, ca = _run_record(a)
    mb, sb, cb = _run_record(b)
    assert ma == mb
    assert sa == sb
    assert sorted(ca) == sorted(cb) and ca == cb


@pytest.fixture
def replaying(standin):
    with cupy_standin.replaying_graphs():
        yield standin


def _stepper_spy(monkeypatch):
    """The loop's steppers, as device_stepper made them."""
    from xtrain_lessons.training.loop import cuda_graph, step  # noqa: PLC0415

    made = []

    def spy(trainer):
        made.append(cuda_graph.device_stepper(trainer))
        return made[-1]

    monkeypatch.setattr(step, "device_stepper", spy)
    return made


@pytest.mark.slow
def test_the_graphed_loop_resumed_is_the_eager_loop(replaying, corpus, tmp_path, monkeypatch):
    """float32: 8 steps with evaluation, a sample and a checkpoint every 4 (eager, between replays),
    the graphed run stopped at step 4 and resumed; the eager run straight through. Metrics, samples
    and both checkpoints bit for bit; after the resume the step was captured again and replayed."""
    made, lines = _stepper_spy(monkeypatch), []
    _train(_config(corpus, tmp_path / "graph", True), lines, stop_at=4)
    _train(resume=tmp_path / "graph", lines=lines)
    _train(_config(corpus, tmp_path / "eager", False))
    _assert_same_run(tmp_path / "graph", tmp_path / "eager")
    assert [(s.captures, s.replays, s.reason) for s in made[:2]] == [(1, 1, None), (1, 1, None)]
    assert sum(line.startswith("CUDA graph: the step is captured and replayed") for line in lines) == 2


@pytest.mark.slow
def test_fp16_dropout_and_accumulation_graphed_are_the_eager_loop(replaying, corpus, tmp_path, monkeypatch):
    """fp16 with a loss scale kept near where the fp16 gradients overflow (from 2^21, growth after 2
    clean steps: measured here, the scales the steps used were 2^21 2^20 2^20 2^21 2^20 2^20 2^19 2^19,
    steps 1, 4, 6 and 8 skipped), so that replays skip steps and back off; dropout 0.1 (a new mask at
    every replay: its key read from device memory); 2 micro-batches per step; evaluation and a
    checkpoint every 4. The graphed loop is the eager loop, bit for bit."""
    from functools import partial  # noqa: PLC0415

    from xtrain_lessons.training.loop import trainer  # noqa: PLC0415

    monkeypatch.setattr(trainer, "GradScaler", partial(trainer.GradScaler, init_scale=2.0 ** 21, growth_interval=2))
    made = _stepper_spy(monkeypatch)
    kw = dict(dtype="fp16", accum_steps=2, model={"dropout": 0.1}, sample_every=0)
    _train(_config(corpus, tmp_path / "graph", True, **kw))
    _train(_config(corpus, tmp_path / "eager", False, **kw))
    _assert_same_run(tmp_path / "graph", tmp_path / "eager")
    assert (made[0].captures, made[0].replays, made[0].reason) == (1, 5, None)
    metrics = _run_record(tmp_path / "graph")[0]
    assert metrics[-1]["skipped_steps"] > metrics[2]["skipped_steps"], metrics  # a replayed step skipped


@pytest.mark.slow
def test_batches_of_two_shapes_graphed_are_the_eager_loop(replaying, corpus, tmp_path, monkeypatch):
    """bf16, batches 4 and 7 partial (3 rows of 4), evaluation every 4 steps: each shape is captured
    once (steps 3 and 4) and replayed after; the eager loop's bits, and no host synchronisation in
    a step but a capture's one check."""
    from xtrain_lessons.training import data, loop  # noqa: PLC0415

    get_batch = data.TokenDataset.get_batch

    def some_partial(self, batch_size, seq_len, rng):
        x, y = get_batch(self, batch_size, seq_len, rng)
        some_partial.n += 1
        return (x[:3], y[:3]) if some_partial.n % 3 == 1 and some_partial.n > 3 else (x, y)

    monkeypatch.setattr(data.TokenDataset, "get_batch", some_partial)
    made = _stepper_spy(monkeypatch)
    counted_syncs, real = [], loop.Trainer.train_step

    def counted(self):
        before = replaying.stats["host_syncs"]
        real(self)
        counted_syncs.append(replaying.stats["host_syncs"] - before)

    monkeypatch.setattr(loop.Trainer, "train_step", counted)
    kw = dict(dtype="bf16", steps=9, eval_every=4, sample_every=0, checkpoint_every=0)
    some_partial.n = 0
    _train(_config(corpus, tmp_path / "graph", True, **kw))
    graph_syncs, counted_syncs[:] = list(counted_syncs), []
    some_partial.n = 0
    _train(_config(corpus, tmp_path / "eager", False, **kw))
    _assert_same_run(tmp_path / "graph", tmp_path / "eager")
    g = made[0]
    assert (g.captures, g.replays, g.reason, len(g.cache)) == (2, 5, None, 2)
    assert graph_syncs == [0, 0, 1, 1, 0, 0, 0, 0, 0]


@pytest.mark.slow
def test_a_step_that_cannot_be_captured_runs_eagerly_with_one_line(standin, corpus, tmp_path, monkeypatch):
    """A host synchronisation inside the step (here injected into the loop's device step): the
    capture refuses it, one line names it, and the run goes on eagerly with the eager results."""
    from xtrain_lessons.training import loop  # noqa: PLC0415

    real = loop.Trainer.device_step

    def with_a_sync(self, *a, **k):
        out = real(self, *a, **k)
        float(out[0])  # reads the loss on the host
        return out

    monkeypatch.setattr(loop.Trainer, "device_step", with_a_sync)
    lines = []
    _train(_config(corpus, tmp_path / "graph", True, steps=4, eval_every=0, sample_every=0), lines)
    off = [line for line in lines if line.startswith("CUDA graph")]
    assert len(off) == 1 and "cudaErrorStreamCaptureUnsupported: a host synchronisation" in off[0], off
    _train(_config(corpus, tmp_path / "eager", False, steps=4, eval_every=0, sample_every=0))
    _assert_same_run(tmp_path / "graph", tmp_path / "eager")


def test_what_keeps_the_step_eager_is_said_once(standin):
    """--no-cuda-graph, --log-every 1 and `xtrain launch` keep the GPU's step eager, each with one
    line naming it; on the CPU the step is eager and nothing is said (there is no graph to speak of)."""
    from types import SimpleNamespace  # noqa: PLC0415

    from xtrain_lessons.training.config import TrainConfig  # noqa: PLC0415
    from xtrain_lessons.training.loop.cuda_graph import LoopGraph, device_stepper  # noqa: PLC0415

    m, opt = _model(PRESETS["test"].replace(vocab_size=300), "float32")

    def trainer(**kw):
        t = SimpleNamespace(cfg=TrainConfig(), deferred=True, opt=opt, model=m, ddp=None, device="cuda", said=[])
        t.__dict__.update(kw)
        t.say, t.device_step = t.said.append, "eager"
        return t

    t = trainer()
    assert isinstance(device_stepper(t), LoopGraph) and t.said == []
    for kw, what, step in [(dict(cfg=TrainConfig(cuda_graph=False)), "--no-cuda-graph", "eager"),
                           (dict(deferred=False), "--log-every 1", "eager"),
                           (dict(ddp=object()), "xtrain launch", "eager"),
                           (dict(device="cpu", deferred=False), None, "eager")]:
        t = trainer(**kw)
        assert device_stepper(t) == step
        if what is None:
            assert t.said == []
        else:
            assert len(t.said) == 1 and t.said[0].startswith(f"CUDA graph: off ({what}"), t.said
            assert t.said[0].endswith("the step runs eagerly")


def test_the_cli_switch(capsys):
    from xtrain_lessons.cli import main  # noqa: PLC0415

    with pytest.raises(SystemExit):
        main.main(["train", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--no-cuda-graph" in text and "captured once per batch shape as a CUDA graph" in text
    args = main.build_parser().parse_args(["train", "--no-cuda-graph"])
    assert args.cuda_graph is False and main.build_parser().parse_args(["train"]).cuda_graph is None


# ------------------------------------------------------------------ the loop on a real GPU
def _gpu_run_pair(monkeypatch, corpus, tmp_path, steps, stop_at=None, **kw):
    """(the graphed runs' steppers, their lines, every run's summary): the graphed loop (stopped at
    `stop_at` and resumed, when given) and the eager loop, on the GPU, in tmp_path/graph and /eager."""
    made, lines = _stepper_spy(monkeypatch), []
    device.set_device("cuda")
    try:
        cfg = _config(corpus, tmp_path / "graph", True, steps=steps, **kw)
        runs = [_train(cfg, lines, stop_at=stop_at)] if stop_at else []
        runs.append(_train(resume=tmp_path / "graph", lines=lines) if stop_at else _train(cfg, lines))
        runs.append(_train(_config(corpus, tmp_path / "eager", False, steps=steps, **kw)))
    finally:
        device.set_device(None)
    return made[:-1], lines, [r.summary for r in runs]


def _record_gpu(name: str, values: dict) -> None:
    """Print a measurement and add it to $XTRAIN_GPU_RESULTS/cuda_graph.json when set."""
    import json  # noqa: PLC0415
    import os  # noqa: PLC0415
    from pathlib import Path  # noqa: PLC0415

    print(f"{name}: {json.dumps(values)}")
    folder = os.environ.get("XTRAIN_GPU_RESULTS")
    if folder:
        path = Path(folder) / "cuda_graph.json"
        data = json.loads(path.read_text()) if path.exists() else {}
        data[name] = values
        path.write_text(json.dumps(data, indent=1))


GPU_RUN = dict(preset="tiny", vocab_size=512, batch_size=8, seq_len=128, max_lr=3e-3, warmup=20, eval_every=20,
               eval_batches=2, sample_every=100, sample_tokens=8, checkpoint_every=100, log_every=10, threads=0)


@pytest.mark.gpu
@pytest.mark.skipif(not device.gpu_available(), reason="needs CuPy and an NVIDIA GPU")
@pytest.mark.parametrize("dtype", ["float32", "bf16"])
def test_on_a_gpu_the_graphed_loop_resumed_is_the_eager_loop(dtype, corpus, tmp_path, monkeypatch):
    """The tiny model, 200 steps of 8 x 128, evaluation every 20 steps (its last batch partial), a
    sample and a checkpoint every 100; the graphed run stopped at step 100 and resumed, the eager
    run straight through: metrics, samples and checkpoints bit for bit, every step after the
    captures replayed."""
    made, lines, summaries = _gpu_run_pair(monkeypatch, corpus, tmp_path, 200, stop_at=100, dtype=dtype, **GPU_RUN)
    _assert_same_run(tmp_path / "graph", tmp_path / "eager")
    assert [(s.captures, s.replays, s.reason) for s in made] == [(1, 97, None), (1, 97, None)], \
        [(s.captures, s.replays, s.reason) for s in made]
    _record_gpu(f"loop_{dtype}", {"graph_tok_s": [s["tokens_per_s_this_session"] for s in summaries[:2]],
                                  "eager_tok_s": summaries[2]["tokens_per_s_this_session"],
                                  "lines": [line for line in lines if line.startswith("CUDA graph")]})


@pytest.mark.gpu
@pytest.mark.skipif(not device.gpu_available(), reason="needs CuPy and an NVIDIA GPU")
def test_on_a_gpu_fp16_dropout_and_accumulation_graphed_are_the_eager_loop(corpus, tmp_path, monkeypatch):
    """fp16 with the loss scale moving during the replays (from 2^30, growth every 5 clean steps),
    dropout 0.1 and 2 micro-batches of 4 x 128 per step, 60 steps: bit for bit the eager loop."""
    from functools import partial  # noqa: PLC0415

    from xtrain_lessons.training.loop import trainer  # noqa: PLC0415

    monkeypatch.setattr(trainer, "GradScaler", partial(trainer.GradScaler, init_scale=2.0 ** 30, growth_interval=5))
    kw = {**GPU_RUN, "batch_size": 4, "sample_every": 0, "checkpoint_every": 30}
    made, lines, summaries = _gpu_run_pair(monkeypatch, corpus, tmp_path, 60, dtype="fp16", accum_steps=2,
                                           model={"dropout": 0.1}, **kw)
    _assert_same_run(tmp_path / "graph", tmp_path / "eager")
    assert (made[0].captures, made[0].replays, made[0].reason) == (1, 57, None)
    metrics = _run_record(tmp_path / "graph")[0]
    scales = [m["loss_scale"] for m in metrics]
    assert metrics[-1]["skipped_steps"] >= 2 and len(set(scales)) >= 3, scales
    _record_gpu("loop_fp16_dropout_accum", {"graph_tok_s": summaries[0]["tokens_per_s_this_session"],
                                            "eager_tok_s": summaries[1]["tokens_per_s_this_session"],
                                            "skipped": metrics[-1]["skipped_steps"], "scales": sorted(set(scales))})
