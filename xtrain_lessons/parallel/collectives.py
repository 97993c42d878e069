"""Collectives for data parallelism: a small process-group layer over NumPy arrays.

    from xtrain_lessons.parallel import collectives as dist
    dist.init(rank, world_size, "127.0.0.1", port, timeout=60)   # or dist.init_from_env()
    dist.all_reduce(grad, "sum")       # in place, every rank ends with the sum
    dist.broadcast(params, src=0)      # in place, every rank ends with rank 0's values
    dist.send(a, dst=1); dist.recv(b, src=0); dist.sendrecv(a, right, b, left)
    dist.barrier(); dist.destroy()

On the CPU the transport is ``torch.distributed`` with the **gloo** backend: a NumPy array is
shared with torch without a copy (``torch.from_numpy``), so a collective writes straight into
the caller's array. torch is imported only when a group is initialised. gloo also serves GPU
arrays (CuPy): each collective copies the array to the host, runs there, and copies the result
back into the device array — correct on any number of GPUs, including several ranks sharing one
GPU, at the price of two copies per collective.

Every wait is bounded: ``timeout`` (seconds) is the process group's timeout, so a collective
whose peer has died raises ``DistributedError`` instead of hanging (gloo usually notices a
closed connection at once; the timeout is the backstop).

``collective_counts()`` counts the calls by kind (``all_reduce``, ``broadcast``, ``send``,
``recv``, ``barrier``): tests use it to check, e.g., that gradient accumulation all-reduces
only at the accumulation boundary.

GPU path: ``init(..., backend="nccl")`` keeps CuPy arrays on the device and runs the
collectives through ``cupy.cuda.nccl`` — the NCCL unique id is exchanged through a
``torch.distributed.TCPStore`` at MASTER_ADDR:MASTER_PORT; NCCL needs one GPU per rank.
``pick_backend(world_size)`` is what ``xtrain train`` under ``xtrain launch`` uses: $XTRAIN_DIST_BACKEND
(gloo or nccl) when set, else nccl when the device is a GPU and there are at least as many GPUs
as ranks, else gloo. (NCCL is not exercised on the course's CI: no GPU there; the tests' CuPy
stand-in runs the gloo path with device arrays.) CuPy is imported lazily, only on those paths.
"""

from __future__ import annotations

import collections
import datetime
import os

import numpy as np

from xtrain_lessons.runtime.device import get_device, import_cupy, on_gpu

__all__ = ["DistributedError", "init", "init_from_env", "env_rank_config", "is_initialized", "pick_backend",
           "rank", "world_size", "all_reduce", "broadcast", "send", "recv", "sendrecv", "barrier",
           "destroy", "collective_counts", "reset_counts"]

OPS = ("sum", "max", "min", "avg")


class DistributedError(RuntimeError):
    """A collective failed: a peer died, or a wait exceeded the timeout."""


_state: dict = {"backend": None, "rank": 0, "world_size": 1, "timeout": None, "nccl": None}
_counts: collections.Counter = collections.Counter()


# ----- set-up -------------------------------------------------------------------------------

def env_rank_config(environ=None) -> dict | None:
    """The torchrun environment (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) as a
    dict with int ranks and port, or None when WORLD_SIZE is not set."""
    env = os.environ if environ is None else environ
    if "WORLD_SIZE" not in env:
        return None
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]
    if missing:
        raise ValueError(f"WORLD_SIZE is set but {missing} is not: start the workers with "
                         f"`xtrain launch` or torchrun")
    cfg = {"rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]),
           "local_rank": int(env.get("LOCAL_RANK", env["RANK"])),
           "master_addr": env["MASTER_ADDR"], "master_port": int(env["MASTER_PORT"])}
    if not 0 <= cfg["rank"] < cfg["world_size"]:
        raise ValueError(f"RANK={cfg['rank']} is not in [0, WORLD_SIZE={cfg['world_size']})")
    return cfg


def init(rank: int, world_size: int, master_addr: str = "127.0.0.1", master_port: int = 29500,
         timeout: float = 60.0, backend: str = "gloo") -> None:
    """Join the group of ``world_size`` processes; rank 0 hosts the rendezvous at
    ``master_addr:master_port``. Returns once all have joined (or raises after ``timeout`` s)."""
    if _state["backend"] is not None:
        raise DistributedError("distributed.init: already initialised (call destroy() first)")
    import torch.distributed as tdist  # noqa: PLC0415

    td = datetime.timedelta(seconds=float(timeout))
    if backend == "gloo":
        try:
            tdist.init_process_group("gloo", init_method=f"tcp://{master_addr}:{int(master_port)}",
                                     rank=int(rank), world_size=int(world_size), timeout=td)
        except Exception as e:  # noqa: BLE001 - rendezvous errors come in many types
            raise DistributedError(f"rank {rank}: could not join the group of {world_size} at "
                                   f"{master_addr}:{master_port} within {timeout:.0f}s: {e}") from e
    elif backend == "nccl":  # pragma: no cover - needs GPUs
        _state["nccl"] = _NcclComm(rank, world_size, master_addr, master_port, td)
    else:
        raise ValueError(f"distributed.init: backend must be 'gloo' or 'nccl', got {backend!r}")
    _state.update(backend=backend, rank=int(rank), world_size=int(world_size), timeout=float(timeout))


