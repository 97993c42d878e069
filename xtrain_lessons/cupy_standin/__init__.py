"""A CPU stand-in for CuPy: the package's GPU path, run on the CPU under CuPy's rules, with every
device call counted (phase T07b). CI has no GPU: this is how its tests, and a learner without a
GPU, take the CuPy code paths; T07b counts a training step's launches with it.

`install()` (or, for a block, `installed()`) puts this module into ``sys.modules["cupy"]``;
`xtrain_lessons.runtime.device` then finds "a GPU" through its ordinary checks (the seam is not
told about the stand-in).
It follows CuPy's rules where a NumPy-only program would pass unnoticed:

* `ndarray` wraps a NumPy array and refuses implicit conversion to NumPy (``np.asarray(a)``,
  ``float(np_array + a)`` ...): ``__array__`` raises TypeError, as CuPy's does. A NumPy array of
  ANY rank, 0-d included, as an operand or a function argument raises TypeError, as CuPy's
  CScalar does ("Unsupported type <class 'numpy.ndarray'>"); NumPy scalars (np.float32(2)) are
  allowed. ``a[...] = host_array`` raises ValueError unless the host array is 0-d (CuPy's `fill`).
  ``.get()``, ``cupy.asnumpy``, ``.item()``, ``float()``/``int()``/``bool()``, ``format(a, ".3f")``
  copy to the host and are counted (``stats["host_syncs"]``).
* no stacked bfloat16 product: a matmul of ``ml_dtypes.bfloat16`` arrays with more than 2
  dimensions raises CuPy 14.2's TypeError ("data type 'E' not understood", seen on an H100); a 2-D
  one is cuBLAS's (bf16 result, float32 accumulation). runtime/gpu_blas.py makes the stacked ones.
* every device call is counted, as a GPU would see it (``stats["device_calls"]`` and, by name,
  ``calls``): operators, ufuncs, functions, reductions and other array methods, copies
  (astype, ascontiguousarray of a strided array, host <-> device), advanced indexing, library
  calls (matmul: cuBLAS) and kernel launches (``stats["kernel_launches"]``). Views (reshape,
  transpose, basic slicing, broadcast_to ...) and allocations (empty) launch nothing and are not
  counted. `counting()` measures a block.
* the module offers only the names real CuPy has (``cupy_names.json``, written by
  ``make_names.py`` from cupy-cuda12x 14.2.0, which imports without a GPU; checked in, so CI
  needs no CuPy); any other name is an AttributeError.
  A name is served by NumPy's function of that name: the *values* are NumPy's, not CuPy's.
* `RawKernel` / `RawModule` compile the CUDA C source with the package's CPU emulator and
  run it on the wrapped arrays (NumPy arrays are refused, as on a GPU).
* cuBLAS as CuPy reaches it: `cupy_backends.cuda.libs.cublas.gemmStridedBatchedEx` reads device
  memory column-major through the pointers it is given and checks what cuBLAS checks (leading
  dimensions, types, every element inside one live device array); `direct_cublas()` stands for
  runtime/cublas_direct (cuBLAS's own entry point). A CUDA graph capture (`Stream.begin_capture`)
  runs every call as it is made but refuses what CUDA or CuPy refuse while capturing: a host
  synchronisation, a host <-> device copy, and any call through CuPy's cuBLAS binding (cupy.matmul,
  dot, einsum: "calling cuBLAS API during stream capture is currently unsupported", seen on an
  H100); its Graph cannot be replayed, except inside `replaying_graphs()`: there the capture also
  records how to redo each device call (a kernel's and a host scalar's values as they were, every
  array by its memory, as a CUDA graph records them) and `Graph.launch` redoes them in order.
* `cuda.Device`, `cuda.Stream`, `cuda.runtime` and a `MemoryPool` that does CuPy's
  bookkeeping: every new array takes a block rounded up to 512 bytes, freed blocks are
  cached for reuse (``used_bytes`` / ``total_bytes`` / ``free_all_blocks``).

What it does not prove: anything about a GPU's speed, asynchrony (every "kernel" has finished
when the call returns, so a missing synchronisation goes unseen), CuPy's own numerics
(reductions, matmul order, FMA contraction), NVRTC compiling the kernels (tests/test_nvrtc_compile.py
does that), NCCL, the real memory a GPU has (the pool's limit is a number the test sets), warp-level
behaviour the emulator does not model, or CuPy features the engine does not call.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import json
import math
import os
import sys
import types
import weakref
from pathlib import Path

import numpy as np

NAMES = json.loads((Path(__file__).with_name("cupy_names.json")).read_text())
__version__ = NAMES["cupy_version"] + "+cpu-stand-in"
stats = {"host_syncs": 0, "kernel_launches": 0, "device_calls": 0, "bytes": 0}
calls: collections.Counter = collections.Counter()  # "kind:name" -> device calls
# names that give a view or an allocation: no kernel runs on a GPU
_NO_LAUNCH = {"reshape", "ravel", "transpose", "swapaxes", "moveaxis", "squeeze", "expand_dims", "broadcast_to",
              "broadcast_arrays", "atleast_1d", "atleast_2d", "atleast_3d", "view", "empty", "empty_like",
              "split", "array_split", "diagonal", "result_type", "can_cast", "shape", "ndim", "size",
              "asnumpy", "get_array_module", "iinfo", "finfo", "dtype", "promote_types", "isscalar", "rollaxis",
              "may_share_memory", "shares_memory"}
_CONVERTERS = {"array", "asarray", "asanyarray", "ascontiguousarray"}  # these take host data
_HOST_MSG = ("Implicit conversion to a NumPy array is not allowed. "
             "Please use `.get()` to construct a NumPy array explicitly.")


_capturing: list = []  # the stream that is capturing a CUDA graph now, if any
_replay = [False]  # replaying_graphs(): captures record their calls, graphs replay them


@contextlib.contextmanager
def replaying_graphs():
    """Inside the block a capture records each device call as a CUDA graph does (arguments by value,
    arrays by their memory) and its Graph's `launch` redoes them in order, writing every result into
    the memory the capture's call wrote. What it proves: a step replayed from device memory gives the
    bits of the step run again (what changes between steps must be in device memory, not in a value
    the capture kept). What it does not: a graph's memory reuse (each recorded array is kept alive
    by the graph), asynchrony, anything of CUDA's graph API beyond capture and launch."""
    before, _replay[0] = _replay[0], True
    try:
        yield
    finally:
        _replay[0] = before


