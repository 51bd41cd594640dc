"""Where each group's points are: the layout shared by per-group search, the population
entropy estimators and coverage.

Groups are given either by ``group [N]`` (int ids in ``0..M-1``, any order and any sizes) or by
``num_groups = M`` equal contiguous blocks (the population layout: member ``i`` owns rows
``i * N/M .. (i+1) * N/M - 1``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from myriad.entropy.knn.neighbors import Neighbors


@dataclass(frozen=True)
class GroupLayout:
    """Where each group's points are: sorted order, group starts and sizes.

    Attributes:
        num_groups: M.
        sizes: ``[M]`` int64 points per group, on the CPU.
        starts: ``[M]`` int64 offset of each group in group-sorted order, on the CPU.
        order: ``[N]`` rows sorted by group (stable); None for equal blocks (already sorted).
        group: ``[N]`` int64 group id of each row on the points' device; None for equal blocks.
        n: number of points N.
        device: the points' device.
    """

    num_groups: int
    sizes: torch.Tensor
    starts: torch.Tensor
    order: torch.Tensor | None
    group: torch.Tensor | None
    n: int
    device: torch.device

    @property
    def equal_blocks(self) -> bool:
        return self.group is None

    @property
    def min_size(self) -> int:
        return int(self.sizes.min())

    @property
    def max_size(self) -> int:
        return int(self.sizes.max())

    @staticmethod
    def build(x: torch.Tensor, group: torch.Tensor | None, num_groups: int | None) -> GroupLayout:
        """Check the groups of the ``N`` rows of ``x`` (any tensor with one row per point) and
        describe them; raises ``ValueError`` with the fix for missing, malformed or empty
        groups."""
        n = x.shape[0]
        if group is None:
            if num_groups is None:
                raise ValueError(
                    "pass group=[N] group ids or num_groups=M (equal contiguous blocks)"
                )
            if not isinstance(num_groups, int) or num_groups < 1:
                raise ValueError(f"num_groups must be a positive int, got {num_groups!r}")
            if n % num_groups != 0:
                raise ValueError(
                    f"{n} points do not split into {num_groups} equal blocks; "
                    "pass group=[N] ids for unequal groups"
                )
            size = n // num_groups
            if size == 0:
                raise ValueError(
                    f"num_groups={num_groups} exceeds the {n} points: groups would be empty; "
                    f"use num_groups <= {n}"
                )
            sizes = torch.full((num_groups,), size, dtype=torch.int64)
            starts = torch.arange(num_groups, dtype=torch.int64) * size
            return GroupLayout(num_groups, sizes, starts, None, None, n, x.device)
        if not isinstance(group, torch.Tensor) or group.dim() != 1 or group.shape[0] != n:
            raise ValueError(f"group must be a 1-D tensor of {n} group ids (one per point)")
        if group.device != x.device:
            raise ValueError(
                f"x is on {x.device} but group is on {group.device}; "
                "move both to one device with .to(device)"
            )
        if group.is_floating_point() or group.dtype == torch.bool:
            raise ValueError(f"group must hold integer ids, got {group.dtype}; use group.long()")
        group = group.long()
        if n == 0:
            raise ValueError("no points given; pass x with at least one row [N >= 1, p]")
        lo, hi = int(group.min()), int(group.max())
        if lo < 0:
            raise ValueError(f"group ids must be >= 0, got {lo}; number the groups 0..M-1")
        m = hi + 1 if num_groups is None else num_groups
        if hi >= m:
            raise ValueError(f"group id {hi} >= num_groups={m}; ids must lie in 0..num_groups-1")
        sizes = torch.bincount(group, minlength=m).cpu()
        if bool((sizes == 0).any()):
            empty = torch.nonzero(sizes == 0).flatten()[:5].tolist()
            raise ValueError(
                f"groups {empty} have no points; renumber group ids to 0..M-1 without gaps "
                "or drop the empty groups"
            )
        starts = torch.cumsum(sizes, 0) - sizes
        order = torch.argsort(group, stable=True)
        return GroupLayout(m, sizes, starts, order, group, n, x.device)

    def group_ids(self) -> torch.Tensor:
        """``[N]`` group id of each row of x."""
        if self.group is not None:
            return self.group
        size = self.n // self.num_groups
        return torch.arange(self.n, device=self.device) // size

    def position_in_group(self) -> torch.Tensor:
        """``[N]`` rank of each row of x within its group (in row order)."""
        if self.group is None:
            size = self.n // self.num_groups
            return torch.arange(self.n, device=self.device) % size
        pos_sorted = (
            torch.arange(self.n, device=self.device)
            - self.starts.to(self.device)[self.group[self.order]]
        )
        pos = torch.empty_like(pos_sorted)
        pos[self.order] = pos_sorted
        return pos

    def sort(self, x: torch.Tensor) -> torch.Tensor:
        """Rows of ``x [N, ...]`` in group-sorted order (group ``g`` at ``starts[g]``)."""
        return x[self.order] if self.order is not None else x

    def unsort(self, dist: torch.Tensor, idx_sorted: torch.Tensor) -> Neighbors:
        """Results computed in sorted order -> rows of x, indices -> rows of x."""
        if self.order is None:
            return Neighbors(dist, idx_sorted)
        order = self.order
        out_d = torch.empty_like(dist)
        out_i = torch.empty_like(idx_sorted)
        out_d[order] = dist
        out_i[order] = order[idx_sorted]
        return Neighbors(out_d, out_i)
