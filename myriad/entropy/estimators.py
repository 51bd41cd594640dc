"""k-NN entropy estimators: Kozachenko-Leonenko, its importance-weighted form, population terms.

Formulas (docs/entropy.md; all in nats):

- Kozachenko-Leonenko (Singh et al. 2003) for ``S = {x_1..x_N}`` in ``R^p``::

      H(S) = (1/N) sum_x log(N c_p R_k(x)^p / k) + log k - psi(k)

  with ``c_p`` the volume of the unit p-ball and ``R_k(x)`` the Euclidean distance from ``x`` to
  its k-th nearest neighbour in ``S`` (``x`` itself excluded).
- Importance-weighted (MEPOL): with normalised weights ``w`` and ``W_x`` the weight of ``x``'s k
  neighbours, ``H_w = -sum_x (W_x / k) log(W_x / V_x) + log k - psi(k)`` with
  ``V_x = c_p R_k(x)^p``, and ``KL(old || new) = (1/N) sum_x log(k / (N W_x))``.
- Population of M members: ``H_coll = H(X)``, ``H_ind = (1/M) sum_i H(X_i)``,
  ``diversity = H_coll - H_ind``.

Duplicate points (zero distances): every ``log R`` is taken of ``max(R, min_distance)``, so a
particle whose k-th neighbour is an exact copy contributes ``p log(min_distance)`` (finite,
strongly negative: a point mass has entropy minus infinity) instead of ``-inf`` or NaN. The floor
is a parameter of every estimator: :data:`DEFAULT_MIN_DISTANCE` (1e-8) suits raw features;
pretraining measures std-scaled features and passes its ``objective.min_distance`` (1e-3, a
resolution). The reward (:mod:`myriad.entropy.reward`) uses ``log(c + R)`` with ``c > 0`` and
needs no floor.

:func:`kl_entropy_from_distances`, :func:`population_entropy_from_distances` and
:func:`importance_weighted_entropy` take neighbours already found, so a caller that needs several
quantities of one batch (pretraining: entropies, reward and the importance-weighted estimate)
searches once and uses the same maths as the one-call forms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from myriad.entropy.knn import GroupLayout, KNNSearch, Neighbors

#: Floor applied to k-NN distances before their logarithm (duplicate-point guard).
DEFAULT_MIN_DISTANCE = 1e-8


def log_unit_ball_volume(p: int) -> float:
    """``log c_p = (p/2) log(pi) - lgamma(1 + p/2)``: log volume of the unit p-ball, any p >= 1.

    Computed in log space, so it stays finite where ``c_p`` itself underflows (p in the
    hundreds).
    """
    if p < 1:
        raise ValueError(f"dimension must be >= 1, got {p}")
    return 0.5 * p * math.log(math.pi) - math.lgamma(1.0 + 0.5 * p)


def _digamma(k: int) -> float:
    """psi(k) for a positive integer: ``-gamma + sum_{j<k} 1/j`` (exact, no scipy needed)."""
    return -0.5772156649015329 + math.fsum(1.0 / j for j in range(1, k))


def _safe_log(r: torch.Tensor, min_distance: float) -> torch.Tensor:
    if min_distance <= 0:
        raise ValueError(f"min_distance must be > 0, got {min_distance}")
    return torch.log(r.clamp_min(min_distance))


def kl_entropy_from_distances(
    kth_distance: torch.Tensor,
    dim: int,
    k: int,
    *,
    n: int | None = None,
    min_distance: float = DEFAULT_MIN_DISTANCE,
) -> torch.Tensor:
    """Kozachenko-Leonenko entropy (nats) from k-th neighbour distances.

    Args:
        kth_distance: ``[N]`` Euclidean distance of each point to its k-th nearest neighbour
            (itself excluded); or ``[B, N]`` for ``B`` sets of ``N`` points each (e.g. the
            equal blocks of a population, one estimate per member in one call).
        dim: feature dimension p.
        k: the neighbour rank the distances belong to.
        n: size of the set the neighbours were searched in (default ``N``).
        min_distance: floor on distances before the log (duplicate-point guard).

    Returns:
        float64 ``log N - psi(k) + log c_p + p mean(log R_k)``: a scalar for ``[N]``, ``[B]``
        for ``[B, N]``.
    """
    if kth_distance.dim() not in (1, 2) or kth_distance.shape[-1] == 0:
        raise ValueError(
            "kth_distance must be a non-empty [N] (or [B, N]) tensor, "
            f"got {tuple(kth_distance.shape)}"
        )
    n = kth_distance.shape[-1] if n is None else n
    mean_log_r = _safe_log(kth_distance.to(torch.float64), min_distance).mean(dim=-1)
    return math.log(n) - _digamma(k) + log_unit_ball_volume(dim) + dim * mean_log_r


def kl_entropy(
    x: torch.Tensor,
    k: int = 10,
    *,
    search: KNNSearch | None = None,
    min_distance: float = DEFAULT_MIN_DISTANCE,
) -> torch.Tensor:
    """Kozachenko-Leonenko entropy (nats) of the sample ``x [N, p]`` (docs/algorithms.md §1).

    Args:
        x: samples ``[N, p]``.
        k: neighbour rank.
        search: kNN configuration (default: ``KNNSearch()``, backend ``"auto"``).
        min_distance: floor on distances before the log (duplicate-point guard).

    Returns:
        Scalar float64 tensor on ``x``'s device.
    """
    search = search or KNNSearch()
    nb = search(x, k)
    return kl_entropy_from_distances(
        nb.distances[:, k - 1], x.shape[1], k, min_distance=min_distance
    )


@dataclass(frozen=True)
class PopulationEntropy:
    """Entropy terms of a population (docs/algorithms.md §2), all in nats (float64 tensors).

    Attributes:
        collective: ``H(X)`` of the pooled batch (scalar).
        individual: ``H(X_i)`` per member, ``[M]``.
        individual_mean: ``(1/M) sum_i H(X_i)`` (scalar).
        diversity: ``collective - individual_mean`` (scalar).
    """

    collective: torch.Tensor
    individual: torch.Tensor
    individual_mean: torch.Tensor
    diversity: torch.Tensor

    def objective(self, beta: float) -> torch.Tensor:
        """``J_beta = (1 - beta) H_ind + beta H_coll``."""
        return (1.0 - beta) * self.individual_mean + beta * self.collective


def _group_mean(values: torch.Tensor, gid: torch.Tensor, sizes: torch.Tensor) -> torch.Tensor:
    sums = torch.zeros(sizes.numel(), dtype=values.dtype, device=values.device)
    sums.index_add_(0, gid, values)
    return sums / sizes.to(values.device, values.dtype)


def population_entropy_from_distances(
    collective_kth: torch.Tensor,
    individual_kth: torch.Tensor,
    dim: int,
    k: int,
    group: torch.Tensor | None = None,
    *,
    num_groups: int | None = None,
    min_distance: float = DEFAULT_MIN_DISTANCE,
) -> PopulationEntropy:
    """Collective, individual and diversity entropies (docs/algorithms.md §2) from k-th
    neighbour distances.

    Args:
        collective_kth: ``[N]`` distance of each state to its k-th neighbour in the pooled set.
        individual_kth: ``[N]`` the same within the state's own member.
        dim: feature dimension p.
        k: the neighbour rank the distances belong to.
        group: ``[N]`` member id of each state, or None with ``num_groups`` (equal contiguous
            blocks, the population layout).
        num_groups: number of members M.
        min_distance: floor on distances before the log (duplicate-point guard).
    """
    layout = GroupLayout.build(individual_kth, group, num_groups)
    collective = kl_entropy_from_distances(collective_kth, dim, k, min_distance=min_distance)
    if layout.equal_blocks:
        per_member = individual_kth.reshape(layout.num_groups, -1)
        individual = kl_entropy_from_distances(per_member, dim, k, min_distance=min_distance)
    else:
        # Members of different sizes: mean log-distance per member, each with its own N_i.
        log_r = _safe_log(individual_kth.to(torch.float64), min_distance)
        sizes = layout.sizes.to(log_r.device)
        mean_log_r = _group_mean(log_r, layout.group_ids(), sizes)
        individual = (
            torch.log(sizes.to(torch.float64))
            - _digamma(k)
            + log_unit_ball_volume(dim)
            + dim * mean_log_r
        )
    individual_mean = individual.mean()
    return PopulationEntropy(
        collective=collective,
        individual=individual,
        individual_mean=individual_mean,
        diversity=collective - individual_mean,
    )


def population_entropy(
    x: torch.Tensor,
    k: int = 10,
    group: torch.Tensor | None = None,
    *,
    num_groups: int | None = None,
    search: KNNSearch | None = None,
    min_distance: float = DEFAULT_MIN_DISTANCE,
) -> PopulationEntropy:
    """Collective, individual and diversity entropies of a population (docs/algorithms.md §2).

    One kNN query over the pooled set and one per-group query (all groups in one call), then
    :func:`population_entropy_from_distances`.

    Args:
        x: states ``[N, p]`` of all members.
        k: neighbour rank.
        group: ``[N]`` member id of each state, or None with ``num_groups`` (equal contiguous
            blocks, the population layout).
        num_groups: number of members M.
        search: kNN configuration (default ``KNNSearch()``).
        min_distance: floor on distances before the log (duplicate-point guard).
    """
    search = search or KNNSearch()
    # Checked before the first search, so that bad groups fail fast.
    GroupLayout.build(x, group, num_groups)
    r_coll = search(x, k).distances[:, k - 1]
    r_ind = search.grouped(x, k, group, num_groups=num_groups).distances[:, k - 1]
    return population_entropy_from_distances(
        r_coll, r_ind, x.shape[1], k, group, num_groups=num_groups, min_distance=min_distance
    )


# --------------------------------------------------------------------------------------------
# importance-weighted estimator (MEPOL-style trust region)


@dataclass(frozen=True)
class WeightedEntropy:
    """Importance-weighted entropy and the KL estimate that bounds the trust region.

    Attributes:
        entropy: ``H_w`` (scalar, differentiable w.r.t. the log-weights).
        kl: ``D_KL(theta_old || theta)`` estimate (scalar, differentiable).
    """

    entropy: torch.Tensor
    kl: torch.Tensor


def importance_weighted_entropy(
    log_weights: torch.Tensor,
    neighbors: Neighbors,
    dim: int,
    *,
    min_distance: float = DEFAULT_MIN_DISTANCE,
) -> WeightedEntropy:
    """``H_w`` and ``D_KL`` (docs/algorithms.md §4) from unnormalised log-weights and fixed
    neighbours.

    Weights are normalised to sum 1 over the pool in log space (``log_softmax``), and
    ``log W_x = logsumexp`` over ``x``'s neighbours, so extreme ratios neither overflow nor
    produce ``log 0``. With all weights equal, ``H_w`` equals :func:`kl_entropy_from_distances`
    on the same neighbours and ``D_KL`` is 0.

    Args:
        log_weights: ``[N]`` log importance weights (e.g. cumulative
            ``log pi_theta - log pi_theta_old``), any additive constant; gradients flow here.
            Or ``[B, N]`` for ``B`` separate sets of ``N`` points (the members of a population),
            each normalised on its own.
        neighbors: self-query neighbours of the same ``N`` points, ``[N, k]`` (computed once
            per batch with ``theta_old``'s samples); ``[B, N, k]`` with indices within each set.
        dim: feature dimension p.
        min_distance: floor on distances before the log (duplicate-point guard).

    Returns:
        :class:`WeightedEntropy` of scalars, or of ``[B]`` tensors for batched input.
    """
    index = neighbors.indices
    if log_weights.dim() not in (1, 2) or log_weights.shape != index.shape[:-1]:
        raise ValueError(
            f"log_weights must be [N] (or [B, N]) matching the neighbours "
            f"{tuple(index.shape[:-1])} (one weight per point), got {tuple(log_weights.shape)}"
        )
    n, k = index.shape[-2:]
    lw = log_weights.to(torch.float64)
    log_w = lw - torch.logsumexp(lw, dim=-1, keepdim=True)
    neighbour_log_w = log_w.gather(-1, index.to(lw.device).flatten(-2)).view(index.shape)
    log_wx = torch.logsumexp(neighbour_log_w, dim=-1)
    log_vx = log_unit_ball_volume(dim) + dim * _safe_log(
        neighbors.distances[..., k - 1].to(lw.device, torch.float64), min_distance
    )
    const = math.log(k) - _digamma(k)
    entropy = -(torch.exp(log_wx) / k * (log_wx - log_vx)).sum(dim=-1) + const
    kl = (math.log(k) - math.log(n) - log_wx).mean(dim=-1)
    return WeightedEntropy(entropy=entropy, kl=kl)


class ImportanceWeightedEntropy:
    """``H_w`` and ``D_KL`` for one batch: neighbours once, then any number of weight vectors.

    Example (inner loop of the K-Myriad update)::

        iw = ImportanceWeightedEntropy(features, k=10)
        for _ in range(inner_steps):
            out = iw(cumulative_log_ratio(logp_new - logp_old, episode_start).flatten())
            if out.kl > delta:
                break
            (-out.entropy).backward(); opt.step(); opt.zero_grad()

    Args:
        x: states ``[N, p]`` sampled with the old parameters.
        k: neighbour rank.
        search: kNN configuration.
        min_distance: floor on distances before the log.
    """

    def __init__(
        self,
        x: torch.Tensor,
        k: int = 10,
        *,
        search: KNNSearch | None = None,
        min_distance: float = DEFAULT_MIN_DISTANCE,
    ) -> None:
        self.k = k
        self.dim = x.shape[1]
        self.min_distance = min_distance
        self.neighbors = (search or KNNSearch())(x, k)

    def __call__(self, log_weights: torch.Tensor) -> WeightedEntropy:
        """Evaluate at ``log_weights [N]`` (differentiable)."""
        return importance_weighted_entropy(
            log_weights, self.neighbors, self.dim, min_distance=self.min_distance
        )

    @property
    def plain_entropy(self) -> torch.Tensor:
        """The unweighted estimate on the same neighbours."""
        return kl_entropy_from_distances(
            self.neighbors.distances[:, self.k - 1],
            self.dim,
            self.k,
            min_distance=self.min_distance,
        )


def cumulative_log_ratio(log_ratio: torch.Tensor, episode_start: torch.Tensor) -> torch.Tensor:
    """Per-trajectory running sum of log-ratios: ``sum_{t' <= t} log pi_new - log pi_old``.

    The sum restarts at every step where ``episode_start`` is True (and at ``t = 0``), so each
    particle's weight covers its own trajectory only (docs/algorithms.md §4). Vectorised over time.

    Args:
        log_ratio: ``[T, E]`` per-step ``log pi_theta(a|s) - log pi_theta_old(a|s)``.
        episode_start: ``[T, E]`` bool, True on the first step of an episode.

    Returns:
        ``[T, E]`` cumulative log-ratios (differentiable w.r.t. ``log_ratio``).
    """
    if log_ratio.shape != episode_start.shape or log_ratio.dim() != 2:
        raise ValueError(
            "log_ratio and episode_start must both be [T, E], got "
            f"{tuple(log_ratio.shape)} and {tuple(episode_start.shape)}"
        )
    t_steps = log_ratio.shape[0]
    csum = torch.cumsum(log_ratio, dim=0)
    start = episode_start.bool().clone()
    start[0] = True
    steps = torch.arange(t_steps, device=log_ratio.device)[:, None].expand_as(start)
    last_start = torch.cummax(torch.where(start, steps, torch.zeros_like(steps)), dim=0).values
    # csum just before the episode began (0 when it began at t = 0)
    before = csum - log_ratio
    base = torch.gather(before, 0, last_start)
    return csum - base
