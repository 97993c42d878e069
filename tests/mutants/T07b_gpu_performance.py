"""Plausible wrong solutions of T07b's exercises (format: tests/test_mutants.py)."""

_TIMELINE = """
host, dev, t_host, t_dev = [], [], 0.0, 0.0
for i in range(n):
    host.append((t_host, launch_us))
    t_host += launch_us
    start = max(t_host, t_dev)
    dev.append((start, kernel_us))
    t_dev = start + kernel_us
    if i == sync_after:
        t_host = max(t_host, t_dev)
return host, dev
"""

_ADAMW = """
float theta = p[i];
if (i < n_decay) theta = theta * decay;
float gi = g[i];
float mi = m[i];
mi = mi + one_minus_b1 * (gi - mi);
float vi = v[i] * b2 + one_minus_b2 * (gi * gi);
float denom = sqrtf(vi) / bc2_sqrt + eps;
p[i] = theta + neg_step * (mi / denom);
m[i] = mi;
v[i] = vi;
"""

MUTANTS = {
    "T07b.1": {
        "a kernel starts as soon as the one before it ends, launched or not": (
            _TIMELINE.replace("start = max(t_host, t_dev)", "start = t_dev"), "launch-bound"),
        "kernels overlap (each starts at its launch, not after its predecessor)": (
            _TIMELINE.replace("start = max(t_host, t_dev)", "start = t_host"), "compute-bound"),
        "the host sync ignored": (_TIMELINE.replace("        t_host = max(t_host, t_dev)\n", "        pass\n"), "host sync"),
        "a kernel starts when its launch begins, not when it is done": (
            _TIMELINE.replace("    t_host += launch_us\n    start = max(t_host, t_dev)",
                              "    start = max(t_host, t_dev)\n    t_host += launch_us"), "launch-bound"),
        "launches of a fixed 24 µs": (_TIMELINE.replace("host.append((t_host, launch_us))\n    t_host += launch_us",
                                                        "host.append((t_host, 24.0))\n    t_host += 24.0"), "one launch"),
    },
    "T07b.2": {
        "every parameter decayed (n_decay ignored)": _ADAMW.replace("if (i < n_decay) theta", "theta"),
        "eps inside the square root": _ADAMW.replace("sqrtf(vi) / bc2_sqrt + eps", "sqrtf(vi + eps) / bc2_sqrt"),
        "v not written back": _ADAMW.replace("v[i] = vi;\n", ""),
        "update from the old m (m read after the store)": _ADAMW.replace("(mi / denom)", "(m[i] / denom)"),
    },
    "T07b.3": {
        "float() of each loss: a host sync per step": ("""
            return [float(v) for v in losses]
        """, "host syncs"),
        "to_host of each loss in turn": ("""
            return [float(device.to_host(v)) for v in losses]
        """, "host syncs"),
        "stacked in reverse order": ("""
            if not losses:
                return []
            xp = device.array_module(losses[0])
            return device.to_host(xp.stack([xp.asarray(v).reshape(()) for v in losses[::-1]])).astype(np.float64).tolist()
        """, "in order"),
        "only the last loss read, for every step": ("""
            return [float(losses[-1])] * len(losses) if losses else []
        """, "in order"),
        "an empty list not handled": ("""
            xp = device.array_module(losses[0])
            return device.to_host(xp.stack([xp.asarray(v).reshape(()) for v in losses])).astype(np.float64).tolist()
        """, "IndexError"),
    },
}
