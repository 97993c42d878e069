"""runtime/cublas_direct.py without a GPU: which libcublas it takes (CuPy's, of the CUDA major CuPy
was built for), one handle per device, one workspace per stream, the stream set and the GEMM
enqueued as one under concurrent threads, and bf16 refused in one line below sm_80. A fake library
stands for libcublas (the calls are ctypes calls on a GPU); on a GPU, `-m gpu` uses the real one."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest

from xtrain_lessons.runtime import cublas_direct as cd
from xtrain_lessons.runtime import device

MAPS = """\
7f01-7f02 r-xp 00000000 08:01 11 /opt/env/lib/python3.12/site-packages/nvidia/cublas/lib/libcublasLt.so.12
7f03-7f04 r-xp 00000000 08:01 12 /opt/env/lib/python3.12/site-packages/nvidia/cublas/lib/libcublas.so.12
7f05-7f06 r-xp 00000000 08:01 13 /usr/local/cuda-13.0/lib64/libcublas.so.13.0.0.19
7f07-7f08 rw-p 00000000 00:00 0
"""


def test_find_library_takes_the_major_cupy_was_built_for():
    assert cd.find_library(12, MAPS).endswith("nvidia/cublas/lib/libcublas.so.12")
    assert cd.find_library(13, MAPS) == "/usr/local/cuda-13.0/lib64/libcublas.so.13.0.0.19"
    assert cd.find_library(11, MAPS) is None  # never another major's library
    assert cd.find_library(12, MAPS.replace("libcublas.so.12", "libcublas.so.120")) is None
    assert cd.find_library(12, "") is None


def test_bf16_is_refused_in_one_line_below_sm80():
    line = cd.bf16_refusal("Tesla T4", 7, 5)
    assert "Tesla T4" in line and "sm_75" in line and "--dtype fp16" in line and "\n" not in line
    assert cd.bf16_refusal("NVIDIA A100-SXM4-80GB", 8, 0) is None
    assert cd.bf16_refusal("NVIDIA H100 80GB HBM3", 9, 0) is None


class FakeLib:
    """libcublas's entry points as Python: a handle's stream and workspace, and every GEMM with the
    stream and workspace it ran on. `pause` yields the GIL inside calls (ctypes releases it)."""

    def __init__(self, pause: float = 0.0, version=(12, 9, 1)):
        self.pause, self.version = pause, version
        self.stream = self.workspace = None
        self.set_streams, self.gemms = [], []
        for name in ("cublasCreate_v2", "cublasSetStream_v2", "cublasSetWorkspace_v2",
                     "cublasGemmStridedBatchedEx", "cublasGetProperty"):
            impl = getattr(self, "_" + name)
            setattr(self, name, lambda *a, _impl=impl: _impl(*a))  # a function object takes argtypes/restype

    def _cublasCreate_v2(self, handle_ref):
        return 0

    def _cublasSetStream_v2(self, handle, stream):
        self.stream, self.workspace = stream or 0, None  # cuBLAS puts the default workspace back
        self.set_streams.append(stream or 0)
        time.sleep(self.pause)
        return 0

    def _cublasSetWorkspace_v2(self, handle, ptr, size):
        self.workspace = ptr
        return 0

    def _cublasGemmStridedBatchedEx(self, handle, *args):
        wanted = args[6]  # the test passes the stream it asked for as A
        time.sleep(self.pause)
        self.gemms.append((wanted, self.stream, self.workspace))
        return 0

    def _cublasGetProperty(self, prop, out):
        out._obj.value = self.version[prop]
        return 0


def fake_cupy(devices=None):
    """What DirectCublas and direct_cublas use of CuPy: raw device allocations, the current device
    and its properties."""
    devices = devices or {0: ("NVIDIA H100 80GB HBM3", 9, 0)}
    counter = iter(range(1, 10**6))
    current = [0]

    class Memory:
        def __init__(self, size):
            self.size, self.ptr = size, 0x1000 * next(counter)

    runtime = types.SimpleNamespace(
        getDevice=lambda: current[0], runtimeGetVersion=lambda: 12090,
        getDeviceProperties=lambda i: {"name": devices[i][0].encode(), "major": devices[i][1],
                                       "minor": devices[i][2]})
    cp = types.SimpleNamespace(cuda=types.SimpleNamespace(Memory=Memory, runtime=runtime), __version__="14.2.0")
    return cp, current


def gemm(blas, stream, a_type=0):
    blas.gemm_strided_batched_ex(stream, 0, 0, 4, 4, 4, 0, stream, a_type, 4, 16, 0, a_type, 4, 16, 0, 0, 0,
                                 4, 16, 1, 68, -1)


def test_one_workspace_per_stream_set_after_each_stream_change():
    cp, _ = fake_cupy()
    lib = FakeLib()
    blas = cd.DirectCublas(lib, cp, 0, (9, 0), "H100")
    for s in (0, 0, 0xA, 0xA, 0, 0xB):
        gemm(blas, s)
    assert lib.set_streams == [0, 0xA, 0, 0xB]  # only when the stream changes
    ws = {s: w for _, s, w in lib.gemms}
    assert len(set(ws.values())) == 3 and None not in ws.values()  # each stream its own, never cuBLAS's default
    assert all(w == ws[s] for _, s, w in lib.gemms)  # and always the same one for a stream
    assert all(m.size == cd.WORKSPACE_BYTES for m in blas._workspaces.values())


def test_threads_sharing_a_handle_never_run_on_each_others_stream():
    """The stream is the handle's, not the thread's: each GEMM must run on the stream its caller gave
    (setting it and enqueueing are one step). Without the lock, the pauses interleave the threads."""
    cp, _ = fake_cupy()
    lib = FakeLib(pause=0.0002)
    blas = cd.DirectCublas(lib, cp, 0, (9, 0), "H100")

    def work(stream):
        for _ in range(25):
            gemm(blas, stream)

    threads = [threading.Thread(target=work, args=(s,)) for s in (0x10, 0x20, 0x30, 0x40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(lib.gemms) == 100
    assert all(wanted == ran for wanted, ran, _ in lib.gemms), "a GEMM ran on another thread's stream"
    ws = {}
    for _, s, w in lib.gemms:
        assert ws.setdefault(s, w) == w  # a stream's workspace never changes


def test_bf16_gemm_is_refused_below_sm80_before_cublas_sees_it():
    cp, _ = fake_cupy()
    lib = FakeLib()
    old = cd.DirectCublas(lib, cp, 0, (7, 5), "Tesla T4")
    gemm(old, 0, a_type=0)  # float32: fine
    with pytest.raises(cd.UnsupportedOnThisGpu, match="Tesla T4.*sm_75"):
        gemm(old, 0, a_type=cd.CUDA_R_16BF)
    assert len(lib.gemms) == 1
    gemm(cd.DirectCublas(lib, cp, 0, (8, 0), "A100"), 0, a_type=cd.CUDA_R_16BF)
    assert len(lib.gemms) == 2


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(cd, "_library", [])
    monkeypatch.setattr(cd, "_handles", {})


def test_one_handle_per_device_and_the_library_loaded_once(fresh, monkeypatch):
    cp, current = fake_cupy({0: ("NVIDIA H100 80GB HBM3", 9, 0), 1: ("Tesla T4", 7, 5)})
    loads = []
    monkeypatch.setattr(cd, "_load", lambda cupy: loads.append(1) or (FakeLib(), "cuBLAS 12.9.1 (fake)"))
    a, a_again = cd.direct_cublas(cp), cd.direct_cublas(cp)
    current[0] = 1
    b = cd.direct_cublas(cp)
    assert a is a_again and b is not a and (a.device, b.device) == (0, 1)
    assert (a.cc, b.cc, b.name) == ((9, 0), (7, 5), "Tesla T4")
    assert loads == [1] and cd.describe() == "cuBLAS 12.9.1 (fake)"


def test_no_library_means_cupys_binding_and_the_reason_is_said(fresh, monkeypatch, caplog):
    cp, _ = fake_cupy()
    monkeypatch.setattr(cd, "_load", lambda cupy: (None, "cuBLAS through CuPy's binding only: no libcublas.so.12"))
    with caplog.at_level("INFO", logger=cd.__name__):
        assert cd.direct_cublas(cp) is None and cd.direct_cublas(cp) is None
    assert [r.getMessage() for r in caplog.records] == ["cuBLAS through CuPy's binding only: no libcublas.so.12"]


def test_load_matches_the_library_to_cupys_cuda(fresh, monkeypatch):
    """_load takes libcublas.so.<CuPy's CUDA major>, checks its own version says that major, and
    names path, version and CUDA runtime in its line; another major is refused."""
    cp, _ = fake_cupy()
    binding = types.ModuleType("cupy_backends.cuda.libs.cublas")
    binding.getVersion = lambda handle: 120901
    cp.cuda.device = types.SimpleNamespace(get_cublas_handle=lambda: 1)
    libs = types.ModuleType("cupy_backends.cuda.libs")  # CuPy's package, whose __getattr__ loads the library
    libs.cublas = binding
    monkeypatch.setitem(sys.modules, "cupy_backends.cuda.libs", libs)
    monkeypatch.setattr(cd, "_pathfinder_path", lambda major: None)
    monkeypatch.setattr(cd, "find_library", lambda major, maps=None: f"/w/libcublas.so.{major}")
    versions = {"/w/libcublas.so.12": (12, 9, 1)}
    monkeypatch.setattr(cd.ctypes, "CDLL", lambda path: FakeLib(version=versions[path]))
    lib, line = cd._load(cp)
    assert lib is not None and line.startswith("cuBLAS 12.9.1 (/w/libcublas.so.12)") and "CUDA runtime 12.9" in line
    assert "reports" not in line
    versions["/w/libcublas.so.12"] = (13, 0, 0)  # a file of another major under that name
    lib, line = cd._load(cp)
    assert lib is None and "CuPy's binding only" in line and "13.0.0" in line
    versions["/w/libcublas.so.12"] = (12, 8, 0)  # same major, another release than CuPy's handle reports
    lib, line = cd._load(cp)
    assert lib is not None and "reports version 120901" in line


def test_the_stand_in_brings_its_own():
    from xtrain_lessons import cupy_standin

    before = cupy_standin.install()
    try:
        import cupy  # noqa: PLC0415

        assert cd.direct_cublas(cupy) is cupy.direct_cublas()
    finally:
        cupy_standin.uninstall(before)


requires_gpu = pytest.mark.skipif(not device.gpu_available(), reason="needs CuPy and an NVIDIA GPU")


@pytest.mark.gpu
@requires_gpu
def test_on_a_gpu_the_library_is_cupys_and_says_so():
    cp = device.import_cupy()
    blas = cd.direct_cublas(cp)
    line = cd.describe()
    assert blas is not None, line
    major = cp.cuda.runtime.runtimeGetVersion() // 1000
    assert line.startswith(f"cuBLAS {major}.") and f"libcublas.so.{major}" in line, line
    assert blas.device == cp.cuda.runtime.getDevice()
