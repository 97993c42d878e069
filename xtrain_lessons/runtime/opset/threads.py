"""The CPU's threads, as the layers above set and name them (phase T07).

    with threads_set(2): ...        # the engine's worker pool and NumPy's BLAS on 2 threads (0: as they are)
    placement("cpu")                 # "cpu, 2 thread(s)"; placement("cuda") == "cuda"

Every CPU kernel of the op set runs on one pool of threads (runtime/cpu_threads.py), the same
bits for any count of them.
"""

from __future__ import annotations

from xtrain_lessons.runtime import cpu_threads

__all__ = ["threads_set", "placement"]

threads_set = cpu_threads.blas_threads_set


def placement(device: str) -> str:
    """Where the engine runs, for a log line: the device, and on the CPU its thread count."""
    return f"cpu, {cpu_threads.get_threads()} thread(s)" if device == "cpu" else device
