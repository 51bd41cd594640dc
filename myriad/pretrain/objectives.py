"""K-Myriad objectives over one rollout: what the population maximises and how it is updated.

:class:`EntropyMeasurement` runs the two k-NN queries of a rollout once (pooled and per member, on
features scaled by their running standard deviation) and derives from them everything the
iteration needs: the reported entropies (docs/algorithms.md §2), the per-state reward (§3)
and the neighbours of the importance-weighted estimator (§4).

- :class:`KNNRewardObjective` (``objective=knn_reward``, default): rewards go into the rollout and
  PPO updates the population.
- :class:`ImportanceWeightedObjective` (``objective=mepol``): gradient ascent on the
  importance-weighted entropy of the fixed batch, for inner steps while the KL estimate stays
  within the trust region.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from myriad.entropy import (
    KNNSearch,
    Neighbors,
    cumulative_log_ratio,
    importance_weighted_entropy,
    kl_entropy_from_distances,
    knn_reward_from_distances,
    population_entropy_from_distances,
)
from myriad.nn.population import PopulationActorCritic
from myriad.rl.ppo import PPO
from myriad.rl.storage import RolloutStorage
from myriad.utils.config import ConfigError
from myriad.utils.running_stats import RunningMeanStd


def env_major(x: torch.Tensor) -> torch.Tensor:
    """``[T, E, ...] -> [E * T, ...]`` with row ``e * T + t``: each member's states contiguous."""
    return x.transpose(0, 1).reshape(-1, *x.shape[2:])


def time_major(x: torch.Tensor, num_steps: int) -> torch.Tensor:
    """Inverse of :func:`env_major` for per-row values: ``[E * T] -> [T, E]``."""
    return x.reshape(-1, num_steps).transpose(0, 1)


@dataclass(frozen=True)
class MemberNeighbours:
    """The per-member half of a measurement.

    Attributes:
        grouped: neighbours within each member's states (``[N, k]``, global row indices).
        individual: ``[M]`` each member's entropy in nats of the raw features.
    """

    grouped: Neighbors
    individual: torch.Tensor


class Measurement:
    """One rollout's neighbours and entropies.

    The per-member part (:class:`MemberNeighbours`) may still be computing in a worker thread
    (:attr:`EntropyMeasurement.defer_members`); reading ``grouped`` or ``individual`` waits
    for it.

    Attributes:
        scaled: features divided by their running std, env-major ``[N, p]``.
        pooled: neighbours in the pooled set (``Neighbors [N, k]``).
        collective: the collective entropy in nats of the raw features.
        log_scale: ``sum_d log std_d``, the entropy shift from scaled to raw features.
        num_steps, num_members, k: the shape of the rollout.
        min_distance: the distance floor used by every estimate of this measurement.
    """

    def __init__(
        self,
        scaled: torch.Tensor,
        pooled: Neighbors,
        collective: torch.Tensor,
        members: MemberNeighbours | Future[MemberNeighbours],
        log_scale: float,
        num_steps: int,
        num_members: int,
        k: int,
        min_distance: float,
    ) -> None:
        self.scaled, self.pooled, self.collective = scaled, pooled, collective
        self.log_scale = log_scale
        self.num_steps, self.num_members, self.k = num_steps, num_members, k
        self.min_distance = min_distance
        self._members = members

    @property
    def pending(self) -> bool:
        """Whether the per-member part is still being computed."""
        return isinstance(self._members, Future) and not self._members.done()

    @property
    def members(self) -> MemberNeighbours:
        if isinstance(self._members, Future):
            self._members = self._members.result()
        return self._members

    @property
    def grouped(self) -> Neighbors:
        return self.members.grouped

    @property
    def individual(self) -> torch.Tensor:
        return self.members.individual

    @property
    def diversity(self) -> torch.Tensor:
        return self.collective - self.individual.mean()

    def reward(self, beta: float, c: float) -> torch.Tensor:
        """``(1 - beta) log(c + R_k(x; X_i)) + beta log(c + R_k(x; X))``, ``[T, E]``
        (docs/algorithms.md §3): :func:`myriad.entropy.knn_reward_from_distances` on this
        rollout's neighbours. At ``beta = 1`` the per-member part is not waited for."""
        k = self.k
        individual = None if beta == 1.0 else self.grouped.distances[:, k - 1]
        r = knn_reward_from_distances(self.pooled.distances[:, k - 1], individual, beta, c)
        return time_major(r, self.num_steps)

    def scalars(self) -> dict[str, float]:
        out = {
            "entropy/collective": float(self.collective),
            "entropy/individual_mean": float(self.individual.mean()),
            "entropy/diversity": float(self.diversity),
        }
        out.update({f"entropy/member_{i}": float(h) for i, h in enumerate(self.individual)})
        return out


