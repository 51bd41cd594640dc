"""Per-state intrinsic reward (docs/algorithms.md §3) from k-NN distances.

``r(x) = (1 - beta) log(c + R_k(x; X_i)) + beta log(c + R_k(x; X))`` with ``R_k(x; X)`` the
distance from ``x`` to its k-th neighbour in the pooled batch and ``R_k(x; X_i)`` within its own
member's states. ``c > 0`` keeps the log finite for duplicate states, so no distance floor is
needed. :func:`knn_reward_from_distances` is the formula on neighbours already found (what
pretraining calls), :func:`knn_reward` searches first, :class:`KNNReward` adds running feature
scaling.
"""

from __future__ import annotations

import torch
from torch import nn

from myriad.entropy.knn import KNNSearch
from myriad.utils.running_stats import RunningMeanStd


def _check_reward_parameters(beta: float, c: float) -> None:
    if not 0.0 <= beta <= 1.0:
        raise ValueError(f"beta must lie in [0, 1], got {beta}")
    if not c > 0:
        raise ValueError(f"c must be > 0 (it keeps log(c + R) finite for duplicates), got {c}")


def knn_reward_from_distances(
    collective_kth: torch.Tensor | None,
    individual_kth: torch.Tensor | None,
    beta: float = 1.0,
    c: float = 1.0,
) -> torch.Tensor:
    """Per-state intrinsic reward of docs/algorithms.md §3 from k-th neighbour distances.

    ``r(x) = (1 - beta) log(c + R_k(x; X_i)) + beta log(c + R_k(x; X))``.

    Args:
        collective_kth: ``[N]`` distance to the k-th neighbour in the pooled set; may be None
            at ``beta = 0``.
        individual_kth: ``[N]`` the same within the state's own member; may be None at
            ``beta = 1``.
        beta: 1 collective (K-Myriad), 0 independent explorers.
        c: offset inside the log, ``> 0``.

    Returns:
        ``[N]`` float32 rewards on the distances' device.
    """
    _check_reward_parameters(beta, c)
    # (weight, k-th distances) of each term with a non-zero weight: 0 <= beta <= 1 leaves one.
    terms: list[tuple[float, torch.Tensor]] = []
    if beta > 0:
        if collective_kth is None:
            raise ValueError(f"beta={beta} > 0 weighs the pooled term: pass collective_kth")
        terms.append((beta, collective_kth))
    if beta < 1:
        if individual_kth is None:
            raise ValueError(f"beta={beta} < 1 weighs the per-member term: pass individual_kth")
        terms.append((1.0 - beta, individual_kth))
    like = collective_kth if collective_kth is not None else terms[0][1]
    reward = torch.zeros(like.shape[0], dtype=torch.float32, device=like.device)
    for weight, kth in terms:
        reward += weight * torch.log(c + kth)
    return reward


def knn_reward(
    x: torch.Tensor,
    k: int = 10,
    group: torch.Tensor | None = None,
    *,
    num_groups: int | None = None,
    beta: float = 1.0,
    c: float = 1.0,
    search: KNNSearch | None = None,
) -> torch.Tensor:
    """Per-state intrinsic reward of docs/algorithms.md §3 for a pooled batch.

    ``r(x) = (1 - beta) log(c + R_k(x; X_i)) + beta log(c + R_k(x; X))``: one kNN query on the
    pooled set (skipped at ``beta = 0``) and one per-group query for all members at once
    (skipped at ``beta = 1``), then :func:`knn_reward_from_distances`.

    Args:
        x: entropy features ``[N, p]`` (already normalised; see :class:`KNNReward`).
        k: neighbour rank.
        group: ``[N]`` member ids, or None with ``num_groups`` equal contiguous blocks.
        num_groups: number of members M.
        beta: 1 collective (K-Myriad), 0 independent explorers.
        c: offset inside the log, ``> 0``.
        search: kNN configuration.

    Returns:
        ``[N]`` float32 rewards on ``x``'s device.
    """
    _check_reward_parameters(beta, c)
    search = search or KNNSearch()
    r_coll = r_ind = None
    if beta > 0:
        r_coll = search(x, k).distances[:, k - 1]
    if beta < 1:
        if group is None and num_groups is None:
            raise ValueError("beta < 1 needs the members: pass group=[N] or num_groups=M")
        r_ind = search.grouped(x, k, group, num_groups=num_groups).distances[:, k - 1]
    return knn_reward_from_distances(r_coll, r_ind, beta, c)


class KNNReward(nn.Module):
    """Per-state kNN reward with running feature normalisation (docs/algorithms.md §3).

    Features are divided by the running standard deviation (``RunningMeanStd.scale``: no
    centring or clipping, which would distort distances) so that dimensions are comparable; the
    statistics are buffers and travel with ``state_dict``.

    Args:
        dim: feature dimension p.
        k: neighbour rank.
        beta: collective weight in ``[0, 1]``.
        c: offset inside the log (APT uses 1 on normalised features).
        search: kNN configuration.
        normalize: whether to scale features by the running standard deviation.
    """

    def __init__(
        self,
        dim: int,
        k: int = 10,
        beta: float = 1.0,
        c: float = 1.0,
        *,
        search: KNNSearch | None = None,
        normalize: bool = True,
    ) -> None:
        super().__init__()
        self.k = k
        self.beta = beta
        self.c = c
        self.search = search or KNNSearch()
        self.normalize = normalize
        self.normalizer = RunningMeanStd(shape=(dim,), clip=None)

    @torch.no_grad()
    def forward(
        self,
        x: torch.Tensor,
        group: torch.Tensor | None = None,
        *,
        num_groups: int | None = None,
        update: bool = True,
    ) -> torch.Tensor:
        """Rewards ``[N]`` for features ``x [N, p]``; ``update`` folds ``x`` into the statistics
        first."""
        if self.normalize:
            if update:
                self.normalizer.update(x)
            x = self.normalizer.scale(x)
        return knn_reward(
            x,
            self.k,
            group,
            num_groups=num_groups,
            beta=self.beta,
            c=self.c,
            search=self.search,
        )
