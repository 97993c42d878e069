"""Warmup + cosine schedule: the CS336 case, with the expectation written independently."""

from __future__ import annotations

import math

import pytest

from xtrain_lessons.training.optim.schedule import WarmupCosine, lr_at


def _expected(t, hi, lo, tw, tc):
    # Independent statement of the schedule: piecewise in t.
    if t < tw:
        return hi * t / tw
    if t <= tc:
        theta = math.pi * (t - tw) / (tc - tw)
        return lo + (hi - lo) * (1 + math.cos(theta)) / 2
    return lo


def test_cs336_values():
    hi, lo, tw, tc = 1.0, 0.1, 7, 21
    got = [lr_at(t, hi, lo, tw, tc) for t in range(25)]
    want = [_expected(t, hi, lo, tw, tc) for t in range(25)]
    assert got == pytest.approx(want, rel=1e-12, abs=1e-15)
    # shape facts that do not depend on the formula above
    assert got[0] == 0.0
    assert got[tw] == pytest.approx(hi)
    assert got[(tw + tc) // 2] == pytest.approx((hi + lo) / 2)  # midpoint of the cosine
    assert got[tc] == pytest.approx(lo)
    assert all(abs(x - lo) < 1e-15 for x in got[tc:])
    assert all(a < b for a, b in zip(got[:tw], got[1:tw + 1]))  # warmup increases
    assert all(a >= b for a, b in zip(got[tw:tc], got[tw + 1:tc + 1]))  # cosine decreases


def test_degenerate_and_object():
    assert lr_at(5, 1.0, 0.1, 0, 0) == 0.1
    assert lr_at(0, 2.0, 0.1, 0, 10) == pytest.approx(2.0)
    s = WarmupCosine(3e-3, 3e-4, 10, 100)
    assert s(50) == lr_at(50, 3e-3, 3e-4, 10, 100)
    assert s(1000) == 3e-4
