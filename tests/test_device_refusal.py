"""A device asked for by name is used or refused (issue 39): `xtrain <any command but doctor>
--device cuda` where no GPU answers is one line and exit 2 before any work (no tokenizer trained,
no run folder begun); bf16 on a GPU without bf16 tensor cores likewise; `xtrain sample --device
cuda` runs on the GPU (the stand-in here) rather than silently on the CPU."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from test_train import small_corpus
from xtrain_lessons import cupy_standin
from xtrain_lessons.cli import device_check, main
from xtrain_lessons.runtime import device

REPO = Path(__file__).resolve().parents[1]
TINY = ["--preset", "test", "--vocab-size", "300", "--steps", "2", "--batch-size", "2", "--seq-len", "16",
        "--eval-every", "0", "--sample-every", "0", "--checkpoint-every", "0", "--no-progress", "--no-hf-check",
        "--no-export", "--tokenizer-impl", "hf"]


@pytest.fixture(autouse=True)
def device_variable_restored(monkeypatch):
    """`xtrain --device X` sets XTRAIN_DEVICE for the process (its subprocesses inherit it): put it
    back after each test, so that a later test does not run on a device one of these asked for."""
    monkeypatch.setenv("XTRAIN_DEVICE", "auto")


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    """A two-step run trained on the CPU, for `xtrain sample`."""
    root = tmp_path_factory.mktemp("run")
    corpus = small_corpus(root / "small.txt")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XTRAIN_DEVICE", "auto")  # put back after `--device cpu` set it
        assert main.main(["train", "--device", "cpu", "--data", str(corpus), "--out", str(root / "run"), *TINY]) == 0
    return root / "run"


@pytest.mark.skipif(device.gpu_available(), reason="this machine has a GPU: nothing to refuse")
@pytest.mark.parametrize("command", [["train"], ["bench", "train"], ["sample", "RUN"], ["eval", "RUN", "--data", "x.txt"],
                                     ["export", "RUN", "--out", "hf"], ["study", "--preset", "quick"],
                                     ["grpo", "RUN", "--reward", "word:dog"],
                                     ["launch", "--nproc", "2", "DEVICE", "--", "xtrain", "train"],
                                     ["notebooks", "DEVICE", "run", "T00"], ["data", "DEVICE", "fetch", "tinystories"]],
                         ids=lambda c: " ".join(a for a in c if a != "DEVICE"))
def test_the_gpu_asked_for_where_there_is_none_is_one_line_before_any_work(command, cpu_run, tmp_path):
    args = [str(cpu_run) if a == "RUN" else a for a in command]  # --device where the parser takes it
    args = [x for a in args for x in (["--device", "cuda"] if a == "DEVICE" else [a])]
    if "DEVICE" not in command:
        args += ["--device", "cuda"]
    env = {k: v for k, v in os.environ.items() if k not in ("XTRAIN_DEVICE", "XTRAIN_DEBUG")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    p = subprocess.run([sys.executable, "-m", "xtrain_lessons.cli.main", *args], cwd=tmp_path,
                       env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert p.stdout == "" and len(p.stderr.strip().splitlines()) == 1, p.stdout + p.stderr
    line = p.stderr.strip()
    assert line.startswith(f"xtrain {command[0]}: error: --device cuda") and "nothing was done" in line
    assert "--device cpu" in line and "Traceback" not in line
    assert list(tmp_path.iterdir()) == [], "the refused command left files behind"


def test_why_no_gpu_names_the_missing_piece(monkeypatch):
    def no_cupy():
        raise ImportError("no module named cupy")

    monkeypatch.setattr(device, "import_cupy", no_cupy)
    assert "CuPy is not installed" in device_check.why_no_gpu()

    class Runtime:
        @staticmethod
        def getDeviceCount():
            raise RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")

    fake = types.SimpleNamespace(__version__="14.2.0", cuda=types.SimpleNamespace(runtime=Runtime))
    monkeypatch.setattr(device, "import_cupy", lambda: fake)
    assert device_check.why_no_gpu() == ("CuPy 14.2.0 finds no GPU (cudaErrorNoDevice: no CUDA-capable device "
                                         "is detected)")


def test_a_bad_device_variable_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("XTRAIN_DEVICE", "tpu")
    assert main.main(["train", "--steps", "1"]) == 2
    assert capsys.readouterr().err.strip() == "xtrain train: error: XTRAIN_DEVICE='tpu': choose one of cpu, cuda, auto"


def _old_gpu(monkeypatch, major, minor):
    """A GPU that answers, of compute capability major.minor (device_check's view of CuPy)."""
    props = {"name": b"Tesla T4", "major": major, "minor": minor}
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        runtime=types.SimpleNamespace(getDeviceProperties=lambda i: props), Device=lambda: types.SimpleNamespace(id=0)))
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(device, "import_cupy", lambda: fake)


def test_bf16_on_a_gpu_without_bf16_tensor_cores_is_refused_first(monkeypatch, capsys, tmp_path):
    _old_gpu(monkeypatch, 7, 5)
    monkeypatch.chdir(tmp_path)
    for argv in (["train", "--device", "cuda", "--dtype", "bf16"],
                 ["bench", "train", "--device", "cuda", "--dtype", "bf16"]):
        assert main.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"xtrain {argv[0]}: error: --dtype bf16 needs bf16 tensor cores") and "Tesla T4" in err
        assert "sm_75" in err and "--dtype fp16" in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []
    assert device_check.require_device("train", "fp16") == "cuda"  # the other dtypes are the GPU's
    _old_gpu(monkeypatch, 8, 6)
    assert device_check.require_device("train", "bf16") == "cuda"


def test_the_dtype_of_a_config_file_or_a_resumed_run_is_checked_too(monkeypatch, capsys, tmp_path):
    import json

    _old_gpu(monkeypatch, 7, 0)
    (tmp_path / "run.json").write_text(json.dumps({"dtype": "bf16", "steps": 3}))
    assert main.main(["train", "--device", "cuda", "--config", str(tmp_path / "run.json")]) == 2
    assert "--dtype bf16 needs" in capsys.readouterr().err
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.json").write_text(json.dumps({"train": {"dtype": "bf16"}}))
    assert main.main(["train", "--device", "cuda", "--resume", str(tmp_path / "old")]) == 2
    assert "--dtype bf16 needs" in capsys.readouterr().err


@pytest.mark.standin
def test_sample_runs_on_the_gpu_it_was_asked_for(cpu_run):
    """On the stand-in for CuPy: the model moves to the device and the text comes from there."""
    p = subprocess.run([sys.executable, "-m", "xtrain_lessons.cli.main", "sample", str(cpu_run), "--device", "cuda",
                        "--prompt", "Once", "--max-new-tokens", "3", "--temperature", "0"],
                       env=cupy_standin.subprocess_env(kernels="reference"), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert f"# {cpu_run} step 2 on cuda," in p.stderr and p.stdout.startswith("Once")
    on_cpu = subprocess.run([sys.executable, "-m", "xtrain_lessons.cli.main", "sample", str(cpu_run), "--device", "cpu",
                             "--prompt", "Once", "--max-new-tokens", "3", "--temperature", "0"],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert "step 2 on cpu," in on_cpu.stderr and on_cpu.stdout == p.stdout  # greedy: the same tokens
