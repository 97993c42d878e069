"""T08: the collective layer, the hand ring all-reduce and DDP, on CPU with gloo.

Multi-process tests start real workers with `xtrain launch` (127.0.0.1, a free port, bounded
by --max-time); the workers are the experiments of `python -m xtrain_lessons.measure.ddp_experiments`."""

import subprocess
import sys

import numpy as np
import pytest

from xtrain_lessons.parallel import collectives
from xtrain_lessons.measure.ddp_experiments import load_result
from xtrain_lessons.parallel.ring import chunk_bounds, ring_schedule, simulate_ring_all_reduce


def launch(nproc, *args, timeout=90):
    cmd = [sys.executable, "-m", "xtrain_lessons.cli.main", "launch", "--nproc", str(nproc), "--max-time", "80",
           "--", sys.executable, "-m", "xtrain_lessons.measure.ddp_experiments", *map(str, args)]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


# ----- pure: the schedule ---------------------------------------------------------------------

@pytest.mark.parametrize("W", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [0, 1, 3, 7, 10, 13])
def test_simulated_ring_equals_sum(W, n):
    rng = np.random.default_rng([W, n])
    values = [[int(v) for v in rng.integers(-50, 50, n)] for _ in range(W)]
    out = simulate_ring_all_reduce(values)
    expect = [sum(col) for col in zip(*values)] if n else []
    assert all(o == expect for o in out)


def test_schedule_each_rank_ends_owning_one_chunk():
    W = 4
    # after reduce-scatter rank r owns chunk (r+1) % W: the chunk it receives last
    for r in range(W):
        assert ring_schedule(W, r, W - 2, "reduce_scatter")[1] == (r + 1) % W
        # all-gather starts by sending that chunk
        assert ring_schedule(W, r, 0, "all_gather")[0] == (r + 1) % W
    assert chunk_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]


def test_env_rank_config():
    env = {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1234"}
    assert collectives.env_rank_config(env) == {"rank": 1, "world_size": 2, "local_rank": 1,
                                                "master_addr": "127.0.0.1", "master_port": 1234}
    assert collectives.env_rank_config({}) is None
    with pytest.raises(ValueError, match="MASTER_PORT"):
        collectives.env_rank_config({"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"})
    with pytest.raises(ValueError, match="RANK=2"):
        collectives.env_rank_config({**env, "RANK": "2"})


def test_collective_without_group_is_a_clear_error():
    with pytest.raises(collectives.DistributedError, match="init"):
        collectives.all_reduce(np.zeros(3, np.float32))


# ----- real processes -------------------------------------------------------------------------

@pytest.mark.parametrize("W", [2, 3])
def test_ring_all_reduce_equals_library(W, tmp_path):
    out = tmp_path / "ring.npz"
    p = launch(W, "ring", "--out", out, "--sizes", "0,1,2,5,7,1000,12345")
    assert p.returncode == 0, p.stderr[-3000:]
    res = load_result(out)
    for n, r in res.items():
        # float32 sums of W terms in another order: a few ulps of the largest value
        assert r["max_abs_diff"] <= 4 * W * np.finfo(np.float32).eps * max(1.0, r["max_abs"]), (n, r)
        assert r["sends"] == 2 * (W - 1)
    if W == 2:  # two terms: a + b == b + a exactly
        assert all(r["max_abs_diff"] == 0.0 for r in res.values())


@pytest.fixture(scope="module")
def equivalence(tmp_path_factory):
    d = tmp_path_factory.mktemp("ddp")
    p2 = launch(2, "equiv", "--steps", 5, "--batch", 2, "--out", d / "w2.npz")
    assert p2.returncode == 0, p2.stderr[-3000:]
    p1 = subprocess.run([sys.executable, "-m", "xtrain_lessons.measure.ddp_experiments", "equiv", "--steps", "5", "--batch", "4",
                         "--out", str(d / "w1.npz")], capture_output=True, text=True, timeout=60)
    assert p1.returncode == 0, p1.stderr[-3000:]
    return load_result(d / "w2.npz"), load_result(d / "w1.npz")


def test_ddp_two_ranks_equal_one_rank_double_batch(equivalence):
    two, one = equivalence
    assert two["world_size"] == 2 and one["world_size"] == 1
    dl = max(abs(a - b) for a, b in zip(two["losses"], one["losses"]))
    dp = max(float(np.abs(two["params"][k] - one["params"][k]).max()) for k in one["params"])
    assert dl <= 1e-6, dl
    assert dp <= 1e-6, dp


def test_ddp_collectives_per_step(equivalence):
    two, _ = equivalence
    c = two["collectives"]
    # the tiny model fits in one 4 MiB bucket: 1 broadcast at the start, then per step one
    # gradient all-reduce and one all-reduce of the loss
    assert c["broadcast"] == 1
    assert c["all_reduce"] == 5 * 2


def test_a_hung_peer_is_a_timeout_not_a_hang(tmp_path):
    """Rank 1 never reaches the all-reduce: rank 0 raises DistributedError after the group's
    timeout (3 s here), the launcher stops rank 1 and exits non-zero."""
    script = tmp_path / "hang.py"
    script.write_text(
        "import time, numpy as np\n"
        "from xtrain_lessons.parallel import collectives as d\n"
        "d.init_from_env(timeout=3)\n"
        "if d.rank() == 1:\n"
        "    time.sleep(120)\n"
        "d.all_reduce(np.ones(4, np.float32))\n")
    cmd = [sys.executable, "-m", "xtrain_lessons.cli.main", "launch", "--nproc", "2", "--grace", "2", "--max-time", "60",
           "--", sys.executable, str(script)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=90)
    assert p.returncode != 0
    assert "DistributedError: rank 0: all_reduce failed" in p.stderr, p.stderr[-2000:]
    assert "xtrain launch: rank 0 exited with code 1" in p.stderr
