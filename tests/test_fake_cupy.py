"""The CPU stand-in for CuPy (tests/fake_cupy): it keeps CuPy's rules, and with it the
package's GPU code paths run in CI — kernels, fused AdamW, Philox dropout, a whole
`xtrain train --device cuda` matching the CPU run. It is not a GPU: see fake_cupy's doc."""

from __future__ import annotations

import json

import numpy as np
import pytest

import fake_cupy
from xtrain_lessons.runtime import device
from xtrain_lessons.runtime import cuda as cuda_kernels


@pytest.fixture
def gpu(monkeypatch):
    """`import cupy` gives the stand-in and the device is "cuda" for the test."""
    before = fake_cupy.install()
    monkeypatch.setattr(device, "_gpu_ok", None)
    device.set_device("cuda")
    try:
        yield fake_cupy
    finally:
        device.set_device(None)
        device._gpu_ok = None
        for key in [k for k in cuda_kernels._loaded if k[2] == "gpu"]:
            del cuda_kernels._loaded[key]
        fake_cupy.uninstall(before)


def test_the_seam_sees_a_gpu(gpu):
    assert device.gpu_available() and device.get_device() == "cuda"
    xp = device.get_xp()
    assert xp is gpu and device.on_gpu(xp.zeros(3)) and not device.on_gpu(np.zeros(3))
    assert "stand-in" in device.describe()


def test_cupy_rules_implicit_conversion_and_names(gpu):
    cp = gpu
    a = cp.arange(6, dtype=cp.float32).reshape(2, 3)
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(a)
    with pytest.raises(TypeError):
        a + np.ones((2, 3), np.float32)  # a host array in a device expression
    with pytest.raises(AttributeError):
        cp.nanargmin_of_something  # noqa: B018  (not a CuPy name)
    with pytest.raises(AttributeError):
        cp.asmatrix  # NumPy has it, CuPy does not
    b = np.exp(a) * np.float32(2)  # NumPy functions on a cupy array run "on the device"
    assert isinstance(b, cp.ndarray)
    np.testing.assert_allclose(cp.asnumpy(b), 2 * np.exp(np.arange(6, dtype=np.float32)).reshape(2, 3))
    syncs = gpu.stats["host_syncs"]
    float(a.sum())
    a.get()
    assert gpu.stats["host_syncs"] == syncs + 2


def test_memory_pool_bookkeeping(gpu):
    pool = gpu.get_default_memory_pool()
    pool.free_all_blocks()
    used = pool.used_bytes()
    a = gpu.zeros(1000, gpu.float32)  # 4000 bytes -> one 4096-byte block
    assert pool.used_bytes() == used + 4096
    del a
    assert pool.used_bytes() == used and pool.free_bytes() == 4096  # cached, not returned
    b = gpu.zeros(1000, gpu.float32)  # the cached block is reused
    assert pool.free_bytes() == 0 and pool.total_bytes() == used + 4096
    del b
    pool.free_all_blocks()
    assert pool.total_bytes() == used


def test_raw_kernel_runs_on_the_emulator_and_refuses_host_arrays(gpu):
    from xtrain_lessons.runtime.kernels.vector_add import vector_add  # noqa: PLC0415

    x, y = gpu.arange(300, dtype=gpu.float32), gpu.ones(300, gpu.float32)
    launches = gpu.stats["kernel_launches"]
    z = vector_add(x, y)
    assert isinstance(z, gpu.ndarray) and gpu.stats["kernel_launches"] == launches + 1
    np.testing.assert_array_equal(z.get(), np.arange(300, dtype=np.float32) + 1)
    k = cuda_kernels.load_kernel("vector_add.cu", "vector_add")
    assert k.backend == "gpu"
    with pytest.raises(TypeError):
        k((2,), (256,), (np.zeros(300, np.float32), y, gpu.zeros(300, gpu.float32), np.int32(300)))
