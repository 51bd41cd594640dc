"""Selecting the leader's or the followers' rows of a minibatch without host syncs."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from myriad.finetune.losses import masked_mean
from myriad.nn.population import block_members
from myriad.rl.storage import Batch


@dataclass(frozen=True)
class Rows:
    """The rows of one role in a minibatch.

    A member-major (``blocked``) batch holds each member's rows contiguously, so a role is a
    slice (a view) or an index of rows. Any other batch keeps every row and carries a 0/1
    ``weight`` instead, because boolean indexing would read the selected count from the device.

    Attributes:
        part: the rows of the role when the batch is blocked (a slice or ``[n]`` indices), else
            None.
        weight: ``[B]`` 0/1 mask of the role's rows when it is not, else None.
    """

    part: slice | torch.Tensor | None
    weight: torch.Tensor | None

    def take(self, x: torch.Tensor) -> torch.Tensor:
        """``x [B, ...]`` restricted to the role (all rows in mask mode)."""
        if self.part is None:
            return x
        if isinstance(self.part, slice):
            return x[self.part]
        return x.index_select(0, self.part)

    def mean(self, x: torch.Tensor) -> torch.Tensor:
        """Mean of ``take``-shaped values over the role's rows (scalar)."""
        return masked_mean(x, self.weight)


def leader_rows(batch: Batch, leader: int = 0) -> Rows:
    """The rows acted by ``leader``."""
    if batch.blocked:
        n = len(batch) // batch.num_members
        return Rows(slice(leader * n, (leader + 1) * n), None)
    return Rows(None, (batch.member == leader).to(batch.obs.dtype))


def follower_rows(batch: Batch, leader: int = 0, per_follower: int | None = None) -> Rows:
    """The rows acted by every member other than ``leader``.

    With ``per_follower`` (blocked batches only), the first ``per_follower`` rows of each
    follower (:func:`sampled_follower_part`): the storage shuffles every member's rows before
    cutting minibatches, so these are a uniform random subset with an equal share of each
    follower. Other batches select all follower rows by mask.
    """
    if not batch.blocked:
        return Rows(None, (batch.member != leader).to(batch.obs.dtype))
    m = batch.num_members
    n = len(batch) // m
    if per_follower is None or per_follower >= n:
        if leader == 0:
            return Rows(slice(n, None), None)
        per_follower = n
    return Rows(sampled_follower_part(len(batch), m, leader, per_follower, batch.obs.device), None)


def sampled_follower_part(
    rows: int, num_members: int, leader: int, per_follower: int, device: torch.device
) -> torch.Tensor:
    """Positions ``[(M - 1) * per_follower]`` of the first ``per_follower`` rows of every
    follower in a member-major batch of ``rows`` rows."""
    n = rows // num_members
    members = torch.arange(num_members, device=device)
    members = members[members != leader]
    index = members.unsqueeze(1) * n + torch.arange(per_follower, device=device).unsqueeze(0)
    return index.reshape(-1)


def tile_members(x: torch.Tensor, num_members: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The same rows once per member, member-major: ``[N, ...] -> ([M * N, ...], member [M * N])``.

    Feeding the result to the model with ``blocked=True`` evaluates every member on every row in
    one batched pass.
    """
    n = x.shape[0]
    tiled = x.unsqueeze(0).expand(num_members, *x.shape).reshape(num_members * n, *x.shape[1:])
    return tiled, block_members(num_members * n, num_members, x.device)
