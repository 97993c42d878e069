"""Plausible wrong solutions of T17's exercise (format: tests/test_mutants.py)."""

_RANK = """
if "WORLD_SIZE" not in env:
    return None
missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]
if missing:
    raise ValueError(f"WORLD_SIZE is set but {missing} is not")
cfg = {"rank": int(env["RANK"]), "world_size": int(env["WORLD_SIZE"]),
       "local_rank": int(env.get("LOCAL_RANK", env["RANK"])),
       "master_addr": env["MASTER_ADDR"], "master_port": int(env["MASTER_PORT"])}
if not 0 <= cfg["rank"] < cfg["world_size"]:
    raise ValueError(f"RANK={cfg['rank']} is not in [0, {cfg['world_size']})")
return cfg
"""

MUTANTS = {
    "T17.1": {
        "LOCAL_RANK defaults to 0": _RANK.replace('env.get("LOCAL_RANK", env["RANK"])', 'env.get("LOCAL_RANK", 0)'),
        "rank range checked with <= (RANK = WORLD_SIZE accepted)": _RANK.replace('cfg["rank"] < cfg["world_size"]',
                                                                                 'cfg["rank"] <= cfg["world_size"]'),
        "port kept as a string": _RANK.replace('int(env["MASTER_PORT"])', 'env["MASTER_PORT"]'),
        "missing variables not reported (KeyError)": _RANK.replace(
            'missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in env]\nif missing:\n'
            '    raise ValueError(f"WORLD_SIZE is set but {missing} is not")\n', ""),
    },
}

_ENV = """
env = dict(base)
env.update(RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(nproc),
           MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
env.setdefault("OMP_NUM_THREADS", "1")
return env
"""

_STOP = """
alive = [p for p in procs if p.poll() is None]
for p in alive:
    p.terminate()
deadline = clock.now() + grace
while any(p.poll() is None for p in alive) and clock.now() < deadline:
    clock.sleep(0.01)
for p in alive:
    if p.poll() is None:
        p.kill()
"""

_WATCH = """
while True:
    codes = [p.poll() for p in procs]
    failed = [c for c in codes if c not in (None, 0)]
    if failed:
        stop(procs)
        return failed[0]
    if all(c == 0 for c in codes):
        return 0
    clock.sleep(0.01)
"""

MUTANTS["T17.2"] = {
    "port written as an int": _ENV.replace("MASTER_PORT=str(master_port)", "MASTER_PORT=master_port"),
    "base changed in place (not copied)": _ENV.replace("env = dict(base)", "env = base"),
    "OMP_NUM_THREADS=1 overrides the user's setting": _ENV.replace('env.setdefault("OMP_NUM_THREADS", "1")',
                                                                    'env["OMP_NUM_THREADS"] = "1"'),
    "ranks numbered from 1": _ENV.replace("RANK=str(rank), WORLD_SIZE", "RANK=str(rank + 1), WORLD_SIZE"),
    "LOCAL_WORLD_SIZE missing": _ENV.replace(" LOCAL_WORLD_SIZE=str(nproc),", ""),
}
MUTANTS["T17.3"] = {
    "SIGKILL at once (no SIGTERM, no grace)": """
        for p in procs:
            if p.poll() is None:
                p.kill()
    """,
    "never SIGKILL (waits for SIGTERM to work)": _STOP.replace(" and clock.now() < deadline", ""),
    "one grace period per process": """
        alive = [p for p in procs if p.poll() is None]
        for p in alive:
            p.terminate()
        for p in alive:
            deadline = clock.now() + grace
            while p.poll() is None and clock.now() < deadline:
                clock.sleep(0.01)
            if p.poll() is None:
                p.kill()
    """,
    "signals every process, exited ones too": _STOP.replace("alive = [p for p in procs if p.poll() is None]", "alive = list(procs)"),
    "waits the whole grace period even when all exited": _STOP.replace(
        "while any(p.poll() is None for p in alive) and clock.now() < deadline:", "while clock.now() < deadline:"),
}
MUTANTS["T17.4"] = {
    "waits for every worker to exit (wait() in turn)": """
        codes = []
        for p in procs:
            while p.poll() is None:
                clock.sleep(0.01)
            codes.append(p.poll())
        failed = [c for c in codes if c != 0]
        if failed:
            stop(procs)
            return failed[0]
        return 0
    """,
    "returns 1 instead of the worker's code": _WATCH.replace("return failed[0]", "return 1"),
    "the others not stopped": _WATCH.replace("        stop(procs)\n", ""),
    "polls without sleeping": _WATCH.replace("    clock.sleep(0.01)\n", "    pass\n"),
    "returns when the first worker exits, whatever its code": _WATCH.replace(
        "if all(c == 0 for c in codes):", "if any(c == 0 for c in codes):"),
}
