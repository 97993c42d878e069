"""A CPU stand-in for CuPy, so that the package's CuPy code paths run in CI (no GPU there).

`install()` puts this module into ``sys.modules["cupy"]``; `xtrain_lessons.runtime.device`
then finds "a GPU" through its ordinary checks (the seam is not told about the stand-in).
It follows CuPy's rules where a NumPy-only program would pass unnoticed:

* `ndarray` wraps a NumPy array and refuses implicit conversion to NumPy (``np.asarray(a)``,
  ``float(np_array + a)`` ...): ``__array__`` raises TypeError, as CuPy's does; mixing it with
  a NumPy array in an operator or a function raises TypeError. ``.get()``, ``cupy.asnumpy``,
  ``.item()``, ``float()``/``int()``/``bool()`` copy to the host and are counted
  (``stats["host_syncs"]``).
* the module offers only the names real CuPy has (``cupy_names.json``, written by
  ``make_names.py`` from cupy-cuda12x 14.2.0, which imports without a GPU; checked in, so CI
  needs no CuPy); any other name is an AttributeError.
  A name is served by NumPy's function of that name: the *values* are NumPy's, not CuPy's.
* `RawKernel` / `RawModule` compile the CUDA C source with the package's CPU emulator and
  run it on the wrapped arrays (NumPy arrays are refused, as on a GPU).
* `cuda.Device`, `cuda.Stream`, `cuda.runtime` and a `MemoryPool` that does CuPy's
  bookkeeping: every new array takes a block rounded up to 512 bytes, freed blocks are
  cached for reuse (``used_bytes`` / ``total_bytes`` / ``free_all_blocks``).

What it does not prove: anything about a GPU's speed, asynchrony (every "kernel" has finished
when the call returns), CuPy's own numerics (reductions, matmul order), NVRTC compiling the
kernels, NCCL, or memory limits.
"""

from __future__ import annotations

import json
import sys
import types
import weakref
from pathlib import Path

import numpy as np

NAMES = json.loads((Path(__file__).with_name("cupy_names.json")).read_text())
__version__ = NAMES["cupy_version"] + "+cpu-stand-in"
stats = {"host_syncs": 0, "kernel_launches": 0}
_CONVERTERS = {"array", "asarray", "asanyarray", "ascontiguousarray"}  # these take host data
_HOST_MSG = ("Implicit conversion to a NumPy array is not allowed. "
             "Please use `.get()` to construct a NumPy array explicitly.")


def _host_sync():
    stats["host_syncs"] += 1