def _record(redo, out=None) -> None:
    """While a stream captures with replays on: `redo()` recomputes a call on the arrays it read
    (NumPy's, by reference) and returns the result, which a replay writes into `out` (the
    ndarray, or tuple of them, the call returned; None: `redo` writes in place)."""
    if _capturing and _capturing[-1]._calls is not None:
        _capturing[-1]._calls.append((redo, out))


def _write(out, res) -> None:
    if isinstance(out, (tuple, list)):
        for o, r in zip(out, res):
            _write(o, r)
    elif isinstance(out, ndarray):
        out._a[...] = res


_CUBLAS_IN_CAPTURE = "calling cuBLAS API during stream capture is currently unsupported"  # CuPy 14's words


def _refuse_cublas_in_capture() -> None:
    """CuPy's binding of cuBLAS (cupy.matmul, dot, einsum, cupy_backends' cublas) refuses every call
    while a stream captures: its setStream raises NotImplementedError (seen on an H100)."""
    if _capturing:
        raise NotImplementedError(_CUBLAS_IN_CAPTURE)


def _refuse_in_capture(what: str) -> None:
    """CUDA cannot record a host synchronisation or a copy from / to host memory into a graph
    (a pinned copy it would record with its host address, to be re-read at every replay)."""
    if _capturing:
        raise RuntimeError(f"cudaErrorStreamCaptureUnsupported: {what} while a stream is capturing a CUDA graph")


def _host_sync():
    _refuse_in_capture("a host synchronisation")
    stats["host_syncs"] += 1


def _device_call(kind: str, name: str, *arrays) -> None:
    """Count one device call, and the bytes it moves: every distinct array it reads or writes
    (operands and result) once, a GPU's memory traffic for the call."""
    if kind == "copy" and name in ("host_to_device", "device_to_host"):
        _refuse_in_capture(f"a {name.replace('_', ' ')} copy")
    stats["device_calls"] += 1
    calls[f"{kind}:{name}"] += 1
    seen = set()
    for a in arrays:
        a = a._a if isinstance(a, ndarray) else a
        if isinstance(a, np.ndarray) and id(a) not in seen:
            seen.add(id(a))
            stats["bytes"] += a.nbytes


@contextlib.contextmanager
def counting():
    """Device calls, kernel launches and host syncs made inside the block:

        with cupy_standin.counting() as c:
            step()
        c["device_calls"], c["host_syncs"], c["bytes"], c["calls"]  (a Counter by kind:name)
    """
    before, before_calls = dict(stats), calls.copy()
    out: dict = {}
    try:
        yield out
    finally:
        out.update({k: stats[k] - before[k] for k in stats})
        out["calls"] = calls - before_calls


# ----------------------------------------------------------------------------- memory pool
class OutOfMemoryError(MemoryError):
    """cupy.cuda.memory.OutOfMemoryError: an allocation above the pool's limit."""

    def __init__(self, size, total, limit=0):
        super().__init__(f"Out of memory allocating {size:,} bytes (allocated so far: {total:,} bytes"
                         + (f", limit set to: {limit:,} bytes" if limit else "") + ").")


OutOfMemoryError.__module__ = "cupy.cuda.memory"