def init_from_env(timeout: float = 60.0, backend: str = "gloo") -> dict | None:
    """``init`` from the torchrun environment; returns its rank config (None: not launched)."""
    cfg = env_rank_config()
    if cfg is None:
        return None
    init(cfg["rank"], cfg["world_size"], cfg["master_addr"], cfg["master_port"], timeout, backend)
    return cfg


def pick_backend(world_size: int) -> str:
    """"gloo" or "nccl" for a group of `world_size` ranks on the current device (module doc)."""
    chosen = os.environ.get("XTRAIN_DIST_BACKEND", "").strip().lower()
    if chosen:
        if chosen not in ("gloo", "nccl"):
            raise ValueError(f"XTRAIN_DIST_BACKEND={chosen!r}: choose gloo or nccl")
        return chosen
    if get_device() != "cuda":
        return "gloo"
    return "nccl" if import_cupy().cuda.runtime.getDeviceCount() >= world_size else "gloo"


def is_initialized() -> bool:
    return _state["backend"] is not None


def rank() -> int:
    return _state["rank"]


def world_size() -> int:
    return _state["world_size"]


def destroy() -> None:
    """Leave the group (safe to call when not initialised)."""
    backend = _state["backend"]
    _state.update(backend=None, rank=0, world_size=1, timeout=None, nccl=None)
    if backend == "gloo":
        import torch.distributed as tdist  # noqa: PLC0415

        if tdist.is_initialized():
            tdist.destroy_process_group()


def collective_counts() -> dict:
    """Calls so far by kind, e.g. {"all_reduce": 12, "broadcast": 25}."""
    return dict(_counts)


def reset_counts() -> None:
    _counts.clear()


# ----- collectives --------------------------------------------------------------------------

def _require():
    if _state["backend"] is None:
        raise DistributedError("no process group: call distributed.init(...) first")


def _tensor(arr: np.ndarray):
    """A torch view of ``arr`` (same memory). ``arr`` must be a C-contiguous NumPy array."""
    import torch  # noqa: PLC0415

    if not isinstance(arr, np.ndarray):
        raise TypeError(f"expected a NumPy or CuPy array on the gloo backend, got {type(arr).__name__}")
    if not arr.flags.c_contiguous or not arr.flags.writeable:
        raise ValueError("collectives work in place on C-contiguous, writeable arrays "
                         "(use np.ascontiguousarray and copy back)")
    return torch.from_numpy(arr)


def _through_host(arr, collective):
    """Run `collective(host_array)` on `arr`: directly for a NumPy array; for a GPU array on a copy
    on the host, whose result is copied back into `arr` (gloo cannot read device memory)."""
    if not on_gpu(arr):
        collective(arr)
        return arr
    host = arr.get()
    collective(host)
    arr.set(host)
    return arr


def _fail(what: str, e: Exception):
    raise DistributedError(f"rank {_state['rank']}: {what} failed (a peer died or did not answer "
                           f"within {_state['timeout']:.0f}s): {e}") from e


def all_reduce(arr, op: str = "sum"):
    """Reduce ``arr`` over all ranks, in place; every rank gets the result. Returns ``arr``."""
    _require()
    if op not in OPS:
        raise ValueError(f"all_reduce: op must be one of {OPS}, got {op!r}")
    _counts["all_reduce"] += 1
    if _state["nccl"] is not None:  # pragma: no cover
        return _state["nccl"].all_reduce(arr, op)
    import torch.distributed as tdist  # noqa: PLC0415

    rop = {"sum": tdist.ReduceOp.SUM, "avg": tdist.ReduceOp.SUM, "max": tdist.ReduceOp.MAX,
           "min": tdist.ReduceOp.MIN}[op]

    def reduce(host):
        try:
            tdist.all_reduce(_tensor(host), op=rop)
        except Exception as e:  # noqa: BLE001
            _fail("all_reduce", e)

    _through_host(arr, reduce)
    if op == "avg":
        arr /= arr.dtype.type(_state["world_size"])
    return arr


def broadcast(arr, src: int = 0):
    """Copy rank ``src``'s ``arr`` into every rank's ``arr`` (in place). Returns ``arr``."""
    _require()
    _counts["broadcast"] += 1
    if _state["nccl"] is not None:  # pragma: no cover
        return _state["nccl"].broadcast(arr, src)
    import torch.distributed as tdist  # noqa: PLC0415

    def copy_from_src(host):
        try:
            tdist.broadcast(_tensor(host), src=int(src))
        except Exception as e:  # noqa: BLE001
            _fail("broadcast", e)

    return _through_host(arr, copy_from_src)


