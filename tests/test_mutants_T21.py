"""Every wrong solution in tests/mutants/T21_grpo.py (and T20_sft.py) fails its notebook check,
run through the notebook's own check cells (tests/test_mutants.py's harness, one process per
notebook); the solutions pass and the learner's stubs say "not yet"."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("stem", ["T20_sft", "T21_grpo"])
def test_post_training_checks_reject_their_mutants(stem):
    res = subprocess.run([sys.executable, str(REPO / "tests" / "test_mutants.py"), stem], capture_output=True,
                         text=True, timeout=600, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert res.returncode == 0, (res.stdout + res.stderr)[-4000:]
    assert f"{stem}: " in res.stdout and " 0 problems" in res.stdout