class MemoryPool:
    """CuPy's bookkeeping: blocks rounded up to 512 bytes; a freed block is cached by size;
    `set_limit(size=...)` makes a larger total an OutOfMemoryError (a GPU's memory, shrunk)."""

    def __init__(self):
        self._used = 0
        self._free: dict[int, int] = {}  # size -> cached blocks
        self._limit = 0

    def _malloc(self, nbytes: int) -> int:
        size = max(512, -(-nbytes // 512) * 512)
        if self._free.get(size):
            self._free[size] -= 1
        elif self._limit and self.total_bytes() + size > self._limit:
            raise OutOfMemoryError(size, self.total_bytes(), self._limit)
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

    def malloc(self, nbytes: int):
        """CuPy's allocator interface (for cuda.using_allocator); the stand-in's arrays are NumPy's,
        so this only does the bookkeeping."""
        return self._malloc(nbytes)

    def set_limit(self, size=None, fraction=None) -> None:
        self._limit = int(size or 0) if fraction is None else int(fraction * 8 * 2**30)

    def get_limit(self) -> int:
        return self._limit


_pool = MemoryPool()


def get_default_memory_pool() -> MemoryPool:
    return _pool


def get_default_pinned_memory_pool() -> MemoryPool:
    return MemoryPool()


# ----------------------------------------------------------------------------- ndarray
def _unwrap(x, allow_host=False):
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, np.ndarray) and not allow_host:  # any rank: CuPy's CScalar refuses 0-d arrays too
        raise TypeError(f"Unsupported type {type(x)}: a NumPy array (shape {x.shape}) where CuPy needs a "
                        f"cupy.ndarray or a scalar (move it with cupy.asarray, or pass a NumPy scalar)")
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
_BUFFERS = weakref.WeakValueDictionary()  # id -> every live device buffer (what cuBLAS may address)
_SPANS: dict[int, tuple[int, int]] = {}  # id -> (first, last + 1) address of that buffer while it lives


_SORTED: list[tuple[int, int, int]] = []  # (first, end, id) of every span registered, by address


def _live_buffer(lo: int, hi: int):
    """The live device buffer holding the addresses [lo, hi), or None. Live buffers do not overlap,
    so it is the live one starting last at or before lo; an entry counts while its id's buffer
    lives and its span is the one registered last under that id."""
    if len(_SORTED) > 2 * len(_BUFFERS) + 1024:  # forget the buffers gone
        _SORTED[:] = sorted((*span, key) for key, span in _SPANS.items() if key in _BUFFERS)
        for gone in [k for k in _SPANS if k not in _BUFFERS]:
            del _SPANS[gone]
    for first, end, key in reversed(_SORTED[:bisect.bisect_right(_SORTED, (lo, math.inf, math.inf))]):
        if _SPANS.get(key) == (first, end) and _BUFFERS.get(key) is not None:
            return _BUFFERS.get(key) if hi <= end else None
    return None


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
            _BUFFERS[id(a)] = a
            span = _SPANS[id(a)] = (a.ctypes.data, a.ctypes.data + a.nbytes)
            bisect.insort(_SORTED, (*span, id(a)))
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
        _device_call("copy", "device_to_host", self)
        return np.array(self._a, order=order)

    def set(self, arr, stream=None):
        """Copy a host array of the same shape into this one (CuPy's host -> device)."""
        if not isinstance(arr, np.ndarray) or arr.shape != self._a.shape:
            raise ValueError(f"set: need a NumPy array of shape {self._a.shape}")
        _device_call("copy", "host_to_device", self)
        self._a[...] = arr

    def __format__(self, spec):  # CuPy formats through the host: a synchronisation
        _host_sync()
        return format(self._a if self._a.ndim else self._a[()], spec)

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

    @property
    def data(self):
        """CuPy's MemoryPointer, reduced to its address (`.ptr`: the view's first element)."""
        return types.SimpleNamespace(ptr=self._a.__array_interface__["data"][0])

    @shape.setter
    def shape(self, value):
        self._a.shape = value

    def __getattr__(self, name):
        if name.startswith("_") or name not in NAMES["cupy.ndarray"] or not hasattr(self._a, name):
            raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r}")
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)

        def method(*a, **k):
            ua, uk = _unwrap(a), {kk: _unwrap(v) for kk, v in k.items()}
            res = attr(*ua, **uk)
            if name not in _NO_LAUNCH and not (name == "copy" and not self._a.size):
                _device_call("method", name, self, res)
            out = _wrap(res)
            if name not in _NO_LAUNCH or _new_memory(res, self._a):  # (a reshape may copy)
                _record(lambda: attr(*ua, **uk), out)
            return out
        return method

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True):
        res = self._a.astype(dtype, order=order, copy=copy)
        out = ndarray._wrap(res)
        if copy or np.dtype(dtype) != self._a.dtype:
            _device_call("copy", "astype", self, res)
            _record(lambda: self._a.astype(dtype, order=order), out)
        return out

    def __getitem__(self, key):
        uk = _unwrap(key, allow_host=True)
        res = self._a[uk]
        if isinstance(res, np.generic):  # an element: a 0-d view in CuPy (NumPy gives a copied scalar)
            res = self._a[(*(uk if isinstance(uk, tuple) else (uk,)), Ellipsis)]
        out = _wrap(res)
        if _advanced(key):
            _device_call("index", "getitem", res, res)  # read and written
            _record(lambda: self._a[uk], out)
        return out

    def __setitem__(self, key, value):
        if isinstance(value, np.ndarray) and value.ndim:
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")  # CuPy's fill
        target = self._a[_unwrap(key, allow_host=True)] if not _advanced(key) else None
        _device_call("index", "setitem", value, target)
        uk, uv = _unwrap(key, allow_host=True), value[()] if isinstance(value, np.ndarray) else _unwrap(value)
        self._a[uk] = uv
        _record(lambda: self._a.__setitem__(uk, uv))

    # -- NumPy's protocols: a ufunc or function on a cupy array runs "on the device" ------
    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        if "out" in kwargs:
            kwargs["out"] = tuple(_unwrap(o) for o in kwargs["out"])
        ui = _unwrap(inputs)
        res = getattr(ufunc, method)(*ui, **kwargs)
        _device_call("ufunc", ufunc.__name__ if method == "__call__" else f"{ufunc.__name__}.{method}", *inputs,
                     *(res if isinstance(res, tuple) else (res,)))
        out = _wrap(res) if method != "at" else None
        _record(lambda: getattr(ufunc, method)(*ui, **kwargs), out)
        return out

    def __array_function__(self, func, types_, args, kwargs):
        name = func.__name__
        if name not in NAMES["cupy"]:
            raise TypeError(f"numpy.{name} has no CuPy counterpart (cupy.{name} does not exist)")
        return getattr(sys.modules[__name__], name)(*args, **kwargs)


def _new_memory(res, *sources) -> bool:
    """Whether `res` (a call's result) is an array in memory of its own, not a view of a source."""
    return isinstance(res, np.ndarray) and res.size > 0 and not any(
        isinstance(a, np.ndarray) and np.may_share_memory(res, a) for a in sources)


def _advanced(key) -> bool:
    """Indexing with arrays or booleans (a gather kernel), not slices and ints (a view)."""
    keys = key if isinstance(key, tuple) else (key,)
    return any(isinstance(k, (ndarray, np.ndarray, list)) or (isinstance(k, (bool, np.bool_))) for k in keys)


def _refuse_bf16_batched(a, b) -> None:
    """CuPy 14.2 multiplies 2-D bfloat16 matrices (cublasGemmEx, tensor cores) but takes bfloat16
    for an integer type in its batched matmul (ndim > 2) and fails there (seen on an H100:
    `TypeError: data type 'E' not understood`, from _integral_tensordot_core_strided_batched)."""
    if max(a.ndim, b.ndim) > 2 and any(np.dtype(x.dtype).char == "E" for x in (a, b)):
        raise TypeError("data type 'E' not understood (a stacked matmul of a bfloat16 array: CuPy's batched "
                        "product has no bfloat16)")


def _matmul(a, b, out=None):
    """cuBLAS's product: float32 accumulation, the result in the operands' dtype (NumPy with
    ml_dtypes gives float32 for bfloat16 operands; CuPy gives bfloat16); 2-D only for bfloat16."""
    _refuse_cublas_in_capture()
    _refuse_bf16_batched(a, b)
    want = np.result_type(a, b)
    if want.itemsize < 4 and want.kind in "fV":  # float16 / bfloat16: NumPy has no BLAS for them;
        a, b = a.astype(np.float32), b.astype(np.float32)  # cuBLAS accumulates in float32 anyway
    res = np.matmul(a, b)
    if res.dtype != want:
        res = res.astype(want)
    if out is not None:
        out[...] = res
        return out
    return res


def _should_use_rop(x, y) -> bool:
    """CuPy's rule (_core/core.pyx): defer to the other operand's reflected operator when it
    opts out of ufuncs (`__array_ufunc__ = None`, as an autograd Tensor does), or, without that
    attribute, when its `__array_priority__` is higher."""
    try:
        y_ufunc = y.__array_ufunc__
    except AttributeError:
        return getattr(x, "__array_priority__", 0) < getattr(y, "__array_priority__", 0)
    return y_ufunc is None


