"""The host and the device of a GPU, launch by launch (phase T07b): the picture of a launch-bound and a
compute-bound step, and of what a host synchronisation costs.

The host issues one launch after another, each taking it `launch_us` of CPU time; the device runs
each kernel once it has been issued and its predecessor has finished (one stream: in order); a
host sync (`float(loss)`) after a launch makes the host wait until the device has run everything
issued so far.

    host, dev = timeline(kernel_us=5.0)   # [(start, duration)] of each launch and each kernel
"""

from __future__ import annotations

__all__ = ["timeline"]


def timeline(kernel_us: float, launch_us: float = 24.0, n: int = 10, sync_after: int | None = None):
    """(host, device): [(start µs, duration µs)] of n launches and of their n kernels; a host sync
    after launch `sync_after` (0-based) makes the host wait for the device to finish."""
    host, dev, t_host, t_dev = [], [], 0.0, 0.0
    for i in range(n):
        host.append((t_host, launch_us))
        t_host += launch_us
        start = max(t_host, t_dev)  # issued, and the kernel before it done
        dev.append((start, kernel_us))
        t_dev = start + kernel_us
        if i == sync_after:
            t_host = max(t_host, t_dev)  # float(loss): wait for the queue to drain
    return host, dev
