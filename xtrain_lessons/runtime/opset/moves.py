"""Host and device moves, in the op table (phases T01, T07). The functions are runtime/device.py's,
which the layers above import directly; they are listed here so that the table names every way an
array crosses between host and device.

    to_host(a)              a NumPy array (a GPU array copied back; a host array as it is)
    to_device(a)            an array of the current device (copied only when it moves)
    move_to(a, "cuda")      an array of that device;  to_device_of(a, like): where `like` lives
"""

from __future__ import annotations

from xtrain_lessons.runtime.device import move_to, to_device, to_device_of, to_host
from xtrain_lessons.runtime.opset.table import op

__all__ = ["to_host", "to_device", "move_to", "to_device_of"]

for _fn, _cpu, _gpu in ((to_host, "np.asarray (no copy)", "CuPy's ndarray.get (device to host)"),
                        (to_device, "np.asarray (no copy)", "cupy.asarray (host to device)"),
                        (move_to, "ndarray.get, or np.asarray", "cupy.asarray"),
                        (to_device_of, "as it is, or ndarray.get", "as it is, or cupy.asarray")):
    op("moves", cpu=_cpu, gpu=_gpu, reference="device.py: " + _fn.__name__, test="test_device.py")(_fn)