# ----------------------------------------------------------------------------- memory pool
class MemoryPool:
    """CuPy's bookkeeping: blocks rounded up to 512 bytes; a freed block is cached by size."""

    def __init__(self):
        self._used = 0
        self._free: dict[int, int] = {}  # size -> cached blocks

    def _malloc(self, nbytes: int) -> int:
        size = max(512, -(-nbytes // 512) * 512)
        if self._free.get(size):
            self._free[size] -= 1
        self._used += size
        return size

    def _release(self, size: int) -> None:
        self._used -= size
        self._free[size] = self._free.get(size, 0) + 1

    def used_bytes(self) -> int:
        return self._used

    def free_bytes(self) -> int:
        return sum(s * n for s, n in self._free.items())

    def total_bytes(self) -> int:
        return self._used + self.free_bytes()

    def n_free_blocks(self) -> int:
        return sum(self._free.values())

    def free_all_blocks(self, stream=None) -> None:
        self._free.clear()

    def set_limit(self, size=None, fraction=None) -> None:
        pass

    def get_limit(self) -> int:
        return 0


_pool = MemoryPool()


def get_default_memory_pool() -> MemoryPool:
    return _pool


def get_default_pinned_memory_pool() -> MemoryPool:
    return MemoryPool()


# ----------------------------------------------------------------------------- ndarray
def _unwrap(x, allow_host=False):
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray) and not allow_host and x.ndim:
        raise TypeError(f"Unsupported type {type(x)}: a NumPy array where CuPy needs a cupy.ndarray "
                        f"(move it with cupy.asarray)")
    if isinstance(x, (list, tuple)):
        return type(x)(_unwrap(v, allow_host) for v in x)
    return x


def _wrap(x):
    if isinstance(x, np.ndarray):
        return ndarray._wrap(x)
    if isinstance(x, np.generic) and not isinstance(x, (np.dtype,)):
        return ndarray._wrap(np.asarray(x))  # CuPy returns 0-d arrays, never scalars
    if isinstance(x, tuple):
        return tuple(_wrap(v) for v in x)
    if isinstance(x, list):
        return [_wrap(v) for v in x]
    return x


# id(NumPy array that owns its memory) -> its wrapper: a view's `.base` is that one object, as
# in CuPy (code that tells buffers apart by the owner's identity, like recompute.saved_bytes,
# would otherwise see a new owner at every access)
_OWNERS = weakref.WeakValueDictionary()


class ndarray:
    """A NumPy array behind CuPy's interface (see the module doc)."""

    __array_priority__ = 100

    def __init__(self, shape, dtype=float, memptr=None, strides=None, order="C"):
        self._set(np.empty(shape, dtype=dtype, order=order))

    @classmethod
    def _wrap(cls, a: np.ndarray) -> "ndarray":
        obj = cls.__new__(cls)
        obj._set(a)
        return obj

    def _set(self, a):
        self._a = a
        if a.flags.owndata and a.nbytes:  # a new block from the pool (views share their base's)
            weakref.finalize(self, _pool._release, _pool._malloc(a.nbytes))
        if a.base is None:
            _OWNERS[id(a)] = self

    @property
    def base(self):
        owner = self._a.base
        if owner is None:
            return None
        if getattr(self, "_base_wrapper", None) is None:  # kept: the view holds its base alive
            w = _OWNERS.get(id(owner))
            self._base_wrapper = w if w is not None and w._a is owner else ndarray._wrap(owner)
        return self._base_wrapper

    # -- host transfers (counted) --------------------------------------------------------
    def __array__(self, *args, **kwargs):
        raise TypeError(_HOST_MSG)

    def get(self, stream=None, order="C", out=None, blocking=True):
        _host_sync()
        return np.array(self._a, order=order)

    def item(self):
        _host_sync()
        return self._a.item()

    def tolist(self):
        _host_sync()
        return self._a.tolist()

    def __float__(self):
        return float(self.item())

    def __int__(self):
        return int(self.item())

    def __bool__(self):
        return bool(self.item())

    def __index__(self):
        return int(self.item())

    def __complex__(self):
        return complex(self.item())

    def __iter__(self):
        if not self._a.ndim:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(len(self)))

    def __len__(self):
        return len(self._a)

    def __repr__(self):
        return "array(" + np.array2string(self._a, separator=", ") + ")"

    __hash__ = None

    # -- attributes and methods: NumPy's, for names CuPy's ndarray has --------------------
    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: self._a.flags)
    T = property(lambda self: ndarray._wrap(self._a.T))

    @property
    def device(self):
        return cuda.Device(0)

    @shape.setter
    def shape(self, value):
        self._a.shape = value

    def __getattr__(self, name):
        if name.startswith("_") or name not in NAMES["cupy.ndarray"] or not hasattr(self._a, name):
            raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r}")
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)
        return lambda *a, **k: _wrap(attr(*_unwrap(a), **{kk: _unwrap(v) for kk, v in k.items()}))

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        return ndarray._wrap(self._a.astype(dtype, order=order, copy=copy))

    def __getitem__(self, key):
        return _wrap(self._a[_unwrap(key, allow_host=True)])

    def __setitem__(self, key, value):
        self._a[_unwrap(key, allow_host=True)] = _unwrap(value)

    # -- NumPy's protocols: a ufunc or function on a cupy array runs "on the device" ------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o) for o in kwargs["out"])
        res = getattr(ufunc, method)(*_unwrap(inputs), **kwargs)
        return _wrap(res) if method != "at" else None

    def __array_function__(self, func, types_, args, kwargs):
        name = func.__name__
        if name not in NAMES["cupy"]:
            raise TypeError(f"numpy.{name} has no CuPy counterpart (cupy.{name} does not exist)")
        return getattr(sys.modules[__name__], name)(*args, **kwargs)


def _binary(op):
    def method(self, other):
        return _wrap(op(self._a, _unwrap(other)))
    return method


def _inplace(op):
    def method(self, other):
        op(self._a, _unwrap(other), out=self._a)
        return self
    return method


for _name, _op in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                   ("floordiv", np.floor_divide), ("mod", np.mod), ("pow", np.power), ("matmul", np.matmul),
                   ("and", np.bitwise_and), ("or", np.bitwise_or), ("xor", np.bitwise_xor),
                   ("lshift", np.left_shift), ("rshift", np.right_shift)]:
    setattr(ndarray, f"__{_name}__", _binary(_op))
    setattr(ndarray, f"__r{_name}__", _binary(lambda a, b, _op=_op: _op(b, a)))
    if _name != "matmul":
        setattr(ndarray, f"__i{_name}__", _inplace(_op))
for _name, _op in [("lt", np.less), ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
                   ("eq", np.equal), ("ne", np.not_equal)]:
    setattr(ndarray, f"__{_name}__", _binary(_op))
ndarray.__neg__ = lambda self: ndarray._wrap(-self._a)
ndarray.__pos__ = lambda self: ndarray._wrap(+self._a)
ndarray.__abs__ = lambda self: ndarray._wrap(abs(self._a))
ndarray.__invert__ = lambda self: ndarray._wrap(~self._a)


