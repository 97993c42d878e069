"""One process per device: `launch(cmd, nproc)` starts N workers with a torchrun-style
environment and watches them (the command line is `xtrain launch`, cli/launch.py).

Each worker gets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT,
the variables torchrun sets. A worker that exits non-zero stops the others (SIGTERM, then
SIGKILL after `grace` seconds) and its code is returned; SIGINT/SIGTERM to the launcher are
forwarded; the workers sit in their own process group with a parent-death signal, so they die
with the launcher even on SIGKILL.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import signal
import socket
import subprocess
import sys
import time

__all__ = ["free_port", "worker_env", "launch"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def worker_env(rank: int, nproc: int, master_addr: str, master_port: int, base=None) -> dict:
    """The environment of worker ``rank`` (torchrun's variables on top of ``base``)."""
    env = dict(os.environ if base is None else base)
    env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank),
               LOCAL_WORLD_SIZE=str(nproc), MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _command(cmd: list[str]) -> list[str]:
    if cmd and cmd[0] == "xtrain":
        return [sys.executable, "-m", "xtrain_lessons.cli.main", *cmd[1:]]
    if cmd and cmd[0] in ("python", "python3"):
        return [sys.executable, *cmd[1:]]
    return cmd


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _die_with(parent_pid: int):
    """A preexec_fn: this child gets SIGKILL when `parent_pid` (the launcher) dies."""
    def preexec():
        if not sys.platform.startswith("linux"):
            return
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os._exit(1)
    return preexec


def _signal(procs, sig) -> None:
    """`sig` to each live worker's process group (the worker and what it started)."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def _stop(procs, grace: float, sig=signal.SIGTERM) -> None:
    alive = [p for p in procs if p.poll() is None]
    _signal(alive, sig)
    deadline = time.monotonic() + grace
    for p in alive:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal([p], signal.SIGKILL)
            p.wait(timeout=10)


class _Signals:
    """While active, SIGINT/SIGTERM to the launcher only record which came (the loop forwards it)."""

    def __init__(self):
        self.got, self._old = None, {}

    def __enter__(self):
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                self._old[sig] = signal.signal(sig, self._handler)
            except ValueError:  # not the main thread
                pass
        return self

    def _handler(self, signum, frame):
        self.got = signum

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)
        return False


def launch(cmd: list[str], nproc: int, master_addr: str = "127.0.0.1", master_port: int | None = None,
           max_time: float | None = None, grace: float = 5.0, log=None) -> int:
    """Run ``cmd`` in ``nproc`` processes; return 0 when all succeed, else the first non-zero
    exit code (after stopping the other workers)."""
    log = log or (lambda m: print(m, file=sys.stderr, flush=True))
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    if not cmd:
        raise ValueError("no command to launch: xtrain launch --nproc N -- COMMAND ...")
    port = master_port or free_port(master_addr)
    argv = _command(cmd)
    procs = []
    t0 = time.monotonic()
    with _Signals() as got:
        try:
            for r in range(nproc):
                procs.append(subprocess.Popen(argv, env=worker_env(r, nproc, master_addr, port),
                                              process_group=0, preexec_fn=_die_with(os.getpid())))
            return _watch(procs, got, t0, max_time, grace, log)
        except BaseException:
            _stop(procs, 0.0, signal.SIGKILL)  # never leave workers behind
            raise


def _watch(procs, got, t0, max_time, grace, log) -> int:
    """Poll the workers until all succeed, one fails, time runs out or a signal comes."""
    while True:
        if got.got is not None:
            name = signal.Signals(got.got).name
            log(f"xtrain launch: {name}; forwarding it to the workers (SIGKILL after {grace:.0f}s)")
            _stop(procs, grace, got.got)
            return 128 + got.got
        codes = [p.poll() for p in procs]
        bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if bad:
            r, c = bad[0]  # polled often: the first to fail, before the others notice it
            log(f"xtrain launch: rank {r} exited with code {c}; stopping the other workers")
            _stop(procs, grace)
            return c if c > 0 else 1
        if all(c == 0 for c in codes):
            return 0
        if max_time and time.monotonic() - t0 > max_time:
            running = [r for r, c in enumerate(codes) if c is None]
            log(f"xtrain launch: --max-time {max_time:.0f}s exceeded; stopping rank(s) {running}")
            _stop(procs, grace)
            return 124
        time.sleep(0.01)