class EntropyMeasurement:
    """The k-NN queries of a rollout, with running feature scaling.

    Args:
        k: neighbour rank.
        num_members: M (members own equal contiguous blocks of envs).
        dim: feature dimension p.
        backend: k-NN backend (``"auto"``, ``"kdtree"``, ``"faiss"``, ``"torch"``, ...).
        min_distance: resolution of the scaled features: neighbour distances below it count as
            ``min_distance``. Bounded environments stack states exactly (a point mass pushed
            into a corner); without a resolution, each exact duplicate adds ``p log 1e-8`` to
            the estimate and drowns the signal.

    Attributes:
        concurrent: on CPU, run the per-member search in a second thread while the pooled one
            runs. The two are independent, and each spends part of its time in single-threaded
            steps (finding the distinct states, expanding copies) that the other's tree queries
            can overlap; the results are the same either way.
        defer_members: on CPU, return after the pooled search and finish the per-member one
            in the worker thread while the caller goes on (see the attribute's comment).
    """

    concurrent: bool = True
    #: On CPU, run the per-member search after the pooled one, in the worker thread, and return
    #: at once: the caller's update goes on beside it (the runner sets this at ``beta = 1``,
    #: where nothing reads the per-member part before the update ends); reading the part waits.
    #: Only measurements that update the scale (training rollouts) are deferred.
    defer_members: bool = False

    def __init__(
        self, k: int, num_members: int, dim: int, backend: str = "auto", min_distance: float = 1e-3
    ) -> None:
        self.k, self.num_members, self.dim = int(k), int(num_members), int(dim)
        self.min_distance = float(min_distance)
        self.search = KNNSearch(backend=backend)
        self.normalizer = RunningMeanStd((self.dim,), clip=None)
        self._worker: ThreadPoolExecutor | None = None

    def _background(self) -> ThreadPoolExecutor:
        """The one worker thread of the per-member searches (created on first use)."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="knn")
        return self._worker

    def _member_part(
        self,
        scaled: torch.Tensor,
        pooled_kth: torch.Tensor,
        log_scale: float,
        grouped: Neighbors | None = None,
    ) -> MemberNeighbours:
        """The per-member search of ``scaled [N, p]`` (unless ``grouped`` is given) and the
        members' entropies."""
        k, m = self.k, self.num_members
        if grouped is None:
            grouped = self.search.grouped(scaled, k, num_groups=m)
        entropy = population_entropy_from_distances(
            pooled_kth,
            grouped.distances[:, k - 1],
            self.dim,
            k,
            num_groups=m,
            min_distance=self.min_distance,
        )
        return MemberNeighbours(grouped, entropy.individual + log_scale)

    def __call__(self, features: torch.Tensor, update: bool = True) -> Measurement:
        """Neighbours and entropies of ``features [T, E, p]`` (envs in member blocks).

        The entropies are :func:`myriad.entropy.population_entropy_from_distances` of the scaled
        features, shifted by ``log_scale`` to the raw features' scale."""
        x = env_major(features)
        # The statistics follow the features' device (a checkpoint loads them on the CPU).
        self.normalizer.to(x.device)
        if update:
            self.normalizer.update(x)
        scaled = self.normalizer.scale(x).contiguous()
        k, m = self.k, self.num_members
        log_scale = float(torch.log(self.normalizer.std).sum())
        members: MemberNeighbours | Future[MemberNeighbours]
        if m == 1:
            pooled = self.search(scaled, k)
            members = self._member_part(scaled, pooled.distances[:, k - 1], log_scale, pooled)
        elif self.defer_members and update and scaled.device.type == "cpu":
            # The pooled search first, on every core; the per-member one then runs on beside
            # the caller's update (one core is idle there with one torch thread).
            pooled = self.search(scaled, k)
            members = self._background().submit(
                self._member_part, scaled, pooled.distances[:, k - 1], log_scale
            )
        elif self.concurrent and scaled.device.type == "cpu":
            # The per-member part does not need the pooled distances until its last step.
            pooled_kth: Future[torch.Tensor] = Future()
            pending = self._background().submit(
                lambda: self._member_part(scaled, pooled_kth.result(), log_scale)
            )
            try:
                pooled = self.search(scaled, k)
            except BaseException as exc:
                pooled_kth.set_exception(exc)  # the worker must not wait for it forever
                raise
            pooled_kth.set_result(pooled.distances[:, k - 1])
            members = pending.result()
        else:
            pooled = self.search(scaled, k)
            members = self._member_part(scaled, pooled.distances[:, k - 1], log_scale)
        collective = kl_entropy_from_distances(
            pooled.distances[:, k - 1], self.dim, k, min_distance=self.min_distance
        )
        return Measurement(
            scaled,
            pooled,
            collective + log_scale,
            members,
            log_scale,
            features.shape[0],
            m,
            k,
            self.min_distance,
        )

    def evaluate(self, features: torch.Tensor) -> Measurement:
        """Measure without updating the running scale (evaluation rollouts)."""
        return self(features, update=False)

    def state_dict(self) -> dict[str, Any]:
        return self.normalizer.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.normalizer.load_state_dict(state)


