"""Grid coverage (docs/algorithms.md §10): the fraction of reachable cells visited at least once.

A fixed grid of ``cells[d]`` equal bins per dimension covers the declared feature bounds
``[low, high]`` (closed: a point exactly on ``high`` falls in the last bin). Points outside the
bounds are not counted. Per-group and union coverage come from one pass: each in-bounds point
becomes the key ``group * n_cells + cell``, and ``torch.unique`` + ``bincount`` count distinct
visited cells per group, so memory stays ``O(N)`` whatever the grid or population size.

:func:`coverage` measures one batch of states; :class:`CoverageTracker` measures each rollout
of a run and remembers every cell visited so far (the cumulative coverage).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from myriad.entropy.knn import GroupLayout, check_points
from myriad.utils.tensors import resolve_device


@dataclass(frozen=True)
class Coverage:
    """Visited fraction of the reachable cells.

    Attributes:
        union: fraction visited by any group (a float in ``[0, 1]``).
        per_group: ``[M]`` float64 fraction visited by each group.
        union_cells: number of reachable cells visited by any group.
        per_group_cells: ``[M]`` int64 number of reachable cells visited by each group.
        reachable_cells: number of reachable cells (the denominator).
    """

    union: float
    per_group: torch.Tensor
    union_cells: int
    per_group_cells: torch.Tensor
    reachable_cells: int


def _bounds(
    value: torch.Tensor | Sequence[float], name: str, p: int, device: torch.device
) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.device != device:
            raise ValueError(
                f"points are on {device} but {name} is on {value.device}; "
                "move both to one device with .to(device)"
            )
        t = value.to(torch.float64)
    else:
        t = torch.as_tensor(value, dtype=torch.float64, device=device)
    if t.shape != (p,):
        raise ValueError(
            f"{name} must have shape [{p}] (one bound per feature), got {tuple(t.shape)}"
        )
    if not bool(torch.isfinite(t).all()):
        raise ValueError(
            f"{name} must be finite, got {t.tolist()}; give the bounds of the region to grid "
            "(e.g. the env's features.low / features.high)"
        )
    return t


def _cells(cells: int | Sequence[int], p: int) -> tuple[int, ...]:
    shape = (int(cells),) * p if isinstance(cells, int) else tuple(int(c) for c in cells)
    if len(shape) != p or any(c < 1 for c in shape):
        raise ValueError(f"cells must be a positive int or {p} positive ints, got {cells!r}")
    return shape


def cell_index(
    points: torch.Tensor,
    low: torch.Tensor | Sequence[float],
    high: torch.Tensor | Sequence[float],
    cells: int | Sequence[int],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-major flat cell index of each point and whether it lies inside the bounds.

    Args:
        points: ``[N, p]``.
        low: ``[p]`` lower bounds.
        high: ``[p]`` upper bounds (``> low``).
        cells: bins per dimension (int, or p ints).

    Returns:
        ``(cell [N] int64, inside [N] bool)``; ``cell`` is meaningful where ``inside``, and
        indexes ``reachable.flatten()`` for a grid of shape ``cells``.
    """
    check_points(points, "points")
    p = points.shape[1]
    lo = _bounds(low, "low", p, points.device)
    hi = _bounds(high, "high", p, points.device)
    if bool((hi <= lo).any()):
        raise ValueError(
            f"high must exceed low in every dimension, got low={lo.tolist()} high={hi.tolist()}"
        )
    shape = _cells(cells, p)
    if math.prod(shape) >= 2**62:
        raise ValueError(
            f"a grid of {' x '.join(map(str, shape))} cells overflows int64 cell indices; "
            "use fewer cells per dimension"
        )
    counts = torch.tensor(shape, dtype=torch.int64, device=points.device)
    x = points.to(torch.float64)
    inside = ((x >= lo) & (x <= hi)).all(dim=1)
    frac = (x - lo) / (hi - lo)
    ijk = torch.floor(frac * counts.to(torch.float64)).to(torch.int64)
    ijk = torch.minimum(ijk.clamp_min(0), counts - 1)
    strides = [math.prod(shape[d + 1 :]) for d in range(p)]
    flat = (ijk * torch.tensor(strides, dtype=torch.int64, device=points.device)).sum(dim=1)
    return flat, inside


