"""The host/device timeline of a GPU's launches (measure/launch_timeline.py, T07b): in order, a kernel
never before its launch, and a host sync waits for the device."""

from xtrain_lessons.measure.launch_timeline import timeline


def test_launch_bound_the_device_waits_for_each_launch():
    host, dev = timeline(kernel_us=5.0, launch_us=24.0, n=4)
    assert host == [(0.0, 24.0), (24.0, 24.0), (48.0, 24.0), (72.0, 24.0)]
    assert dev == [(24.0, 5.0), (48.0, 5.0), (72.0, 5.0), (96.0, 5.0)]  # each kernel starts when issued


def test_compute_bound_the_kernels_run_back_to_back():
    host, dev = timeline(kernel_us=60.0, launch_us=24.0, n=3)
    assert host[-1] == (48.0, 24.0)  # the host runs ahead
    assert dev == [(24.0, 60.0), (84.0, 60.0), (144.0, 60.0)]


def test_a_host_sync_drains_the_queue_before_the_next_launch():
    host, dev = timeline(kernel_us=40.0, launch_us=24.0, n=3, sync_after=1)
    assert dev[1] == (64.0, 40.0)
    assert host[2][0] == 104.0  # the host waited for kernel 1 to finish
    assert dev[2] == (128.0, 40.0)