# ----------------------------------------------------------------------------- functions
class ufunc:
    """A NumPy ufunc behind CuPy's ufunc interface (`at`, `reduce`, ... where CuPy has them)."""

    def __init__(self, np_ufunc):
        self._u = np_ufunc
        self.__name__ = np_ufunc.__name__

    def __call__(self, *args, **kwargs):
        if "out" in kwargs:
            out = kwargs["out"]
            kwargs["out"] = tuple(_unwrap(o) for o in out) if isinstance(out, tuple) else _unwrap(out)
        return _wrap(self._u(*_unwrap(args), **kwargs))

    def __getattr__(self, name):
        if name.startswith("_") or name not in NAMES["cupy.ufunc"]:
            raise AttributeError(f"'cupy.ufunc' object has no attribute {name!r}")
        f = getattr(self._u, name)
        if not callable(f):
            return f
        return lambda *a, **k: _wrap(f(*_unwrap(a), **{kk: _unwrap(v) for kk, v in k.items()}))


def _function(name, f):
    host_ok = name in _CONVERTERS

    def run(*args, **kwargs):
        res = f(*_unwrap(args, host_ok), **{k: _unwrap(v, host_ok) for k, v in kwargs.items()})
        return _wrap(res)
    run.__name__ = name
    return run


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    return a.get() if isinstance(a, ndarray) else np.asarray(a, order=order)


def get_array_module(*args):
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else np


def __getattr__(name):  # PEP 562: the rest of CuPy's names, served by NumPy
    if name not in NAMES["cupy"] or not hasattr(np, name):
        raise AttributeError(f"module 'cupy' has no attribute {name!r}"
                             + ("" if name in NAMES["cupy"] else " (not in real CuPy either)"))
    v = getattr(np, name)
    if isinstance(v, np.ufunc):
        v = ufunc(v)
    elif callable(v) and not isinstance(v, type):
        v = _function(name, v)
    globals()[name] = v
    return v


# ----------------------------------------------------------------------------- kernels
class RawKernel:
    """cupy.RawKernel, run by the package's CPU emulator on the wrapped arrays."""

    def __init__(self, code, name, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, jitify=False):
        from xtrain_lessons.runtime.cuda.emulator import CpuKernel  # noqa: PLC0415

        self.code, self.name, self.options = code, name, tuple(options)
        self._k = CpuKernel(code, name, self.options, None)

    def __call__(self, grid, block, args, *, shared_mem=0, enable_cooperative_groups=False):
        for i, a in enumerate(args):
            if isinstance(a, np.ndarray):
                raise TypeError(f"Unsupported type {type(a)} (argument {i}): a kernel cannot read host memory")
        stats["kernel_launches"] += 1
        self._k(grid, block, tuple(a._a if isinstance(a, ndarray) else a for a in args), shared_mem=shared_mem)


class RawModule:
    def __init__(self, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        self.code = code if code is not None else Path(path).read_text()
        self.options = tuple(options)

    def get_function(self, name):
        return RawKernel(self.code, name, self.options)


# ----------------------------------------------------------------------------- cupy.cuda
class _Stream:
    def __init__(self, null=False, non_blocking=False, ptr=0):
        self.ptr = ptr

    def synchronize(self):
        _host_sync()

    def use(self):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _Device:
    def __init__(self, device=None):
        self.id = 0 if device is None else int(device)
        if self.id != 0:
            raise RuntimeError("cudaErrorInvalidDevice: the stand-in has one device")

    def use(self):
        return None

    def synchronize(self):
        _host_sync()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_null_stream = _Stream(null=True)
cuda = types.ModuleType("cupy.cuda")
cuda.Device, cuda.Stream, cuda.MemoryPool = _Device, _Stream, MemoryPool
cuda.get_current_stream = lambda device=None: _null_stream
cuda.runtime = types.SimpleNamespace(
    getDeviceCount=lambda: 1,
    getDeviceProperties=lambda i: {"name": b"CuPy stand-in (NumPy on the CPU)", "totalGlobalMem": 8 * 2**30,
                                   "major": 8, "minor": 0, "multiProcessorCount": 1},
    deviceSynchronize=_host_sync,
    runtimeGetVersion=lambda: 12000,
    driverGetVersion=lambda: 12000,
)
for _n in ("Device", "Stream", "MemoryPool", "get_current_stream", "runtime"):
    assert _n in NAMES["cupy.cuda"], _n


def install():
    """Make `import cupy` give this stand-in (returns what sys.modules held before)."""
    before = {k: sys.modules.get(k) for k in ("cupy", "cupy.cuda")}
    sys.modules["cupy"] = sys.modules[__name__]
    sys.modules["cupy.cuda"] = cuda
    return before


def uninstall(before) -> None:
    for k, v in before.items():
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v
