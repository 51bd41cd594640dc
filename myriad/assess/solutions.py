"""Distinct solutions of a population: successful episodes grouped by the regions they cross.

An episode's *signature* is the set of regions on its loop-erased route: the regions its states
pass through, without the excursions that come back to a region already on the route (a look
into a corridor and back is not a second route). Successful episodes with
the same signature are one *solution*; a solution counts when it holds at least ``min_share`` of
all successful episodes (default :data:`DEFAULT_MIN_SHARE`), so a route taken once by accident
does not count as a way of solving the task.

Regions come from a :class:`RegionMap` over the entropy features ``[..., p]``:

- navigation layouts (:meth:`RegionMap.for_layout`): the corridors and open areas of the map.
  A *junction* is a free cell with three or more free 4-neighbours, or a start or goal cell.
  Junction cells connected to each other form one region (a crossing, a hub, a room's
  interior); the other free cells, connected to each other, form the corridors between them.
  Two routes through different corridors therefore have different signatures, while wiggles
  inside a corridor or a room do not change a signature.
- any other env (:meth:`RegionMap.grid`): a coarse grid of ``bins`` cells per feature over the
  feature bounds; a region is a grid cell.

Everything here is batched tensor code over episodes; it depends on torch and numpy only.
"""

from __future__ import annotations

import math
import string
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from myriad.envs.base import VecEnv
from myriad.envs.layout import Layout

#: Default smallest share of the successful episodes a solution must hold to count.
DEFAULT_MIN_SHARE = 0.05
#: Default grid resolution per feature of :meth:`RegionMap.grid`.
DEFAULT_GRID_BINS = 4
# Cell ids of the generic grid are int64 mixed-radix numbers; stay clear of the sign bit.
_MAX_GRID_CELLS = 2**62


