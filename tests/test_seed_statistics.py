"""benchmarks/seed_statistics.py: the IQM against its definition, and bootstrap intervals that
depend only on their own scores."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

# The benchmarks import it as a sibling module (benchmarks/ on the path), and so does this test.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import seed_statistics


def test_an_interval_does_not_depend_on_the_other_variants_or_earlier_calls() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(size=(7, 1))
    b = rng.uniform(size=(5, 1))
    alone = seed_statistics.iqm_and_mean({"a": a}, reps=300)["a"]
    seed_statistics.iqm_and_mean({"b": b}, reps=300)  # moves any shared random state
    beside = seed_statistics.iqm_and_mean({"b": b, "a": a}, reps=300)["a"]
    assert alone == beside
    # The point estimate is the interquartile mean as rliable defines it (scipy's trimmed mean
    # of the middle half) and lies in its interval.
    assert alone["iqm"] == pytest.approx(float(stats.trim_mean(a[:, 0], 0.25)))
    assert alone["iqm_ci95"][0] <= alone["iqm"] <= alone["iqm_ci95"][1]
    assert alone["mean"] == pytest.approx(float(a.mean()))


def test_a_curve_interval_is_the_same_on_every_call() -> None:
    values = np.random.default_rng(1).uniform(size=(6, 4))
    first = seed_statistics.iqm_curve(values, reps=200)
    np.random.seed(123)  # the global state no longer matters, and is left as it was
    second = seed_statistics.iqm_curve(values, reps=200)
    assert np.random.get_state()[1].tolist() == np.random.RandomState(123).get_state()[1].tolist()
    for x, y in zip(first, second):
        np.testing.assert_array_equal(x, y)
