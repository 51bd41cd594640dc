"""The k-NN measurement of a rollout spread over ranks (docs/algorithms.md §2-3).

The collective entropy and the K-Myriad reward of a state need its distance to its k-th
neighbour among the states of *all* members, so every rank receives every rank's entropy
features (``[T, E/R, p]`` each, small next to the observations). Each rank then searches only
for its own states' neighbours (queries of its ``N/R`` states against all ``N``; members are
whole on one rank, so the per-member search is local), and the k-th distances, ``N`` floats per
kind, are gathered so every rank computes the same entropies as one process would from the same
features. The reward of a rank's states comes from its own distances.
"""

from __future__ import annotations

import torch

from myriad.distributed.torchdist.group import RankGroup
from myriad.entropy import population_entropy_from_distances
from myriad.entropy.knn.neighbors import Neighbors, drop_self
from myriad.pretrain.objectives import (
    EntropyMeasurement,
    Measurement,
    MemberNeighbours,
    env_major,
)


class RankEntropyMeasurement(EntropyMeasurement):
    """:class:`EntropyMeasurement` of one rank.

    ``__call__`` takes the features of all ranks' envs ``[T, E, p]`` (rank order) and returns a
    :class:`Measurement` whose entropies are the whole population's and whose neighbours
    (``pooled``: rows of all ``N`` states; ``grouped``: rows of this rank's states) and
    ``reward`` ``[T, E/R]`` are those of this rank's envs. :meth:`evaluate` measures in this
    process alone, without collectives (rank 0's final evaluation).

    Args:
        ranks: the process group.
        envs: this rank's envs in the run's layout.
        k, num_members, dim, backend, min_distance: as for :class:`EntropyMeasurement`.
    """

    def __init__(
        self,
        ranks: RankGroup,
        envs: slice,
        k: int,
        num_members: int,
        dim: int,
        backend: str = "auto",
        min_distance: float = 1e-3,
    ) -> None:
        super().__init__(k, num_members, dim, backend=backend, min_distance=min_distance)
        self.ranks, self.envs = ranks, envs

    @classmethod
    def sharing(
        cls, local: EntropyMeasurement, ranks: RankGroup, envs: slice
    ) -> RankEntropyMeasurement:
        """The measurement of ``local``'s settings on this rank's ``envs``."""
        return cls(
            ranks,
            envs,
            local.k,
            local.num_members,
            local.dim,
            backend=local.search.backend,
            min_distance=local.min_distance,
        )

    def __call__(self, features: torch.Tensor, update: bool = True) -> Measurement:
        x = env_major(features)  # [E T, p]: row e T + t, so each rank's rows are contiguous
        if update:
            self.normalizer.update(x)
        self.normalizer.to(x.device)
        scaled = self.normalizer.scale(x).contiguous()
        t = features.shape[0]
        k, m, p = self.k, self.num_members, self.dim
        start, stop = self.envs.start * t, self.envs.stop * t
        own = scaled[start:stop]
        # Queried against a reference set that contains it, a state is its own nearest
        # neighbour; fetch k + 1 and drop it by index, as a self-query does.
        found = self.search(own, k + 1, reference=scaled)
        rows = torch.arange(start, stop, device=own.device)
        pooled = Neighbors(*drop_self(found.distances, found.indices, rows))
        grouped = self.search.grouped(own, k, num_groups=m // self.ranks.world_size)
        kth = torch.stack([pooled.distances[:, k - 1], grouped.distances[:, k - 1]])
        every = self.ranks.all_gather_cat(kth, dim=1)  # [2, N] in the single-process row order
        log_scale = float(torch.log(self.normalizer.std).sum())
        entropy = population_entropy_from_distances(
            every[0], every[1], p, k, num_groups=m, min_distance=self.min_distance
        )
        return Measurement(
            own,
            pooled,
            entropy.collective + log_scale,
            MemberNeighbours(grouped, entropy.individual + log_scale),
            log_scale,
            t,
            m,
            k,
            self.min_distance,
        )

    def evaluate(self, features: torch.Tensor) -> Measurement:
        """The whole population's measurement of ``features [T, E, p]`` in this process."""
        return EntropyMeasurement.__call__(self, features, update=False)