def coverage(
    points: torch.Tensor,
    low: torch.Tensor | Sequence[float],
    high: torch.Tensor | Sequence[float],
    cells: int | Sequence[int],
    group: torch.Tensor | None = None,
    *,
    num_groups: int | None = None,
    reachable: torch.Tensor | None = None,
) -> Coverage:
    """Fraction of reachable grid cells visited at least once, per group and for the union.

    Args:
        points: visited feature vectors ``[N, p]``.
        low: ``[p]`` lower bounds of the grid.
        high: ``[p]`` upper bounds of the grid.
        cells: bins per dimension (int, or p ints).
        group: ``[N]`` group (member) id of each point; None with ``num_groups`` for equal
            contiguous blocks; both None for a single group.
        num_groups: number of groups M.
        reachable: optional bool grid of shape ``cells`` (all True when None); only reachable
            cells count, in the numerator and the denominator.

    Returns:
        :class:`Coverage`.
    """
    flat, inside = cell_index(points, low, high, cells)
    shape = _cells(cells, points.shape[1])
    n_cells = math.prod(shape)
    if group is None and num_groups is None:
        num_groups = 1
    layout = GroupLayout.build(points, group, num_groups)
    m = layout.num_groups
    if n_cells * m >= 2**62:
        raise ValueError(
            f"a grid of {n_cells} cells for {m} groups overflows int64 keys; use fewer cells"
        )
    device = points.device
    if reachable is None:
        reach_flat = None
        n_reachable = n_cells
    else:
        if not isinstance(reachable, torch.Tensor) or reachable.dtype != torch.bool:
            raise ValueError("reachable must be a bool tensor of shape cells")
        if tuple(reachable.shape) != shape:
            raise ValueError(f"reachable has shape {tuple(reachable.shape)}, expected {shape}")
        if reachable.device != device:
            raise ValueError(
                f"points are on {device} but reachable is on {reachable.device}; "
                "move both to one device with .to(device)"
            )
        reach_flat = reachable.reshape(-1)
        n_reachable = int(reach_flat.sum())
        if n_reachable == 0:
            raise ValueError(
                "reachable marks no cell as reachable, so coverage would be 0/0; pass a mask "
                "with at least one True cell, or reachable=None to count every cell"
            )
    gid = layout.group_ids()[inside]
    keys = torch.unique(gid * n_cells + flat[inside])
    key_cell = keys % n_cells
    key_group = keys // n_cells
    union_cells_t = torch.unique(key_cell)
    if reach_flat is not None:
        key_group = key_group[reach_flat[key_cell]]
        union_cells_t = union_cells_t[reach_flat[union_cells_t]]
    per_group_cells = torch.bincount(key_group, minlength=m)
    union_cells = int(union_cells_t.numel())
    return Coverage(
        union=union_cells / n_reachable,
        per_group=per_group_cells.to(torch.float64) / n_reachable,
        union_cells=union_cells,
        per_group_cells=per_group_cells,
        reachable_cells=n_reachable,
    )