def _wait(work, what):
    import datetime as _dt  # noqa: PLC0415

    try:
        work.wait(_dt.timedelta(seconds=_state["timeout"]))
    except Exception as e:  # noqa: BLE001
        _fail(what, e)


def send(arr, dst: int) -> None:
    """Send ``arr`` to rank ``dst`` (returns when sent; bounded by the timeout)."""
    _require()
    _counts["send"] += 1
    import torch.distributed as tdist  # noqa: PLC0415

    host = arr.get() if on_gpu(arr) else np.ascontiguousarray(arr)
    try:
        work = tdist.isend(_tensor(host), dst=int(dst))
    except Exception as e:  # noqa: BLE001
        _fail(f"send to rank {dst}", e)
    _wait(work, f"send to rank {dst}")


def recv(arr, src: int):
    """Receive into ``arr`` (in place) from rank ``src``. Returns ``arr``."""
    _require()
    _counts["recv"] += 1
    import torch.distributed as tdist  # noqa: PLC0415

    def receive(host):
        try:
            work = tdist.irecv(_tensor(host), src=int(src))
        except Exception as e:  # noqa: BLE001
            _fail(f"recv from rank {src}", e)
        _wait(work, f"recv from rank {src}")

    return _through_host(arr, receive)


def sendrecv(send_arr, dst: int, recv_arr, src: int):
    """Send ``send_arr`` to ``dst`` while receiving ``recv_arr`` from ``src`` (both posted
    before either is waited for, so a ring of these cannot deadlock). Returns ``recv_arr``."""
    _require()
    _counts["send"] += 1
    _counts["recv"] += 1
    import torch.distributed as tdist  # noqa: PLC0415

    sent = send_arr.get() if on_gpu(send_arr) else np.ascontiguousarray(send_arr)

    def exchange(host):
        try:
            ws = tdist.isend(_tensor(sent), dst=int(dst))
            wr = tdist.irecv(_tensor(host), src=int(src))
        except Exception as e:  # noqa: BLE001
            _fail(f"sendrecv (to {dst}, from {src})", e)
        _wait(wr, f"recv from rank {src}")
        _wait(ws, f"send to rank {dst}")

    return _through_host(recv_arr, exchange)


def barrier() -> None:
    """Wait until every rank has reached this point (bounded by the timeout)."""
    _require()
    _counts["barrier"] += 1
    if _state["nccl"] is not None:  # pragma: no cover
        return _state["nccl"].barrier()
    # an all-reduce of one number: gloo's own barrier has no per-call timeout
    all_reduce(np.zeros(1, np.float32))
    _counts["all_reduce"] -= 1


# ----- NCCL through CuPy (GPU only; untested on the course's CPU CI) ------------------------

class _NcclComm:  # pragma: no cover - needs GPUs
    """One NCCL communicator per process, on device LOCAL_RANK; arrays are CuPy arrays."""

    def __init__(self, rank, world_size, master_addr, master_port, timeout):
        import torch.distributed as tdist  # noqa: PLC0415

        cupy = import_cupy()
        nccl = cupy.cuda.nccl

        self.cupy, self.nccl = cupy, nccl
        cupy.cuda.Device(int(os.environ.get("LOCAL_RANK", rank)) % cupy.cuda.runtime.getDeviceCount()).use()
        store = tdist.TCPStore(master_addr, int(master_port), world_size, rank == 0, timeout)
        if rank == 0:
            store.set("nccl_id", bytes(bytearray(b % 256 for b in nccl.get_unique_id())))
        uid = tuple(b if b < 128 else b - 256 for b in store.get("nccl_id"))
        self.comm = nccl.NcclCommunicator(world_size, uid, rank)
        self.store = store

    def _dtype(self, arr):
        n = self.nccl
        return {np.dtype(np.float32): n.NCCL_FLOAT32, np.dtype(np.float64): n.NCCL_FLOAT64,
                np.dtype(np.float16): n.NCCL_FLOAT16, np.dtype(np.int64): n.NCCL_INT64}[arr.dtype]

    def all_reduce(self, arr, op):
        n = self.nccl
        nop = {"sum": n.NCCL_SUM, "avg": n.NCCL_SUM, "max": n.NCCL_MAX, "min": n.NCCL_MIN}[op]
        stream = self.cupy.cuda.get_current_stream()
        self.comm.allReduce(arr.data.ptr, arr.data.ptr, arr.size, self._dtype(arr), nop, stream.ptr)
        stream.synchronize()
        if op == "avg":
            arr /= arr.dtype.type(self.comm.size())
        return arr

    def broadcast(self, arr, src):
        stream = self.cupy.cuda.get_current_stream()
        self.comm.bcast(arr.data.ptr, arr.size, self._dtype(arr), int(src), stream.ptr)
        stream.synchronize()
        return arr

    def barrier(self):
        self.all_reduce(self.cupy.zeros(1, self.cupy.float32), "sum")
