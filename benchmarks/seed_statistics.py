"""Aggregates over seeds shared by the finetuning benchmarks: the interquartile mean (IQM) and the
mean of each variant's scores with 95% stratified bootstrap confidence intervals from ``rliable``
(Agarwal et al., 2021), and their bar-chart form."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

#: Seed of every bootstrap: an interval depends only on its own scores, not on what was
#: resampled before it in the same process (a report regenerated with one more cell keeps the
#: intervals of the others).
BOOTSTRAP_SEED = 0


@contextmanager
def seeded_bootstrap() -> Iterator[None]:
    """Run the block with NumPy's global generator seeded with ``BOOTSTRAP_SEED``, then restore
    its state: rliable's stratified bootstrap draws its resamples from ``np.random.choice`` and
    ignores its ``random_state`` argument (rliable 1.2 with arch 7.2)."""
    state = np.random.get_state()
    np.random.seed(BOOTSTRAP_SEED)
    try:
        yield
    finally:
        np.random.set_state(state)


def iqm_and_mean(scores: dict[str, np.ndarray], reps: int) -> dict[str, dict[str, Any]]:
    """Per variant of ``scores`` (name -> ``[runs, 1]``): ``iqm``, ``mean``, their 95% bootstrap
    intervals ``iqm_ci95`` / ``mean_ci95`` from ``reps`` resamples, and the run ``values``."""
    from rliable import library as rly
    from rliable import metrics

    def both(x: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(x), metrics.aggregate_mean(x)])

    points, intervals = {}, {}
    for name, values in scores.items():
        # One variant at a time, each from the same seed: its interval does not depend on the
        # other variants in the call.
        with seeded_bootstrap():
            point, interval = rly.get_interval_estimates({name: values}, both, reps=reps)
        points[name], intervals[name] = point[name], interval[name]
    return {
        name: {
            "iqm": float(points[name][0]),
            "iqm_ci95": [float(intervals[name][0, 0]), float(intervals[name][1, 0])],
            "mean": float(points[name][1]),
            "mean_ci95": [float(intervals[name][0, 1]), float(intervals[name][1, 1])],
            "values": scores[name][:, 0].tolist(),
        }
        for name in scores
    }


def iqm_curve(values: np.ndarray, reps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A learning curve over seeds: at each of the ``T`` points of ``values [runs, T]``, the IQM
    over the runs and its 95% stratified bootstrap interval from ``reps`` resamples (``rliable``;
    a resample draws whole runs, so a point's interval is that of its runs). Returns ``iqm [T]``,
    ``low [T]``, ``high [T]``."""
    from rliable import library as rly
    from rliable import metrics

    def per_point(x: np.ndarray) -> np.ndarray:
        return np.array([metrics.aggregate_iqm(x[:, [j]]) for j in range(x.shape[1])])

    with seeded_bootstrap():
        point, interval = rly.get_interval_estimates({"x": values}, per_point, reps=reps)
    return point["x"], interval["x"][0], interval["x"][1]


def iqm_bars(
    table: dict[str, dict[str, Any]],
) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A table of :func:`iqm_and_mean` as horizontal bars: the variant names, their positions
    ``[V]``, IQMs ``[V]`` and the interval bounds ``[V]``, ``[V]``."""
    names = list(table)
    iqm = np.array([table[n]["iqm"] for n in names])
    lo = np.array([table[n]["iqm_ci95"][0] for n in names])
    hi = np.array([table[n]["iqm_ci95"][1] for n in names])
    return names, np.arange(len(names)), iqm, lo, hi