def _binary(op, name, reflected=False):
    def method(self, other):
        if not reflected and not isinstance(other, ndarray) and _should_use_rop(self, other):
            return NotImplemented
        uo = _unwrap(other)
        res = op(self._a, uo)
        _device_call("library" if name == "matmul" else "op", name, self, other, res)
        out = _wrap(res)
        _record(lambda: op(self._a, uo), out)
        return out
    return method


def _inplace(op, name):
    def method(self, other):
        _device_call("op", f"i{name}", self, other)
        uo = _unwrap(other)
        op(self._a, uo, out=self._a)
        _record(lambda: op(self._a, uo, out=self._a))
        return self
    return method


for _name, _op in [("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide),
                   ("floordiv", np.floor_divide), ("mod", np.mod), ("pow", np.power), ("matmul", _matmul),
                   ("and", np.bitwise_and), ("or", np.bitwise_or), ("xor", np.bitwise_xor),
                   ("lshift", np.left_shift), ("rshift", np.right_shift)]:
    setattr(ndarray, f"__{_name}__", _binary(_op, _name))
    setattr(ndarray, f"__r{_name}__", _binary(lambda a, b, _op=_op: _op(b, a), _name, reflected=True))
    if _name != "matmul":
        setattr(ndarray, f"__i{_name}__", _inplace(_op, _name))
for _name, _op in [("lt", np.less), ("le", np.less_equal), ("gt", np.greater), ("ge", np.greater_equal),
                   ("eq", np.equal), ("ne", np.not_equal)]:
    setattr(ndarray, f"__{_name}__", _binary(_op, _name))


def _unary(op, name):
    def method(self):
        res = op(self._a)
        _device_call("op", name, self, res)
        out = ndarray._wrap(res)
        _record(lambda: op(self._a), out)
        return out
    return method


ndarray.__neg__ = _unary(np.negative, "neg")
ndarray.__pos__ = _unary(np.positive, "pos")
ndarray.__abs__ = _unary(np.absolute, "abs")
ndarray.__invert__ = _unary(np.invert, "invert")


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
        ua = _unwrap(args)
        res = self._u(*ua, **kwargs)
        _device_call("ufunc", self.__name__, *args, *(res if isinstance(res, tuple) else (res,)))
        out = _wrap(res)
        _record(lambda: self._u(*ua, **kwargs), out)
        return out

    def __getattr__(self, name):
        if name.startswith("_") or name not in NAMES["cupy.ufunc"]:
            raise AttributeError(f"'cupy.ufunc' object has no attribute {name!r}")
        f = getattr(self._u, name)
        if not callable(f):
            return f

        def method(*a, **k):
            ua, uk = _unwrap(a), {kk: _unwrap(v) for kk, v in k.items()}
            res = f(*ua, **uk)
            _device_call("ufunc", f"{self.__name__}.{name}", *a, res)
            out = _wrap(res)
            _record(lambda: f(*ua, **uk), out)
            return out
        return method


def _count_conversion(name, args, kwargs, res) -> None:
    """array/asarray/ascontiguousarray: a device call only when data moves or changes layout."""
    src = args[0] if args else kwargs.get("a", kwargs.get("obj"))
    dtype = kwargs.get("dtype", args[1] if len(args) > 1 and name != "array" else None)
    if not isinstance(src, ndarray):
        _device_call("copy", "host_to_device", res)
    elif name == "array" and kwargs.get("copy", True) is not False:
        _device_call("copy", "array", src, res)
    elif dtype is not None and np.dtype(dtype) != src.dtype:
        _device_call("copy", "astype", src, res)
    elif name == "ascontiguousarray" and not src.flags.c_contiguous:
        _device_call("copy", "ascontiguousarray", src, res)


def _function(name, f):
    host_ok = name in _CONVERTERS

    def run(*args, **kwargs):
        if name in ("dot", "tensordot", "einsum", "inner", "vdot"):
            _refuse_cublas_in_capture()
        fn = _matmul if name == "matmul" else f
        ua, uk = _unwrap(args, host_ok), {k: _unwrap(v, host_ok) for k, v in kwargs.items()}
        res = fn(*ua, **uk)
        if host_ok:
            if args and isinstance(args[0], np.ndarray) and isinstance(res, np.ndarray) and np.may_share_memory(
                    res, args[0]):
                res = np.array(res, copy=True, order="K")  # a device copy, never the host's memory
            _count_conversion(name, args, kwargs, res)
        elif name not in _NO_LAUNCH:
            arrays = [a for a in (*args, *kwargs.values()) if isinstance(a, ndarray)]
            _device_call("library" if name in ("matmul", "dot", "tensordot", "einsum") else "fn", name, *arrays,
                         *(res if isinstance(res, (tuple, list)) else (res,)))
        out = _wrap(res)
        if not (name in _NO_LAUNCH or host_ok) or (name not in ("empty", "empty_like") and
                                                   _new_memory(res, *ua, *uk.values())):  # (a reshape may copy)
            _record(lambda: fn(*ua, **uk), out)
        return out
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
    if name in _served:
        return _served[name]
    v = getattr(np, name)
    if isinstance(v, np.ufunc) and name != "matmul":  # matmul is cuBLAS's (_matmul), not a ufunc here
        v = ufunc(v)
    elif callable(v) and not isinstance(v, type):
        v = _function(name, v)
    _served[name] = v  # not in globals(): `sum`, `max`, `abs` would shadow the builtins in this module
    return v


_served: dict = {}


# ----------------------------------------------------------------------------- kernels
def _store(dst, values) -> None:
    """Write float64 `values` into `dst` (any storage dtype), rounded once, as a kernel's store."""
    values = np.asarray(values, np.float64).reshape(dst.shape)
    with np.errstate(over="ignore", invalid="ignore"):
        dst[...] = values if dst.dtype == np.float32 else values.astype(np.float32).astype(dst.dtype)


def _reference_kernels() -> dict:
    """name -> run(args, grid) for the training step's row kernels and the gradient norm's partial
    sums (runtime/kernels: barriers and warp shuffles in every block, the emulator's slowest case),
    computed by their NumPy references in float64 and stored once. `XTRAIN_STANDIN_KERNELS=reference`
    uses them: the end-to-end runs (every notebook and command on the cuda path) then take minutes instead of tens
    of minutes. The kernels themselves are tested on the emulator against the same references
    (tests/test_kernels_step.py) and through training runs (tests/test_fake_cupy.py). The step's
    elementwise kernels join them as float32 twins (_elementwise_kernels, checked against the
    emulated kernels in tests/test_standin_references.py), and so do the tensor-core flash
    attention's four kernels (_flash_tc_kernels: emulated warp-matrix tiles were half a bf16 step)."""
    from xtrain_lessons.runtime.kernels import cross_entropy as ce  # noqa: PLC0415
    from xtrain_lessons.runtime.kernels import grad_norm as gn  # noqa: PLC0415
    from xtrain_lessons.runtime.kernels import rmsnorm as rn  # noqa: PLC0415
    from xtrain_lessons.runtime.kernels import softmax as sm  # noqa: PLC0415

    def rows(a, width):
        return a.reshape(-1, int(width))

    def rmsnorm_fwd(x, w, xhat, out, r, D, eps, has_w):
        xh, o, rr = rn.rmsnorm_fwd_reference(rows(x, D), w if has_w else None, float(eps))
        _store(xhat, xh)
        _store(r, rr)
        if has_w:
            _store(out, o)

    def rmsnorm_bwd(g, xhat, w, r, gx, parts, N, D, rows_per_block, has_w, want_gx, want_gw):
        dx, dw = rn.rmsnorm_bwd_reference(rows(g, D), rows(xhat, D), w if has_w else None, rows(r, 1))
        if want_gx:
            _store(gx, dx)
        if want_gw:  # the whole sum in the first partial: rmsnorm_gw_sum adds them up
            parts[...] = 0
            _store(parts[0], dw)

    def causal_fwd(s_, Tq, Tk, scale):
        _store(s_, sm.causal_softmax_fwd_reference(rows(s_, Tk), int(Tq), float(scale)))

    def causal_bwd(p_, dp, Tq, Tk, scale):
        _store(dp, sm.causal_softmax_bwd_reference(rows(p_, Tk), rows(dp, Tk), int(Tq), float(scale)))

    def softmax_exp(x, s_, lse, V):
        e, ss, ll = sm.softmax_exp_rows_reference(rows(x, V))
        _store(x, e), _store(s_, ss), _store(lse, ll)

    def ce_fwd(logits, targets, s_, lse, losses, V, ignore):
        e, ss, ll, lo = ce.cross_entropy_fwd_reference(rows(logits, V), targets, int(ignore))
        _store(logits, e), _store(s_, ss), _store(lse, ll), _store(losses, lo)

    def ce_bwd(e, s_, targets, dloss, inv, V, ignore):
        _store(e, ce.cross_entropy_bwd_reference(rows(e, V), s_, targets, dloss, float(inv), int(ignore)))

    def grad_norm_partials(g, n, partials):  # the fixed grid the launcher uses
        partials[...] = gn.grad_norm_partials_reference(g[:int(n)], len(partials), gn.NORM_BLOCK)  # float64

    return {"grad_norm_partials": grad_norm_partials, "rmsnorm_fwd": rmsnorm_fwd, "rmsnorm_bwd": rmsnorm_bwd,
            "causal_softmax_fwd": causal_fwd, "causal_softmax_bwd": causal_bwd, "softmax_exp_rows": softmax_exp, "cross_entropy_fwd": ce_fwd,
            "cross_entropy_bwd": ce_bwd, **_elementwise_kernels()}


def _elementwise_kernels() -> dict:
    """The step's elementwise kernels (residual add, SwiGLU, RoPE, AdamW, the RMSNorm gain's sum) in
    NumPy float32, each in its kernel's order of operations with one rounding on store: one NumPy
    pass instead of a fiber per CUDA thread."""
    f32 = np.float32

    def load(a):
        return a if a.dtype == f32 else a.astype(f32)

    def store(dst, values):
        dst[...] = values if dst.dtype == f32 else values.astype(dst.dtype)

    def add(a, b, out, n):
        store(out.reshape(-1)[:n], load(a.reshape(-1)[:n]) + load(b.reshape(-1)[:n]))

    def sigmoid(a):
        with np.errstate(over="ignore"):
            return f32(1) / (f32(1) + np.exp(-a))

    def swiglu_fwd(a, u, out, n):
        a_ = load(a.reshape(-1)[:n])
        store(out.reshape(-1)[:n], a_ * sigmoid(a_) * load(u.reshape(-1)[:n]))

    def swiglu_bwd(a, u, g, da, du, n):
        a_, u_, g_ = (load(x.reshape(-1)[:n]) for x in (a, u, g))
        s = sigmoid(a_)
        d_u = g_ * (a_ * s)
        d_a = g_ * (u_ * (s * (f32(1) + a_ * (f32(1) - s))))
        store(du.reshape(-1)[:n], d_u)
        store(da.reshape(-1)[:n], d_a)

    def rope(x, cos, sin, out, n_pairs, seq, H, D, sign):
        D, h, sign = int(D), int(D) // 2, f32(sign)
        rows = int(n_pairs) // (int(H) * h)
        x4 = load(x.reshape(-1)[:rows * int(H) * D].reshape(rows // int(seq), int(seq), int(H), D))
        c = cos.reshape(-1)[:int(seq) * D].reshape(int(seq), 1, D)
        s_ = sin.reshape(-1)[:int(seq) * D].reshape(int(seq), 1, D)
        x1, x2 = x4[..., :h], x4[..., h:]
        o1 = x1 * c[..., :h] + x2 * (-sign * s_[..., :h])
        o2 = x2 * c[..., h:] + x1 * (sign * s_[..., h:])
        store(out.reshape(-1)[:x4.size].reshape(x4.shape), np.concatenate([o1, o2], axis=-1))

    def adamw(p, g, m, v, f, decay, omb1, b2, omb2, bc2_sqrt, eps, neg_step, n, n_decay):
        n, n_decay = int(n), int(n_decay)
        p_, g_, m_, v_ = (x.reshape(-1)[:n] for x in (p, g, m, v))
        theta = p_.copy()
        theta[:n_decay] *= f32(decay)
        gi = g_ * f if f is not None else g_
        mi = m_ + f32(omb1) * (gi - m_)
        vi = v_ * f32(b2) + f32(omb2) * (gi * gi)
        p_[...] = theta + f32(neg_step) * (mi / (np.sqrt(vi) / f32(bc2_sqrt) + f32(eps)))
        m_[...], v_[...] = mi, vi

    def adamw_step(p, g, m, v, *scalars):
        adamw(p, g, m, v, None, *scalars)

    def adamw_step_scaled(p, g, m, v, factors, *scalars):
        if factors.reshape(-1)[2] == 0:
            adamw(p, g, m, v, factors.reshape(-1)[1], *scalars)

    def adamw_step_graphed(p, g, m, v, factors, step, omb1, b2, omb2, eps, n, n_decay):
        decay, bc2_sqrt, neg_step = step.reshape(-1)[:3]
        adamw_step_scaled(p, g, m, v, factors, decay, omb1, b2, omb2, bc2_sqrt, eps, neg_step, n, n_decay)

    def rmsnorm_gw_sum(parts, gw, n_parts, D):
        acc = np.zeros(int(D), f32)
        for row in parts.reshape(-1)[:int(n_parts) * int(D)].reshape(int(n_parts), int(D)):  # in order, as the kernel
            acc += row
        gw.reshape(-1)[:int(D)] = acc

    flash = _flash_tc_kernels()
    return {**{name: ("flash_attention_tc.cu", fn) for name, fn in flash.items()},
            "add": ("residual.cu", add), "swiglu_fwd": ("swiglu.cu", swiglu_fwd),
            "swiglu_bwd": ("swiglu.cu", swiglu_bwd), "rope": ("rope.cu", rope),
            "adamw_step": ("adamw.cu", adamw_step), "adamw_step_scaled": ("adamw.cu", adamw_step_scaled),
            "adamw_step_graphed": ("adamw.cu", adamw_step_graphed),
            "rmsnorm_gw_sum": ("rmsnorm.cu", rmsnorm_gw_sum)}


def _flash_tc_kernels() -> dict:
    """The tensor-core flash attention's four kernels as plain float32 attention on whole score
    matrices, reading and writing what each kernel reads and writes (lse and dsum included).
    q, o, dout, dq (B, Tq, H, D); k, v, dk, dv (B, Tk, Hkv, D); lse, dsum (B, H, Tq)."""
    f32 = np.float32

    def heads(a, G=1):  # (B, T, h, D) storage -> (B, h * G, T, D) float32
        return np.repeat(np.asarray(a, f32).transpose(0, 2, 1, 3), G, axis=1)

    def probabilities(q, k, lse, Tq, Tk, scale, causal, G):
        s = heads(q) @ heads(k, G).swapaxes(-1, -2) * f32(scale)
        if causal:  # query i sees keys j <= i + Tk - Tq
            s = np.where(np.arange(Tk)[None, :] <= np.arange(Tq)[:, None] + (Tk - Tq), s, -np.inf)
        if lse is None:
            m = s.max(axis=-1, keepdims=True)
            lse = (m + np.log(np.exp(s - m).sum(axis=-1, keepdims=True)))[..., 0]
        return np.exp(s - np.asarray(lse, f32)[..., None]), lse

    def store(dst, x):  # (B, h, T, D) float32 -> dst (B, T, h, D)
        dst[...] = x.transpose(0, 2, 1, 3).astype(dst.dtype)

    def fwd(q, k, v, o, lse, B, Tq, Tk, H, Hkv, D, scale, causal, vec):
        G = int(H) // int(Hkv)
        p, lse_ = probabilities(q, k, None, int(Tq), int(Tk), scale, causal, G)
        store(o, p @ heads(v, G))
        lse[...] = lse_

    def prep(o, dout, dsum, B, Tq, H, D):
        dsum[...] = (np.asarray(o, f32) * np.asarray(dout, f32)).sum(axis=-1).transpose(0, 2, 1)

    def grads(q, k, v, lse, dsum, dout, Tq, Tk, H, Hkv, scale, causal):
        G = int(H) // int(Hkv)
        p, _ = probabilities(q, k, lse, int(Tq), int(Tk), scale, causal, G)
        dp = heads(dout) @ heads(v, G).swapaxes(-1, -2)
        return p, (p * (dp - np.asarray(dsum, f32)[..., None]) * f32(scale)).astype(f32), G

    def dq_(q, k, v, lse, dsum, dout, dq, B, Tq, Tk, H, Hkv, D, scale, causal, vec):
        _, ds, G = grads(q, k, v, lse, dsum, dout, Tq, Tk, H, Hkv, scale, causal)
        store(dq, ds @ heads(k, G))

    def dkdv(q, k, v, lse, dsum, dout, dk, dv, B, Tq, Tk, H, Hkv, D, scale, causal, vec):
        p, ds, G = grads(q, k, v, lse, dsum, dout, Tq, Tk, H, Hkv, scale, causal)
        per_group = (int(B), int(Hkv), G, int(Tk), int(D))  # a kv head's gradient sums its query heads
        store(dv, (p.swapaxes(-1, -2) @ heads(dout)).reshape(per_group).sum(axis=2))
        store(dk, (ds.swapaxes(-1, -2) @ heads(q)).reshape(per_group).sum(axis=2))

    return {"flash_tc_fwd": fwd, "flash_tc_bwd_prep": prep, "flash_tc_bwd_dq": dq_, "flash_tc_bwd_dkdv": dkdv}


_REFERENCES: dict = {}


def _reference_for(name: str, code: str):
    """The reference run for kernel `name`, only when `code` is the package's own source of it (a
    learner's kernel of the same name runs on the emulator)."""
    if not _REFERENCES:
        _REFERENCES.update(_reference_kernels())
    ref = _REFERENCES.get(name.split("<")[0])
    if isinstance(ref, tuple):
        from xtrain_lessons.runtime.cuda import KERNELS_DIR  # noqa: PLC0415

        filename, ref = ref
        if code != _package_source(KERNELS_DIR / filename):
            return None
    return ref


@functools.lru_cache(maxsize=None)
def _package_source(path) -> str:
    return path.read_text()


class RawKernel:
    """cupy.RawKernel, run by the package's CPU emulator on the wrapped arrays (or, for the step's
    row and elementwise kernels under XTRAIN_STANDIN_KERNELS=reference, by their NumPy twins)."""

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
        _device_call("kernel", self.name, *(a for a in args if isinstance(a, ndarray)))
        ua = tuple(a._a if isinstance(a, ndarray) else a for a in args)
        run = lambda: self._k(grid, block, ua, shared_mem=shared_mem)  # noqa: E731
        if os.environ.get("XTRAIN_STANDIN_KERNELS") == "reference":
            ref = _reference_for(self.name, self.code)
            if ref is not None:
                run = lambda: ref(*ua)  # noqa: E731
        run()
        _record(run)


class RawModule:
    def __init__(self, code=None, path=None, options=(), backend="nvrtc", translate_cucomplex=False,
                 enable_cooperative_groups=False, name_expressions=None, jitify=False):
        self.code = code if code is not None else Path(path).read_text()
        self.options = tuple(options)

    def get_function(self, name):
        return RawKernel(self.code, name, self.options)


# ----------------------------------------------------------------------------- cupy.cuda
class _Stream:
    """cupy.cuda.Stream: `with stream:` makes it the current one; begin_capture / end_capture
    record a CUDA graph, as CuPy's do, except that the stand-in runs every call when it is made, so
    its Graph cannot be replayed (launch raises). While a stream captures, a host synchronisation
    or a host <-> device copy raises, as CUDA refuses them."""

    def __init__(self, null=False, non_blocking=False, ptds=False, ptr=0):
        self.ptr = 0 if null else (ptr or id(self))
        self._before = []

    def synchronize(self):
        _host_sync()

    def use(self):
        return self

    def __enter__(self):
        self._before.append(_current[0])
        _current[0] = self
        return self

    def __exit__(self, *exc):
        _current[0] = self._before.pop()
        return False

    def begin_capture(self, mode=None):
        if self.ptr == 0:
            raise RuntimeError("cannot capture on the default (legacy) stream")
        if _capturing:
            raise RuntimeError("cudaErrorIllegalState: a stream is capturing already")
        self._calls = [] if _replay[0] else None
        _capturing.append(self)

    def end_capture(self):
        if self not in _capturing:
            raise RuntimeError("cudaErrorIllegalState: the stream is not capturing")
        _capturing.remove(self)
        return _Graph(self._calls)

    def is_capturing(self):
        return self in _capturing


class _Graph:
    """cupy.cuda.Graph, as the stand-in can make one: the calls ran during the capture already; inside
    replaying_graphs() it also recorded how to redo them (see there)."""

    def __init__(self, calls=None):
        self._calls = calls

    def launch(self, stream=None):
        if self._calls is None:
            raise RuntimeError("the CPU stand-in for CuPy cannot replay a CUDA graph (it ran every call during "
                               "the capture): replaying needs a real GPU")
        _device_call("graph", "launch")
        for redo, out in self._calls:
            _write(out, redo())

    def upload(self, stream=None):
        return None


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
_Stream.null = _null_stream
_current = [_null_stream]


@contextlib.contextmanager
def _using_allocator(allocator=None):
    yield


cuda = types.ModuleType("cupy.cuda")
cuda.Device, cuda.Stream, cuda.MemoryPool, cuda.Graph = _Device, _Stream, MemoryPool, _Graph
cuda.using_allocator = _using_allocator
cuda.memory = types.ModuleType("cupy.cuda.memory")
cuda.memory.OutOfMemoryError, cuda.memory.MemoryPool = OutOfMemoryError, MemoryPool
cuda.get_current_stream = lambda device=None: _current[0]
cuda.runtime = types.SimpleNamespace(
    getDeviceCount=lambda: 1,
    getDeviceProperties=lambda i: {"name": b"CuPy stand-in (NumPy on the CPU)", "totalGlobalMem": 8 * 2**30,
                                   "major": 8, "minor": 0, "multiProcessorCount": 1},
    deviceSynchronize=_host_sync,
    runtimeGetVersion=lambda: 12000,
    driverGetVersion=lambda: 12000,
)
for _n in ("Device", "Stream", "MemoryPool", "Graph", "using_allocator", "get_current_stream", "runtime"):
    assert _n in NAMES["cupy.cuda"], _n


# ----------------------------------------------------------------------------- cuBLAS
class CUBLASError(RuntimeError):
    """cupy_backends.cuda.libs.cublas.CUBLASError."""

    def __init__(self, status, what):
        super().__init__(f"{status}: {what}")


_CUBLAS_HANDLE = 0x5EED  # what cupy.cuda.device.get_cublas_handle() gives
_CUDA_R = {0: np.float32, 2: np.float16, 14: "bfloat16"}  # cudaDataType values the engine uses


def _cuda_dtype(code):
    if code not in _CUDA_R:
        raise CUBLASError("CUBLAS_STATUS_NOT_SUPPORTED", f"data type {code}")
    if _CUDA_R[code] == "bfloat16":
        import ml_dtypes  # noqa: PLC0415

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_CUDA_R[code])


def _device_matrices(ptr, dtype, batch, rows, cols, ld, stride):
    """The column-major (rows x cols, leading dimension ld) matrices at device address ptr, one every
    `stride` elements, as a NumPy view (batch, rows, cols) -- after checking that every element
    read lies inside one live device array (a GPU faults with an illegal address otherwise)."""
    import ctypes  # noqa: PLC0415

    span = ((batch - 1) * stride + (rows - 1) + (cols - 1) * ld + 1) * dtype.itemsize
    if _live_buffer(ptr, ptr + span) is None:
        raise RuntimeError(f"cudaErrorIllegalAddress: a cuBLAS operand at {ptr:#x} ({span:,} bytes) is not inside "
                           "one device array")
    flat = np.frombuffer((ctypes.c_char * span).from_address(ptr), dtype=dtype)
    size = dtype.itemsize
    return np.lib.stride_tricks.as_strided(flat, (batch, rows, cols), (stride * size, size, ld * size))


def _host_float(ptr) -> float:
    import ctypes  # noqa: PLC0415

    return float(np.frombuffer((ctypes.c_char * 4).from_address(ptr), dtype=np.float32)[0])


def _gemm_strided_batched_ex(handle, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
                             strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo):
    """CuPy's binding of cublasGemmStridedBatchedEx: refused while a stream captures (as CuPy does),
    else _gemm."""
    if handle != _CUBLAS_HANDLE:
        raise CUBLASError("CUBLAS_STATUS_NOT_INITIALIZED", "not a cuBLAS handle")
    _refuse_cublas_in_capture()
    _gemm("gemmStridedBatchedEx", transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb, strideB,
          beta, C, Ctype, ldc, strideC, batchCount, computeType, algo)


class _DirectCublas:
    """runtime/cublas_direct.DirectCublas on the stand-in: cuBLAS's own entry point, which a graph
    capture may record."""

    def gemm_strided_batched_ex(self, stream_ptr, *args) -> None:
        _gemm("cublasGemmStridedBatchedEx", *args)
        if _capturing and _capturing[-1]._calls is not None:  # the graph keeps the operands' memory alive
            live = [_live_buffer(ptr, ptr + 1) for ptr in (args[6], args[10], args[15])]
            _record(lambda: (live, _gemm("cublasGemmStridedBatchedEx", *args))[1])


_direct = _DirectCublas()


def direct_cublas():
    """What runtime/cublas_direct.direct_cublas gives on the stand-in (no libcublas to load)."""
    return _direct


def _gemm(name, transa, transb, m, n, k, alpha, A, Atype, lda, strideA, B, Btype, ldb,
          strideB, beta, C, Ctype, ldc, strideC, batchCount, computeType, algo):
    """cublasGemmStridedBatchedEx, column-major as cuBLAS is: C_i = alpha op(A_i) op(B_i) + beta C_i
    for i < batchCount, op(A) (m x k), op(B) (k x n), C (m x n); float32 accumulation. Checks what
    cuBLAS checks (sizes, leading dimensions, supported types) and where the operands lie."""
    if computeType != 68:  # CUBLAS_COMPUTE_32F, the only one the engine asks for
        raise CUBLASError("CUBLAS_STATUS_NOT_SUPPORTED", f"compute type {computeType}")
    a_dt, b_dt, c_dt = _cuda_dtype(Atype), _cuda_dtype(Btype), _cuda_dtype(Ctype)
    if a_dt != b_dt or c_dt not in (a_dt, np.dtype(np.float32)):
        raise CUBLASError("CUBLAS_STATUS_NOT_SUPPORTED", f"types A {a_dt}, B {b_dt}, C {c_dt}")
    a_rows, a_cols = (m, k) if transa == 0 else (k, m)
    b_rows, b_cols = (k, n) if transb == 0 else (n, k)
    if min(m, n, k, batchCount) < 0 or lda < max(1, a_rows) or ldb < max(1, b_rows) or ldc < max(1, m) \
            or transa not in (0, 1) or transb not in (0, 1):
        raise CUBLASError("CUBLAS_STATUS_INVALID_VALUE", f"m {m} n {n} k {k} lda {lda} ldb {ldb} ldc {ldc}")
    if min(m, n, batchCount) == 0:
        return
    a = _device_matrices(A, a_dt, batchCount, a_rows, a_cols, lda, strideA)
    b = _device_matrices(B, b_dt, batchCount, b_rows, b_cols, ldb, strideB)
    c = _device_matrices(C, c_dt, batchCount, m, n, ldc, strideC)
    # Column-major C is row-major C^T = op(B)^T op(A)^T: NumPy's matmul then reads the operands and
    # writes C where they lie (no transposing copies), one sgemm per matrix of the batch.
    lhs = b.swapaxes(-1, -2) if transb == 0 else b
    rhs = a.swapaxes(-1, -2) if transa == 0 else a
    f32 = np.dtype(np.float32)
    lhs, rhs = (x if x.dtype == f32 else x.astype(f32) for x in (lhs, rhs))
    alpha, beta = _host_float(alpha), _host_float(beta)
    _device_call("library", name, a, b, c)
    c_t = c.swapaxes(-1, -2)
    if c_dt == f32 and alpha == 1 and beta == 0:
        np.matmul(lhs, rhs, out=c_t)
        return
    res = np.matmul(lhs, rhs)
    if alpha != 1:
        res *= np.float32(alpha)
    if beta != 0:
        res += np.float32(beta) * c_t.astype(f32)
    c_t[...] = res.astype(c_dt)


cupy_backends = types.ModuleType("cupy_backends")
cupy_backends.cuda = types.ModuleType("cupy_backends.cuda")
cupy_backends.cuda.libs = types.ModuleType("cupy_backends.cuda.libs")
cupy_backends.cuda.libs.cublas = cublas = types.ModuleType("cupy_backends.cuda.libs.cublas")
cublas.gemmStridedBatchedEx, cublas.CUBLASError = _gemm_strided_batched_ex, CUBLASError
CUBLASError.__module__ = "cupy_backends.cuda.libs.cublas"
cuda.device = types.ModuleType("cupy.cuda.device")
cuda.device.get_cublas_handle = lambda: _CUBLAS_HANDLE
_BACKENDS = {"cupy_backends": cupy_backends, "cupy_backends.cuda": cupy_backends.cuda,
             "cupy_backends.cuda.libs": cupy_backends.cuda.libs, "cupy_backends.cuda.libs.cublas": cublas,
             "cupy.cuda.device": cuda.device}


def subprocess_env(env=None, device: str = "cuda", kernels: str = "") -> dict:
    """An environment in which a new Python process takes the stand-in for CuPy (through
    site/sitecustomize.py) and, by default, the "cuda" device: for `xtrain launch`'s ranks, a
    notebook's kernel, a command run by a test. kernels="reference": the step's row and elementwise
    kernels run as their NumPy twins (see _reference_kernels)."""
    env = dict(os.environ if env is None else env)
    site = str(Path(__file__).with_name("site"))
    env["PYTHONPATH"] = os.pathsep.join([site, *filter(None, [env.get("PYTHONPATH")])])
    env["XTRAIN_FAKE_CUPY"] = "1"
    if device:
        env["XTRAIN_DEVICE"] = device
    if kernels:
        env["XTRAIN_STANDIN_KERNELS"] = kernels
    # cuBLAS gives one shape the same bits on every run; NumPy's OpenBLAS gives them only at a fixed
    # thread count (on an AMD EPYC, a 2-thread sgemm differs from the 1-thread one in the last bit),
    # and `xtrain launch` runs its ranks on one thread: one thread everywhere, as on the device.
    for var in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        env[var] = "1"
    return env


def install():
    """Make `import cupy` give this stand-in (returns what sys.modules held before)."""
    before = {k: sys.modules.get(k) for k in ("cupy", "cupy.cuda", "cupy.cuda.memory", *_BACKENDS)}
    sys.modules["cupy"] = sys.modules[__name__]
    sys.modules["cupy.cuda"] = cuda
    sys.modules["cupy.cuda.memory"] = cuda.memory
    sys.modules.update(_BACKENDS)
    return before


def uninstall(before) -> None:
    for k, v in before.items():
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v


@contextlib.contextmanager
def installed():
    """Inside the block `import cupy` gives this stand-in (install / uninstall); yields the module."""
    before = install()
    try:
        yield sys.modules[__name__]
    finally:
        uninstall(before)
