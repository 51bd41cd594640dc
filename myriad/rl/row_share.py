"""One process's share of an update that R processes run together on the same rollout.

Every process holds the whole rollout and draws the same minibatches (the shuffling generator is
seeded alike). Process ``r`` learns from the rows ``r, r + R, r + 2R, ...`` of every member's
block of each minibatch: a member-major minibatch of ``n`` rows per member becomes, on each
process, a member-major minibatch of ``n / R`` rows per member with every member present, so
every loss term reads the roles it reads in one process (the leader's rows, the followers'
rows) and costs ``1 / R`` of the work. The gradients are averaged over the processes before the
optimiser step (``PPO.grad_sync``); a loss that is a mean over equal shares of rows then has the
gradient of the mean over the whole minibatch. What is normalised over a minibatch or an update
(advantage moments) is normalised with moments summed over the processes
(one collective per update, :meth:`myriad.rl.ppo.PPO.update`), so the loss is the one-process
loss.

Only the collectives are given here (``all_reduce``, ``all_gather``): :mod:`myriad.rl` does not
know how the processes talk (torch.distributed ranks, docs/distributed.md).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RowShare:
    """This process's share of the rows of a split update.

    Attributes:
        rank: this process, ``0 <= rank < world_size``.
        world_size: R.
        all_reduce: sums a tensor over the processes, in place, and returns it.
        all_gather: ``all_gather(x, dim)``: every process's ``x`` (one shape on all)
            concatenated along ``dim`` in rank order.
    """

    rank: int
    world_size: int
    all_reduce: Callable[[torch.Tensor], torch.Tensor]
    all_gather: Callable[[torch.Tensor, int], torch.Tensor]

    def rows(self, index: torch.Tensor, num_members: int, blocked: bool) -> torch.Tensor:
        """This process's rows of a minibatch ``index [B]``: every ``R``-th row of each
        member's block from row ``rank`` on (blocked, ``[B / R]`` member-major), else every
        ``R``-th row."""
        if blocked:
            return index.view(num_members, -1)[:, self.rank :: self.world_size].reshape(-1)
        return index[self.rank :: self.world_size]

    def block(self, size: int) -> slice | None:
        """The ``rank``-th of R equal contiguous parts of ``size`` items; None when ``size`` does
        not split (the caller then computes the whole on every process)."""
        if size % self.world_size:
            return None
        part = size // self.world_size
        return slice(self.rank * part, (self.rank + 1) * part)

    def average_(self, tensors: Sequence[torch.Tensor]) -> None:
        """Replace every tensor by its mean over the processes (one all-reduce)."""
        if not tensors:
            return
        flat = torch.cat([t.reshape(-1) for t in tensors])
        self.all_reduce(flat).div_(self.world_size)
        for t, part in zip(tensors, flat.split([t.numel() for t in tensors])):
            t.copy_(part.view_as(t))
