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