class CoverageGrid(Protocol):
    """What :class:`CoverageTracker` reads from a feature description
    (``myriad.envs.base.FeatureSpec`` is one)."""

    @property
    def dim(self) -> int:
        """Feature dimension p."""
        ...

    @property
    def cells(self) -> tuple[int, ...]:
        """Bins per dimension; ``()`` when the features have no coverage grid."""
        ...

    @property
    def reachable(self) -> np.ndarray | None:
        """Bool grid of shape ``cells``, True where a state can be; None: every cell."""
        ...

    def bounds(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """``(low [p], high [p])`` on ``device``."""
        ...


class CoverageTracker:
    """Coverage of each rollout and of everything visited since the start, per member and for
    the union, on a feature grid (docs/algorithms.md §10).

    State: ``visited``, a ``[M, n_cells]`` bool tensor on ``device`` whose entry ``[i, c]`` is
    True once member ``i`` has visited the cell with row-major flat index ``c`` (the index of
    :func:`cell_index`), ``n_cells = prod(grid.cells)``; ``[M, 1]`` and never set when the grid
    has no cells. ``state_dict()`` is ``{"visited": that tensor on the CPU}``, the layout
    pretraining checkpoints have always stored (under ``"progress"``).

    Args:
        grid: the features' grid: ``cells``, ``reachable`` and ``bounds`` (a ``FeatureSpec``).
        num_members: M.
        device: where the features arrive and ``visited`` lives.
    """

    def __init__(
        self, grid: CoverageGrid, num_members: int, device: torch.device | str = "cpu"
    ) -> None:
        self.grid = grid
        self.num_members = int(num_members)
        self.device = resolve_device(device)
        self.cells = tuple(int(c) for c in grid.cells)
        # A copy: the grid of a remote env arrives as a read-only array.
        self.reachable = (
            torch.tensor(grid.reachable, dtype=torch.bool, device=self.device)
            if grid.reachable is not None
            else None
        )
        self.visited = torch.zeros(
            self.num_members,
            math.prod(self.cells) if self.cells else 1,
            dtype=torch.bool,
            device=self.device,
        )

    def coverage(self, points: torch.Tensor, member: torch.Tensor) -> Coverage:
        """Coverage of ``points [N, p]`` visited by ``member [N]`` (state unchanged)."""
        if not self.cells:
            raise ValueError(
                "the features have no coverage grid (cells=()); give their FeatureSpec cells "
                "to measure coverage"
            )
        low, high = self.grid.bounds(points.device)
        return coverage(
            points,
            low,
            high,
            self.cells,
            member,
            num_groups=self.num_members,
            reachable=self.reachable,
        )

    def update(self, features: torch.Tensor, member: torch.Tensor) -> dict[str, float]:
        """Record a rollout and return its scalars.

        Args:
            features: ``[T, E, p]`` features of the states reached.
            member: ``[E]`` member of each env.

        Returns:
            ``coverage/member_<i>`` (this rollout, member i), ``coverage/union`` (this rollout,
            all members), ``coverage/member_mean`` and ``coverage/cumulative_union`` (every cell
            any member has visited since the start); ``{}`` when the grid has no cells.
        """
        if not self.cells:
            return {}
        flat = features.reshape(-1, features.shape[-1])
        rows_member = member.expand(features.shape[0], -1).reshape(-1)
        cov = self.coverage(flat, rows_member)
        low, high = self.grid.bounds(flat.device)
        cell, inside = cell_index(flat, low, high, self.cells)
        self.visited[rows_member[inside], cell[inside]] = True
        union_visited = self.visited.any(dim=0)
        if self.reachable is not None:
            reach = self.reachable.reshape(-1)
            cumulative = float((union_visited & reach).sum()) / cov.reachable_cells
        else:
            cumulative = float(union_visited.float().mean())
        out = {f"coverage/member_{i}": float(c) for i, c in enumerate(cov.per_group.tolist())}
        out["coverage/union"] = float(cov.union)
        out["coverage/member_mean"] = float(cov.per_group.mean())
        out["coverage/cumulative_union"] = cumulative
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        """``{"visited": [M, n_cells] bool}`` on the CPU."""
        return {"visited": self.visited.detach().cpu().clone()}

    def load_state_dict(self, state: Mapping[str, torch.Tensor]) -> None:
        """Restore ``visited`` from :meth:`state_dict` (or an older checkpoint's
        ``"progress"`` entry, which has the same layout)."""
        visited = state["visited"]
        if tuple(visited.shape) != tuple(self.visited.shape):
            raise ValueError(
                f"checkpoint coverage state has shape {tuple(visited.shape)}, expected "
                f"{tuple(self.visited.shape)} ([members, grid cells]); resume with the same "
                "env and population.size"
            )
        self.visited.copy_(visited)
