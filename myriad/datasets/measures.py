"""Dataset measures of the exploration-data literature, per member and for the union, in one
streaming pass (``myriad dataset info``, ``load(..., measures=True)``).

Definitions (``s`` a row's state, ``a`` its action, ``s'`` its next state):

- **coverage**: the fraction of the env's reachable grid cells (``env.features``: the same grid
  as pretraining's ``coverage/*``) holding the entropy features of at least one ``s``.
- **state-action coverage** (``sa_coverage``): the fraction of reachable (cell, action bin)
  pairs the rows visit, where each action dimension (clipped to ``[-1, 1]``) is cut into
  ``action_bins`` equal bins, so there are ``reachable cells x action_bins^A`` pairs. This is
  the SACo of Schweighofer et al. (arXiv 2111.04714, the number of unique state-action pairs of
  a dataset) made countable for continuous states and actions by the grid and the bins, and
  normalised by the number of pairs that exist instead of by a reference dataset's count, so
  that datasets compare without one. ``sa_pairs`` is the raw count.
- **entropy**: the Kozachenko-Leonenko k-NN entropy (nats, ``k`` neighbours,
  :func:`myriad.entropy.kl_entropy`) of the entropy features of a uniform sample of
  ``knn_samples`` states without replacement (all states when there are fewer). The sample is
  the rows with the smallest hash of their row index (splitmix64 of ``index + seed``), so it does
  not depend on how the rows are chunked, and every member and the union get a sample of the
  same size (the estimate depends on the sample size; equal sizes keep it comparable).
  Distances are floored at ``min_distance`` (1e-3 feature units, a resolution) before the log:
  exploration data repeats states exactly (every episode's start, an agent held by a wall), and
  without a floor one repeated state sends the estimate to minus infinity.
- **goal_transitions** (with a goal): the rows whose ``s'`` reaches the goal, i.e. where the
  nav task's sparse reward for that goal is +1 (``s'``'s position, read from
  ``next_observations``, within the env's ``goal_radius`` of the goal).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from myriad.datasets.schema import DatasetSpec, Rows

if TYPE_CHECKING:
    from myriad.envs.base import FeatureSpec

_MASK64 = (1 << 64) - 1


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser of ``x`` (uint64, elementwise): a fixed pseudo-random key."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class _Sample:
    """The ``size`` rows with the smallest keys seen so far (their keys and features)."""

    def __init__(self, size: int, p: int) -> None:
        self.size = size
        self.keys = np.zeros(0, np.uint64)
        self.points = np.zeros((0, p), np.float32)

    def add(self, keys: np.ndarray, points: np.ndarray) -> None:
        keys = np.concatenate([self.keys, keys])
        points = np.concatenate([self.points, points])
        if len(keys) > self.size:
            keep = np.argpartition(keys, self.size - 1)[: self.size]
            keys, points = keys[keep], points[keep]
        self.keys, self.points = keys, points


class _Group:
    """Accumulated measures of one member (or the union)."""

    def __init__(self, samples: int, p: int) -> None:
        self.cells: np.ndarray | None = None  # visited cells, filled by the owner
        self.pairs = np.zeros(0, np.int64)
        self.goal = 0
        self.rows = 0
        self.sample = _Sample(samples, p)


class DatasetMeasures:
    """Streaming accumulator of the measures (module docstring), per member and union.

    Args:
        spec: the dataset's spec (features, env in its metadata).
        grid: the env's feature grid (:func:`myriad.datasets.inspection.env_grid`), or None:
            no coverage measures.
        goal: ``(x, y)`` for ``goal_transitions`` (nav envs), or None.
        action_bins: bins per action dimension of ``sa_coverage``.
        k: neighbours of the entropy estimate.
        knn_samples: states per entropy estimate.
        seed: seed of the sample's keys.
        min_distance: floor on k-NN distances (feature units).
    """

    def __init__(
        self,
        spec: DatasetSpec,
        grid: FeatureSpec | None,
        goal: tuple[float, float] | None = None,
        action_bins: int = 4,
        k: int = 10,
        knn_samples: int = 10_000,
        seed: int = 0,
        min_distance: float = 1e-3,
    ) -> None:
        if action_bins < 1 or k < 1 or knn_samples <= k:
            raise ValueError(
                f"need action_bins >= 1, k >= 1 and knn_samples > k; got {action_bins}, {k}, "
                f"{knn_samples}"
            )
        self.spec, self.grid = spec, grid
        self.action_bins, self.k, self.knn_samples, self.seed = action_bins, k, knn_samples, seed
        self.min_distance = float(min_distance)
        self.p = len(spec.feature_names)
        self.groups: dict[int, _Group] = {}
        self.union = _Group(knn_samples, self.p)
        self.offset = 0
        self.n_cells = math.prod(grid.cells) if grid is not None else 0
        self.reward = None
        if goal is not None:
            from myriad.datasets.relabel import NavGoalReward

            self.reward = NavGoalReward.for_spec(spec, "sparse", goal)
        self.goal = goal

    def _group(self, m: int) -> _Group:
        if m not in self.groups:
            self.groups[m] = _Group(self.knn_samples, self.p)
        return self.groups[m]

    def add(self, rows: Rows) -> None:
        """Account for one batch of rows (any chunking gives the same result)."""
        n = len(rows["rewards"])
        if n == 0:
            return
        member = rows["member"].astype(np.int64)
        index = np.arange(self.offset, self.offset + n, dtype=np.uint64)
        keys = splitmix64(index + np.uint64(self.seed))
        self.offset += n
        cell = inside = None
        if self.grid is not None:
            from myriad.entropy import cell_index

            cell_t, inside_t = cell_index(
                torch.as_tensor(rows["features"]), self.grid.low, self.grid.high, self.grid.cells
            )
            cell, inside = cell_t.numpy(), inside_t.numpy()
            bins = np.clip(
                np.floor((np.clip(rows["actions"], -1, 1) + 1) / 2 * self.action_bins),
                0,
                self.action_bins - 1,
            ).astype(np.int64)
            strides = self.action_bins ** np.arange(bins.shape[1] - 1, -1, -1, dtype=np.int64)
            pair = cell * self.action_bins ** bins.shape[1] + bins @ strides
        reached = None
        if self.reward is not None:
            _, reached = self.reward(self.reward.positions(rows["next_observations"]))
        targets = [(self._group(int(m)), member == m) for m in np.unique(member)]
        for group, sel in [*targets, (self.union, np.ones(n, bool))]:
            self._add(
                group, sel, keys, rows, cell, inside, pair if cell is not None else None, reached
            )

    def _add(
        self,
        g: _Group,
        sel: np.ndarray,
        keys: np.ndarray,
        rows: Rows,
        cell: np.ndarray | None,
        inside: np.ndarray | None,
        pair: np.ndarray | None,
        reached: np.ndarray | None,
    ) -> None:
        g.rows += int(sel.sum())
        if self.p:
            g.sample.add(keys[sel], rows["features"][sel])
        if cell is not None and inside is not None and pair is not None:
            ok = sel & inside
            if g.cells is None:
                g.cells = np.zeros(self.n_cells, bool)
            g.cells[cell[ok]] = True
            g.pairs = np.union1d(g.pairs, pair[ok])
        if reached is not None:
            g.goal += int(reached[sel].sum())

    def _result(self, g: _Group) -> dict[str, Any]:
        from myriad.entropy import kl_entropy

        out: dict[str, Any] = {}
        if self.grid is not None:
            reach = (
                self.grid.reachable.reshape(-1)
                if self.grid.reachable is not None
                else np.ones(self.n_cells, bool)
            )
            total = int(reach.sum())
            cells = g.cells if g.cells is not None else np.zeros(self.n_cells, bool)
            out["coverage"] = float((cells & reach).sum()) / total
            n_bins = self.action_bins ** int(self.spec.action_dim)
            pairs = g.pairs[reach[g.pairs // n_bins]] if len(g.pairs) else g.pairs
            out["sa_pairs"] = len(pairs)
            out["sa_coverage"] = float(len(pairs)) / (total * n_bins)
        # In key order, so the estimate does not depend on how the rows were chunked.
        points = g.sample.points[np.argsort(g.sample.keys, kind="stable")]
        out["entropy"] = (
            float(
                kl_entropy(
                    torch.as_tensor(points, dtype=torch.float64),
                    self.k,
                    min_distance=self.min_distance,
                )
            )
            if self.p and len(points) > self.k
            else None
        )
        out["entropy_samples"] = len(points)
        if self.reward is not None:
            out["goal_transitions"] = g.goal
        return out

    def result(self) -> dict[str, Any]:
        """``{"members": {m: measures}, "union": measures, "settings": {...}}``; each measures
        dict has ``coverage, sa_coverage, sa_pairs`` (with a grid), ``entropy,
        entropy_samples`` and ``goal_transitions`` (with a goal)."""
        return {
            "members": {m: self._result(g) for m, g in sorted(self.groups.items())},
            "union": self._result(self.union),
            "settings": {
                "goal": list(self.goal) if self.goal is not None else None,
                "action_bins": self.action_bins,
                "k": self.k,
                "knn_samples": self.knn_samples,
                "seed": self.seed,
                "min_distance": self.min_distance,
            },
        }


def measure_rows(
    rows: Rows,
    spec: DatasetSpec,
    goal: tuple[float, float] | None = None,
    **settings: Any,
) -> dict[str, Any]:
    """:class:`DatasetMeasures` of rows held in memory (``settings``: its keyword arguments)."""
    from myriad.datasets.inspection import env_grid

    acc = DatasetMeasures(spec, env_grid(spec), goal, **settings)
    acc.add(rows)
    return acc.result()