class KNNRewardObjective:
    """Per-state k-NN reward (docs/algorithms.md §3) optimised with PPO.

    Args:
        algorithm: the PPO instance updating the population.
        beta: 1 collective (K-Myriad), 0 independent explorers.
        c: offset inside the log, > 0.
    """

    def __init__(self, algorithm: PPO, beta: float, c: float) -> None:
        self.algorithm, self.beta, self.c = algorithm, float(beta), float(c)

    def update(self, storage: RolloutStorage, measurement: Measurement) -> dict[str, float]:
        reward = measurement.reward(self.beta, self.c)
        storage.rewards.copy_(reward)
        stats = self.algorithm.update(storage)
        stats["intrinsic_reward"] = float(reward.mean())
        return stats

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        pass


class ImportanceWeightedObjective:
    """The importance-weighted k-NN entropy with a KL trust region (docs/algorithms.md §4).

    Neighbours come from the rollout (computed once); each inner step re-weights the batch by
    the cumulative likelihood ratio of the current policy, ascends
    ``J_beta = (1 - beta) mean_i H_w(X_i) + beta H_w(X)`` and stops, restoring the last accepted
    parameters, as soon as the KL estimate exceeds ``kl_threshold``.

    Args:
        model: the population (its actor and log-std are optimised; the critic is unused).
        beta, kl_threshold, inner_steps, lr: see ``configs/objective/mepol.yaml``.
        max_grad_norm: gradient-norm clip of each inner step.
    """

    def __init__(
        self,
        model: PopulationActorCritic,
        beta: float,
        kl_threshold: float,
        inner_steps: int,
        lr: float,
        max_grad_norm: float = 1.0,
    ) -> None:
        if kl_threshold <= 0 or inner_steps < 1:
            raise ConfigError(
                f"objective.kl_threshold must be > 0 and objective.inner_steps >= 1, got "
                f"{kl_threshold}, {inner_steps}"
            )
        self.model, self.beta = model, float(beta)
        self.kl_threshold, self.inner_steps = float(kl_threshold), int(inner_steps)
        self.max_grad_norm = float(max_grad_norm)
        self.params = [p for n, p in model.named_parameters() if not n.startswith("critic")]
        self.optimizer = torch.optim.Adam(self.params, lr=lr)

    def _objective(
        self, log_weights: torch.Tensor, measurement: Measurement
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(J_beta, KL)`` at per-particle log-weights ``[N]`` (env-major, differentiable)."""
        p, m = measurement.scaled.shape[1], measurement.num_members
        floor = measurement.min_distance
        collective = importance_weighted_entropy(
            log_weights, measurement.pooled, p, min_distance=floor
        )
        if self.beta == 1.0 or m == 1:
            return collective.entropy, collective.kl
        n = log_weights.shape[0] // m
        grouped = measurement.grouped
        # Member i owns rows i*n .. (i+1)*n - 1; its neighbours as indices within its block.
        offsets = torch.arange(m, device=grouped.indices.device).view(m, 1, 1) * n
        local = Neighbors(
            grouped.distances.view(m, n, -1), grouped.indices.view(m, n, -1) - offsets
        )
        out = importance_weighted_entropy(log_weights.view(m, n), local, p, min_distance=floor)
        individual, kl_ind = out.entropy.mean(), out.kl.mean()
        objective = (1 - self.beta) * individual + self.beta * collective.entropy
        return objective, (1 - self.beta) * kl_ind + self.beta * collective.kl

    def update(self, storage: RolloutStorage, measurement: Measurement) -> dict[str, float]:
        t = storage.num_steps
        obs, actions = env_major(storage.obs), env_major(storage.actions)
        member = env_major(storage.member.expand(t, -1))
        old_log_prob = storage.log_probs
        start = torch.zeros_like(storage.dones)
        start[1:] = storage.dones[:-1]
        accepted = [p.detach().clone() for p in self.params]
        kl_value, objective_value, steps = 0.0, 0.0, 0
        for step in range(self.inner_steps + 1):
            log_prob = self.model.evaluate(obs, member, actions, blocked=True).log_prob
            log_ratio = time_major(log_prob, t) - old_log_prob
            log_weights = env_major(cumulative_log_ratio(log_ratio, start))
            objective, kl = self._objective(log_weights, measurement)
            kl_now = float(kl.detach())
            if kl_now > self.kl_threshold:
                with torch.no_grad():
                    for p, a in zip(self.params, accepted):
                        p.copy_(a)
                break
            accepted = [p.detach().clone() for p in self.params]
            kl_value, objective_value, steps = kl_now, float(objective.detach()), step
            if step == self.inner_steps:
                break
            self.optimizer.zero_grad(set_to_none=True)
            (-objective).backward()
            torch.nn.utils.clip_grad_norm_(self.params, self.max_grad_norm)
            self.optimizer.step()
        self.model.update_obs_norm(storage.obs)
        return {
            "kl": kl_value,
            "inner_steps": float(steps),
            "weighted_objective": objective_value + measurement.log_scale,
        }

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])


def build_objective(
    cfg: Mapping[str, Any], model: PopulationActorCritic, algorithm: PPO
) -> KNNRewardObjective | ImportanceWeightedObjective:
    """The objective named by ``cfg["name"]`` (``knn_reward`` or ``mepol``)."""
    name = cfg["name"]
    beta = float(cfg["beta"])
    if not 0.0 <= beta <= 1.0 or math.isnan(beta):
        raise ConfigError(f"objective.beta must lie in [0, 1], got {beta}")
    if name == "knn_reward":
        return KNNRewardObjective(algorithm, beta, float(cfg["c"]))
    if name == "mepol":
        return ImportanceWeightedObjective(
            model,
            beta,
            float(cfg["kl_threshold"]),
            int(cfg["inner_steps"]),
            float(cfg["lr"]),
        )
    raise ConfigError(f"unknown objective {name!r}; choose objective=knn_reward or objective=mepol")
