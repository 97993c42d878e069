"""The array backend: NumPy on the CPU, CuPy on a GPU, chosen by XTRAIN_DEVICE."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from xtrain_lessons.runtime import device


@pytest.fixture(autouse=True)
def reset_device():
    device.set_device(None)
    yield
    device.set_device(None)


def test_cpu_device(monkeypatch):
    monkeypatch.setenv("XTRAIN_DEVICE", "cpu")
    assert device.get_device() == "cpu"
    assert device.get_xp() is np and device.xp() is np
    assert device.describe().startswith("device: cpu (NumPy")


def test_auto_is_cpu_without_gpu(monkeypatch):
    monkeypatch.setenv("XTRAIN_DEVICE", "auto")
    assert device.get_device() == ("cuda" if device.gpu_available() else "cpu")


def test_cuda_without_gpu_raises(monkeypatch):
    if device.gpu_available():
        pytest.skip("a GPU is available")
    monkeypatch.setenv("XTRAIN_DEVICE", "cuda")
    with pytest.raises(RuntimeError, match="no GPU is usable"):
        device.get_device()


def test_invalid_device(monkeypatch):
    monkeypatch.setenv("XTRAIN_DEVICE", "tpu")
    with pytest.raises(ValueError, match="XTRAIN_DEVICE"):
        device.get_device()
    with pytest.raises(ValueError):
        device.set_device("tpu")


def test_set_device_overrides_environment(monkeypatch):
    monkeypatch.setenv("XTRAIN_DEVICE", "tpu")
    assert device.set_device("cpu") == "cpu"


def test_arrays_move_and_come_back(monkeypatch):
    monkeypatch.setenv("XTRAIN_DEVICE", "cpu")
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    d = device.to_device(a)
    assert device.array_module(d) is np
    h = device.to_host(d)
    assert isinstance(h, np.ndarray) and np.array_equal(h, a)
    assert device.to_device([1, 2], dtype=np.float32).dtype == np.float32
    assert device.array_module(np.float32(1)) is np


def test_timer_measures_wall_time():
    with device.Timer() as t:
        time.sleep(0.02)
    assert 0.015 < t.elapsed < 1.0
    assert t.ms == pytest.approx(t.elapsed * 1e3)
    device.synchronize()  # a no-op on the CPU


def test_import_does_not_import_cupy():
    code = ("import sys, xtrain_lessons.runtime.device, xtrain_lessons.runtime.cuda, xtrain_lessons.runtime.kernels.vector_add; "
            "assert 'cupy' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
