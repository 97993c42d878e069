"""The checks of solutions/T19_capstone.ipynb reject every wrong solution in
tests/mutants/T19_capstone.py, and pass the right ones (the same cases as the notebook)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from xtrain_lessons.measure.bench import train_flops_per_token
from xtrain_lessons.course.checks import check_fn
from xtrain_lessons.model.qwen3 import PRESETS as MODEL_PRESETS, Config
from xtrain_lessons.measure.scaling_law import predict
from xtrain_lessons.measure.study import PRESETS, model_overrides

_spec = importlib.util.spec_from_file_location("t19_mutants", Path(__file__).parent / "mutants" / "T19_capstone.py")
mutants = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(mutants)

TRUE = {"E": 1.1, "A": 40.0, "alpha": 0.34, "B": 300.0, "beta": 0.29}
Ns, Ds = np.repeat([1.4e4, 2.7e4, 5.6e4, 1.6e5], 3), np.tile([4.1e4, 8.2e4, 1.64e5], 4)
Ls = predict(TRUE, Ns, Ds)
FIT = {"E": 0.2, "A": 60.0, "alpha": 0.6, "B": 50.0, "beta": 0.3}


def _configs():
    p = PRESETS["quick"]
    cs = [MODEL_PRESETS["tiny"].replace(vocab_size=p.vocab_size, **model_overrides(p, s)) for s in p.sizes]
    return cs + [Config(vocab_size=512, dim=64, n_layers=3, n_heads=8, n_kv_heads=2, max_seq_len=128)]


def _residual_reference(theta, N, D, L):
    law = dict(E=np.exp(theta[0]), A=np.exp(theta[1]), B=np.exp(theta[2]), alpha=theta[3], beta=theta[4])
    return np.log(predict(law, N, D)) - np.log(L)


def _right(ex):
    return {"T19.1": lambda c, T, D: (6 * mutants._matmul_weights(c) + mutants._attention(c, T)) * D,
            "T19.2": _residual_reference, "T19.3": predict}[ex]


def _check(ex, fn):
    if ex == "T19.1":
        cases = [(c, T, D) for c in _configs() for T, D in [(64, 40_960), (32, 1_000)]]
        return check_fn("T19.1 run_flops", fn, lambda c, T, D: train_flops_per_token(c, T) * D, cases, rtol=1e-12)
    if ex == "T19.2":
        thetas = [np.array([0.1, 3.7, 5.7, 0.34, 0.29]), np.array([-1.0, 2.0, 1.0, 0.8, 0.1])]
        cases = [(t, Ns, Ds, Ls) for t in thetas] + [(thetas[0], Ns, Ds, Ls * 1.1)]
        return check_fn("T19.2 law_residuals", fn, _residual_reference, cases, atol=1e-9, rtol=1e-9)
    return check_fn("T19.3 predict_loss", fn, predict,
                    [(TRUE, Ns, Ds), (FIT, 4.3e4, 1.64e5), (TRUE, 1e9, 1e12)], rtol=1e-12)


@pytest.mark.parametrize("ex, fn", [(ex, f) for ex, fs in mutants.BY_EXERCISE.items() for f in fs],
                         ids=lambda x: getattr(x, "__name__", x))
def test_mutant_fails(ex, fn, capsys):
    assert _check(ex, fn) is not fn
    assert "fail" in capsys.readouterr().out


@pytest.mark.parametrize("ex", sorted(mutants.BY_EXERCISE))
def test_right_solution_passes(ex, capsys):
    fn = _right(ex)
    assert _check(ex, fn) is fn
    assert "pass" in capsys.readouterr().out
    assert len(mutants.BY_EXERCISE[ex]) >= 3