def layout_regions(layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """Regions of a navigation layout (module docstring), text orientation.

    Returns:
        ``(region [H, W] int64, junction [R] bool)``: the region of every cell (-1 for walls)
        and whether each region is made of junction cells (hubs, crossings, rooms, the start
        and goal cells) rather than a corridor. Regions are numbered in reading order of their
        first cell.
    """
    free = ~layout.walls
    padded = np.pad(free, 1, constant_values=False)
    neighbours = (
        padded[:-2, 1:-1].astype(int) + padded[2:, 1:-1] + padded[1:-1, :-2] + padded[1:-1, 2:]
    )
    junction_cell = free & (neighbours >= 3)
    for r, c in (*layout.starts, *layout.goals):
        junction_cell[r, c] = True
    region = np.full(free.shape, -1, dtype=np.int64)
    kinds: list[bool] = []
    height, width = free.shape
    for r0 in range(height):
        for c0 in range(width):
            if not free[r0, c0] or region[r0, c0] >= 0:
                continue
            kind = bool(junction_cell[r0, c0])
            label = len(kinds)
            kinds.append(kind)
            region[r0, c0] = label
            stack = [(r0, c0)]
            while stack:  # flood fill over cells of the same kind (set-up, once per layout)
                r, c = stack.pop()
                for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
                    if (
                        0 <= nr < height
                        and 0 <= nc < width
                        and free[nr, nc]
                        and region[nr, nc] < 0
                        and junction_cell[nr, nc] == kind
                    ):
                        region[nr, nc] = label
                        stack.append((nr, nc))
    return region, np.array(kinds, dtype=bool)


class RegionMap:
    """Maps entropy features ``[..., p]`` to region ids ``[...]`` (int64, -1 outside every
    region) through a grid of ``cells`` over ``[low, high]``.

    Args:
        low, high: feature bounds ``[p]``.
        cells: grid cells per feature.
        table: region of every grid cell, flattened in mixed radix with the first feature
            slowest (``[prod(cells)]`` int64), or None when the grid cell is the region.
        junction: ``[R]`` bool, regions that are junctions (navigation layouts only).
        layout: the navigation layout the map was built from, if any.
    """

    def __init__(
        self,
        low: tuple[float, ...],
        high: tuple[float, ...],
        cells: tuple[int, ...],
        table: torch.Tensor | None = None,
        junction: np.ndarray | None = None,
        layout: Layout | None = None,
    ) -> None:
        if not (len(low) == len(high) == len(cells)) or any(n < 1 for n in cells):
            raise ValueError(f"need one bound pair and a cell count >= 1 per feature: {cells}")
        if math.prod(cells) >= _MAX_GRID_CELLS:
            raise ValueError(
                f"a grid of {cells} cells is too large for int64 cell ids; use fewer bins per "
                "feature (eval.solution_bins)"
            )
        self.low = torch.tensor(low, dtype=torch.float64)
        self.high = torch.tensor(high, dtype=torch.float64)
        self.cells = tuple(int(n) for n in cells)
        # Mixed-radix weights: the first feature varies slowest.
        weights = [math.prod(self.cells[i + 1 :]) for i in range(len(self.cells))]
        self.weights = torch.tensor(weights, dtype=torch.long)
        self.table = table
        self.junction = junction
        self.layout = layout

    @classmethod
    def for_layout(cls, layout: Layout) -> RegionMap:
        """Corridor and junction regions of a navigation layout, over world ``(x, y)``."""
        region, junction = layout_regions(layout)
        world = np.ascontiguousarray(region[::-1].T)  # [W, H], indexed [ix, iy]
        return cls(
            (0.0, 0.0),
            (float(layout.width), float(layout.height)),
            (layout.width, layout.height),
            torch.as_tensor(world.reshape(-1)),
            junction,
            layout,
        )

    @classmethod
    def grid(cls, low: tuple[float, ...], high: tuple[float, ...], bins: int) -> RegionMap:
        """A coarse grid of ``bins`` cells per feature over ``[low, high]``."""
        if bins < 1:
            raise ValueError(f"bins must be >= 1, got {bins}")
        return cls(tuple(low), tuple(high), (int(bins),) * len(low))

    @classmethod
    def for_env(cls, env: VecEnv, bins: int = DEFAULT_GRID_BINS) -> RegionMap:
        """The layout's regions for a navigation env (its ``layout`` a nav
        :class:`~myriad.envs.layout.Layout`), else a coarse grid of ``bins`` cells per feature
        over the env's feature bounds."""
        if isinstance(env.layout, Layout):
            return cls.for_layout(env.layout)
        return cls.grid(env.features.low, env.features.high, bins)

    @property
    def num_regions(self) -> int:
        """Number of region ids (grid cells when the cell is the region)."""
        if self.table is None:
            return math.prod(self.cells)
        return int(self.table.max()) + 1 if self.table.numel() else 0

    def _cell_index(self, features: torch.Tensor) -> torch.Tensor:
        """Grid cell of ``features [..., p]`` per feature, ``[..., p]`` long (clamped)."""
        device = features.device
        low, high = self.low.to(device), self.high.to(device)
        cells = torch.tensor(self.cells, dtype=torch.float64, device=device)
        scaled = (features.to(torch.float64) - low) / (high - low) * cells
        return torch.minimum(scaled.floor().long().clamp(min=0), cells.long() - 1)

    def _region_of_cells(self, index: torch.Tensor) -> torch.Tensor:
        flat = (index * self.weights.to(index.device)).sum(dim=-1)
        if self.table is None:
            return flat
        return self.table.to(index.device)[flat]

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        """Region ids ``[...]`` of ``features [..., p]`` (states outside the bounds are clamped
        to the border cells)."""
        return self._region_of_cells(self._cell_index(features))

    def route_states(
        self, features: torch.Tensor, valid: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Region ids of the states of trajectories, with the cells passed between two states.

        A point mass that moves diagonally past a corner goes from one cell to its diagonal
        neighbour through one of the two cells beside both, and no recorded state lies in it;
        when that cell is a one-cell junction (a start hub), the route would seem to jump from
        one corridor straight into another. On a layout, a state is inserted after every
        diagonal step: the region of the free one of the two cells (the first when both are
        free). Plain grids (no layout) get no insertions.

        Args:
            features: ``[N, T, p]`` states of N trajectories.
            valid: ``[N, T]`` bool, states inside each trajectory.

        Returns:
            ``(region_ids [N, T'], valid [N, T'])`` with ``T' = 2T - 1`` on a layout (a slot
            after every state, -1 where nothing was passed), else ``T`` (the states' regions).
        """
        index = self._cell_index(features)
        region = self._region_of_cells(index)
        if self.table is None or features.shape[1] < 2:
            return region, valid
        step = index[:, 1:] - index[:, :-1]  # [N, T - 1, 2]
        diagonal = (step.abs() == 1).all(dim=-1) & valid[:, 1:] & valid[:, :-1]
        beside_x = torch.stack([index[:, 1:, 0], index[:, :-1, 1]], dim=-1)
        beside_y = torch.stack([index[:, :-1, 0], index[:, 1:, 1]], dim=-1)
        region_x, region_y = self._region_of_cells(beside_x), self._region_of_cells(beside_y)
        passed = torch.where(region_x >= 0, region_x, region_y)
        passed = torch.where(diagonal, passed, torch.full_like(passed, -1))
        n, t = region.shape
        slots = torch.stack([region[:, :-1], passed], dim=2).reshape(n, 2 * t - 2)
        ids = torch.cat([slots, region[:, -1:]], dim=1)
        kept = torch.stack([valid[:, :-1], diagonal], dim=2).reshape(n, 2 * t - 2)
        return ids, torch.cat([kept, valid[:, -1:]], dim=1)


@dataclass
class Solutions:
    """Successful episodes grouped by signature; clusters sorted by size, largest first.

    Attributes:
        count: distinct solutions: clusters holding at least ``min_share`` of the successes.
        num_successes: successful episodes S.
        min_share: the share rule used.
        regions: ``[R']`` region ids of the signature columns (the regions any episode
            visited).
        signatures: ``[C, R']`` bool, the regions of each cluster.
        sizes: ``[C]`` successful episodes per cluster.
        counted: ``[C]`` bool, the cluster holds at least ``min_share`` of the successes.
        episode_cluster: ``[N]`` cluster of every episode (-1: not successful).
    """

    count: int
    num_successes: int
    min_share: float
    regions: torch.Tensor
    signatures: torch.Tensor
    sizes: torch.Tensor
    counted: torch.Tensor
    episode_cluster: torch.Tensor

    @property
    def labels(self) -> list[str]:
        """Display names of the clusters: ``A``, ``B``, ... by size (numbers beyond 26)."""
        letters = string.ascii_uppercase
        return [letters[i] if i < len(letters) else str(i) for i in range(len(self.sizes))]

    def member_routes(self, member: torch.Tensor, num_members: int) -> torch.Tensor:
        """Each member's most frequent cluster among its successful episodes, ``[M]`` long
        (-1: the member never succeeded; ties go to the larger cluster).

        Args:
            member: ``[N]`` member of every episode.
            num_members: M.
        """
        num_clusters = len(self.sizes)
        if num_clusters == 0:
            return torch.full((num_members,), -1, dtype=torch.long)
        member = member.to(self.episode_cluster.device)
        ok = self.episode_cluster >= 0
        counts = torch.zeros(num_members, num_clusters, dtype=torch.long)
        flat = member[ok] * num_clusters + self.episode_cluster[ok]
        counts.view(-1).index_add_(0, flat, torch.ones_like(flat))
        best = counts.argmax(dim=1)  # first maximum: clusters are sorted largest first
        return torch.where(counts.sum(dim=1) > 0, best, torch.full_like(best, -1))

    def to_dict(self, region_names: list[str] | None = None) -> dict[str, Any]:
        """Plain summary: the count, the rule and every cluster (label, episodes, share,
        counted, regions)."""
        clusters = []
        for k, label in enumerate(self.labels):
            ids = self.regions[self.signatures[k]].tolist()
            clusters.append(
                {
                    "label": label,
                    "episodes": int(self.sizes[k]),
                    "share": float(self.sizes[k]) / max(self.num_successes, 1),
                    "counted": bool(self.counted[k]),
                    "regions": [region_names[i] for i in ids] if region_names else ids,
                }
            )
        return {
            "count": self.count,
            "num_successes": self.num_successes,
            "min_share": self.min_share,
            "clusters": clusters,
        }


def episode_signatures(
    region_ids: torch.Tensor, valid: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The regions of each episode's loop-erased route.

    Loop erasure drops every excursion that comes back to a region already on the route (a look
    into a corridor and back, a dead end, a circle in a room): the route starts at the first
    state's region and continues at the state after the *last* visit of the current region, until
    the episode ends. This is the chronological loop erasure of the sequence of regions, computed
    for all episodes at once; the loop runs over route steps (at most the number of distinct
    regions), each a batched gather over the episodes.

    Args:
        region_ids: ``[N, T]`` region of every state of every episode (-1: no region).
        valid: ``[N, T]`` bool, the states that belong to the episode.

    Returns:
        ``(on_route [N, R'] bool, regions [R'] long)``: column j is region ``regions[j]``;
        only regions some episode visited get a column.
    """
    n, t = region_ids.shape
    device = region_ids.device
    keep = valid & (region_ids >= 0)
    regions, column = torch.unique(region_ids[keep], return_inverse=True)
    r = len(regions)
    # Column of every kept state; r (a spare column) elsewhere.
    col = torch.full((n, t), r, dtype=torch.long, device=device)
    col[keep] = column
    steps = torch.arange(t, device=device).expand(n, t)
    last = torch.full((n, r + 1), -1, dtype=torch.long, device=device)
    last.scatter_reduce_(1, col, torch.where(keep, steps, -1), reduce="amax")
    # next_kept[:, i]: the first kept state at or after i (t: none), by a reversed running min.
    ahead = torch.where(keep, steps, t).flip(1).cummin(dim=1).values.flip(1)
    next_kept = torch.cat([ahead, torch.full((n, 1), t, device=device)], dim=1)
    rows = torch.arange(n, device=device)
    current = next_kept[:, 0]
    on_route = torch.zeros(n, r + 1, dtype=torch.bool, device=device)
    active = current < t
    while bool(active.any()):
        region = col[rows, current.clamp(max=t - 1)]
        on_route[rows[active], region[active]] = True
        after = (last[rows, region] + 1).clamp(max=t)
        current = torch.where(active, next_kept[rows, after], current)
        active = active & (current < t)
    return on_route[:, :r], regions


def distinct_solutions(
    region_ids: torch.Tensor,
    valid: torch.Tensor,
    success: torch.Tensor | None = None,
    min_share: float = DEFAULT_MIN_SHARE,
) -> Solutions:
    """Cluster successful episodes by signature and count the clusters above ``min_share``.

    Args:
        region_ids: ``[N, T]`` region of every state (see :class:`RegionMap`).
        valid: ``[N, T]`` bool, states inside each episode.
        success: ``[N]`` bool, successful episodes; None counts every episode (envs without a
            success flag: the metric then counts distinct behaviours).
        min_share: a cluster counts when it holds at least this share of the successful
            episodes, in ``[0, 1]``.
    """
    if not 0.0 <= min_share <= 1.0:
        raise ValueError(f"min_share must be in [0, 1], got {min_share}")
    region_ids, valid = region_ids.cpu(), valid.cpu()
    n = region_ids.shape[0]
    success = torch.ones(n, dtype=torch.bool) if success is None else success.cpu().bool()
    visited, regions = episode_signatures(region_ids, valid)
    chosen = visited[success]
    episode_cluster = torch.full((n,), -1, dtype=torch.long)
    if len(chosen) == 0:
        empty = torch.zeros(0, len(regions), dtype=torch.bool)
        none = torch.zeros(0, dtype=torch.long)
        return Solutions(0, 0, min_share, regions, empty, none, none.bool(), episode_cluster)
    signatures, inverse, sizes = torch.unique(
        chosen, dim=0, return_inverse=True, return_counts=True
    )
    order = torch.argsort(sizes, descending=True, stable=True)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order))
    signatures, sizes = signatures[order], sizes[order]
    episode_cluster[success] = rank[inverse]
    num_successes = len(chosen)
    # Integer comparison of size / S >= share, so a share that is exactly reached counts.
    counted = sizes.double() >= min_share * num_successes - 1e-9
    return Solutions(
        int(counted.sum()),
        num_successes,
        min_share,
        regions,
        signatures,
        sizes,
        counted,
        episode_cluster,
    )


def exclusive_regions(solutions: Solutions, cluster: int, regions: RegionMap) -> list[int]:
    """Corridor regions of ``cluster``'s signature that no other counted cluster visits: what
    to block to close that route and no other. When every corridor of the route is shared, all
    of them. Junction regions (hubs, rooms, start and goal cells) are never returned."""
    if regions.junction is None:
        raise ValueError("exclusive regions need a navigation layout's region map")
    own = solutions.signatures[cluster]
    others = solutions.counted.clone()
    others[cluster] = False
    used_elsewhere = solutions.signatures[others].any(dim=0)
    corridor = ~torch.as_tensor(regions.junction)[solutions.regions]
    exclusive = own & corridor & ~used_elsewhere
    if not bool(exclusive.any()):
        exclusive = own & corridor
    return solutions.regions[exclusive].tolist()


def blocked_layout(layout: Layout, region_grid: np.ndarray, blocked: list[int]) -> Layout:
    """``layout`` with every cell of the ``blocked`` regions turned into a wall.

    Args:
        layout: the layout.
        region_grid: ``[H, W]`` region of every cell (:func:`layout_regions`).
        blocked: region ids to wall off.

    Raises:
        myriad.envs.layout.LayoutError: the goal cell can no longer be reached.
    """
    walls = layout.walls | np.isin(region_grid, np.asarray(blocked, dtype=np.int64))
    rows = [
        ["#" if walls[r, c] else "." for c in range(layout.width)] for r in range(layout.height)
    ]
    for r, c in layout.starts:
        rows[r][c] = "S"
    for r, c in layout.goals:
        rows[r][c] = "G"
    return Layout.from_text("\n".join("".join(row) for row in rows), name=f"{layout.name}-blocked")
