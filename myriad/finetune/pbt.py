"""Population-based training: PPO members with their own hyperparameters (docs/algorithms.md §8).

Every member carries three hyperparameters, ``lr_scale``, ``entropy_coef`` and ``clip``:

- ``lr_scale`` multiplies the learning rate of the member's own parameters. PPO has one Adam
  optimiser, and scaling a member's loss would not change its Adam step (Adam divides the scale
  out), so :class:`MemberScaledAdam` scales the *update*: after the Adam step, each member's
  slice of every member-indexed parameter moves ``lr_scale[i]`` times as far. Adam's step is
  linear in the learning rate, so this is exactly a per-member learning rate. Parameters shared
  by all members (the trunk of ``shared_trunk``) keep the base rate; the ``independent``
  parameterisation, where every parameter belongs to one member, makes the members fully
  separate learners.
- ``entropy_coef`` is PPO's per-member entropy coefficient.
- ``clip`` is the surrogate's clip range of the member's rows.

Every ``interval`` iterations (once each member has finished ``min_episodes`` episodes since
the last round) the members are ranked by their mean episode return since that round;
:func:`exploit_explore` lets each of the worst ``fraction`` copy the weights, optimiser state and
hyperparameters of a random member of the best ``fraction`` (only if that member is strictly
better) and then multiplies or divides each copied hyperparameter, with probability
``mutation_prob``, by a factor drawn uniformly from ``mutation_factor``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from myriad.finetune.base import FinetuneAlgorithm
from myriad.nn.population import PopulationActorCritic
from myriad.rl.ppo import PPOConfig
from myriad.rl.storage import Batch
from myriad.utils.settings import Check, at_least, between, setting
from myriad.utils.tensors import member_rows

#: The per-member hyperparameters, in the column order of :attr:`PBT.hyperparameters`.
HYPERPARAMETERS = ("lr_scale", "entropy_coef", "clip")

DEFAULT_RANGES: dict[str, tuple[float, float]] = {
    "lr_scale": (0.3, 3.0),
    "entropy_coef": (1e-4, 1e-2),
    "clip": (0.1, 0.3),
}


@dataclass
class PBTConfig:
    """PBT's schedule and search space.

    Attributes:
        interval: iterations between exploit/explore rounds.
        fraction: share of members in the worst (replaced) and best (copied) groups.
        mutation_prob: probability that a copied hyperparameter is perturbed.
        mutation_factor: ``(low, high)`` of the perturbation factor, drawn uniformly; the value
            is multiplied or divided by it with equal probability.
        min_episodes: a round waits until every member has finished this many episodes.
        ranges: per hyperparameter, ``(low, high)``: initial values are drawn log-uniformly in
            it and mutated values are clamped to it.
    """

    interval: int = setting(10, help="iterations between exploit/explore rounds", check=at_least(1))
    fraction: float = setting(
        0.25,
        help="share of members in the worst (replaced) and best (copied) groups",
        check=Check(lambda v: 0 < v <= 0.5, "in (0, 0.5]"),
    )
    mutation_prob: float = setting(
        0.15, help="probability that a copied hyperparameter is perturbed", check=between(0, 1)
    )
    mutation_factor: tuple[float, float] = setting(
        (1.1, 1.5), help="(low, high) of the perturbation factor, drawn uniformly"
    )
    min_episodes: int = setting(
        1, help="a round waits until every member finished this many episodes", check=at_least(1)
    )
    ranges: Mapping[str, Sequence[float]] = setting(
        factory=lambda: dict(DEFAULT_RANGES),
        help="initial values (log-uniform) and bounds of the mutated values, per hyperparameter",
    )

    def __post_init__(self) -> None:
        unknown = sorted(set(self.ranges) - set(HYPERPARAMETERS))
        if unknown:
            raise ValueError(
                f"unknown PBT hyperparameter(s) {unknown}; known: {', '.join(HYPERPARAMETERS)}"
            )
        self.ranges = {
            **DEFAULT_RANGES,
            **{k: tuple(map(float, v)) for k, v in self.ranges.items()},
        }
        for name, (low, high) in self.ranges.items():
            if not 0 < low <= high:
                raise ValueError(
                    f"PBT range of {name} must satisfy 0 < low <= high, got {low, high}"
                )
        lo, hi = (float(f) for f in self.mutation_factor)
        self.mutation_factor = (lo, hi)
        if not 1.0 <= lo <= hi:
            raise ValueError(f"mutation_factor must satisfy 1 <= low <= high, got {lo, hi}")
        if not 0.0 < self.fraction <= 0.5:
            raise ValueError(f"fraction must be in (0, 0.5], got {self.fraction}")
        if self.interval < 1 or self.min_episodes < 1:
            raise ValueError(
                f"interval and min_episodes must be >= 1, got {self.interval}, {self.min_episodes}"
            )

    def bounds(self) -> torch.Tensor:
        """``[H, 2]`` lower and upper bounds, in :data:`HYPERPARAMETERS` order."""
        return torch.tensor([self.ranges[h] for h in HYPERPARAMETERS], dtype=torch.float64)


class Decision(NamedTuple):
    """One exploit/explore round.

    Attributes:
        replaced: members that were overwritten.
        sources: the member each of them copied, in the same order.
        hyperparameters: ``[M, H]`` after the round.
        factors: ``[M, H]`` multiplicative change of each hyperparameter by mutation (1 where
            none happened; before clamping to the bounds).
    """

    replaced: list[int]
    sources: list[int]
    hyperparameters: torch.Tensor
    factors: torch.Tensor


def exploit_explore(
    objective: torch.Tensor | np.ndarray | Sequence[float],
    hyperparameters: torch.Tensor,
    generator: torch.Generator,
    fraction: float = 0.25,
    mutation_prob: float = 0.15,
    mutation_factor: tuple[float, float] = (1.1, 1.5),
    bounds: torch.Tensor | None = None,
) -> Decision:
    """Rank members by ``objective`` and let the worst copy (and perturb) the best.

    Args:
        objective: ``[M]``, higher is better; ties rank by member index (lower first).
        hyperparameters: ``[M, H]``.
        generator: a CPU generator; the draws are, in order, per replaced member: the source
            (one ``randint``), then ``H`` mutation coins, ``H`` factors and ``H`` directions.
        fraction: ``k = max(1, floor(fraction * M))`` members form each of the two groups.
        mutation_prob: probability of perturbing each copied hyperparameter.
        mutation_factor: the factor's range.
        bounds: ``[H, 2]`` clamp of the result (None: no clamp).

    Returns:
        The :class:`Decision`; ``hyperparameters`` is a new tensor.
    """
    obj = torch.as_tensor(objective, dtype=torch.float64).cpu()
    m, h = hyperparameters.shape
    if obj.shape != (m,):
        raise ValueError(f"objective must have shape [{m}], got {list(obj.shape)}")
    k = max(1, math.floor(fraction * m))
    # Stable ascending sort with ties broken by index: worst first.
    order = sorted(range(m), key=lambda i: (float(obj[i]), i))
    worst, best = order[:k], order[m - k :]
    new = hyperparameters.detach().cpu().to(torch.float64).clone()
    factors = torch.ones(m, h, dtype=torch.float64)
    low, high = mutation_factor
    replaced, sources = [], []
    for dst in worst:
        src = best[int(torch.randint(len(best), (1,), generator=generator))]
        mutate = torch.rand(h, generator=generator, dtype=torch.float64) < mutation_prob
        size = low + (high - low) * torch.rand(h, generator=generator, dtype=torch.float64)
        up = torch.rand(h, generator=generator, dtype=torch.float64) < 0.5
        if not obj[src] > obj[dst] or src == dst:
            continue
        factor = torch.where(
            mutate, torch.where(up, size, 1.0 / size), torch.ones(h, dtype=torch.float64)
        )
        new[dst] = new[src] * factor
        factors[dst] = factor
        replaced.append(dst)
        sources.append(src)
    if bounds is not None:
        new = torch.minimum(torch.maximum(new, bounds[:, 0]), bounds[:, 1])
    return Decision(replaced, sources, new.to(hyperparameters.dtype), factors)


class MemberScaledAdam(torch.optim.Adam):
    """Adam with a per-member learning-rate multiplier on member-indexed parameters.

    Args:
        params: every parameter to optimise.
        member_params: the parameters whose leading dimension indexes the M members.
        num_members: M.
        **adam: Adam's options (``lr``, ``eps``, ...).

    ``member_scale [M]`` multiplies the step of member i's slice of each member parameter; the
    other parameters take Adam's plain step.
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        member_params: Sequence[torch.nn.Parameter],
        num_members: int,
        **adam: Any,
    ) -> None:
        super().__init__(params, **adam)
        self.member_params = list(member_params)
        self.member_scale = torch.ones(num_members, device=self.member_params[0].device)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        before = [p.detach().clone() for p in self.member_params]
        loss = super().step(closure)
        for p, old in zip(self.member_params, before):
            scale = self.member_scale.view(-1, *([1] * (p.ndim - 1)))
            p.copy_(torch.lerp(old, p, scale.to(p.dtype)))
        return loss


class PBT(FinetuneAlgorithm):
    """PPO over M independent learners with per-member hyperparameters and periodic
    exploit/explore rounds (see the module docstring).

    Args:
        model: the population.
        config: PPO hyperparameters (``lr`` is the base rate that ``lr_scale`` multiplies;
            ``entropy_coef`` and ``clip`` are replaced by each member's own).
        pbt: PBT's schedule and search space.
        generator: minibatch shuffling.
        pbt_generator: the draws of initial values and of exploit/explore rounds (CPU).
    """

    optimizer: MemberScaledAdam
    rank_split = "rows"

    def __init__(
        self,
        model: PopulationActorCritic,
        config: PPOConfig | None = None,
        pbt: PBTConfig | None = None,
        *,
        generator: torch.Generator | None = None,
        pbt_generator: torch.Generator | None = None,
    ) -> None:
        config = config or PPOConfig()
        optimizer = MemberScaledAdam(
            model.parameters(),
            model.member_parameters(),
            model.num_members,
            lr=config.lr,
            eps=config.adam_eps,
        )
        super().__init__(model, config, generator=generator, optimizer=optimizer)
        self.pbt = pbt or PBTConfig()
        self.pbt_generator = pbt_generator or torch.Generator().manual_seed(0)
        self.hyperparameters = self._initial_values(model.num_members)
        self.clip = torch.zeros(model.num_members, device=model.log_std.device)
        self.apply_hyperparameters()
        # Finished-episode return sums and counts per member since the last round.
        self.window = np.zeros((2, model.num_members))
        self.objective = np.zeros(model.num_members)
        self.rounds = 0
        self.since_round = 0

    def _initial_values(self, m: int) -> torch.Tensor:
        bounds = self.pbt.bounds()
        u = torch.rand(m, len(HYPERPARAMETERS), generator=self.pbt_generator, dtype=torch.float64)
        log_low, log_high = bounds[:, 0].log(), bounds[:, 1].log()
        return torch.exp(log_low + u * (log_high - log_low)).float()

    def apply_hyperparameters(self) -> None:
        """Push :attr:`hyperparameters` ``[M, H]`` into the optimiser, entropy and clip."""
        hp = self.hyperparameters.to(self.clip.device)
        self.optimizer.member_scale.copy_(hp[:, 0])
        self.set_entropy_coef(hp[:, 1])
        self.clip.copy_(hp[:, 2])

    @property
    def leader(self) -> int:
        """The best member by the objective of the last round (0 before any)."""
        return int(np.argmax(self.objective))

    def clip_range(self, batch: Batch) -> torch.Tensor:
        """Each row is clipped by its member's own range."""
        return member_rows(self.clip, batch.member)

    def end_iteration(self, returns: np.ndarray, counts: np.ndarray) -> dict[str, float]:
        """Fold in one iteration's finished episodes (per-member return sums and counts,
        ``[M]`` each) and run a round when one is due; returns the scalars to log."""
        self.window += np.stack([returns, counts])
        self.since_round += 1
        out: dict[str, float] = {}
        hp = self.hyperparameters
        for j, name in enumerate(HYPERPARAMETERS):
            out[f"pbt/{name}_mean"] = float(hp[:, j].mean())
        ready = self.window[1].min() >= self.pbt.min_episodes
        if self.since_round < self.pbt.interval or not ready:
            return out
        self.objective = self.window[0] / self.window[1]
        decision = exploit_explore(
            self.objective,
            self.hyperparameters,
            self.pbt_generator,
            self.pbt.fraction,
            self.pbt.mutation_prob,
            self.pbt.mutation_factor,
            self.pbt.bounds(),
        )
        if decision.replaced:
            self.model.copy_member(decision.sources, decision.replaced, self.optimizer)
        self.hyperparameters = decision.hyperparameters
        self.apply_hyperparameters()
        self.window[:] = 0.0
        self.since_round = 0
        self.rounds += 1
        out["pbt/replaced"] = float(len(decision.replaced))
        out["pbt/rounds"] = float(self.rounds)
        out["pbt/best_objective"] = float(self.objective.max())
        return out

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(
            hyperparameters=self.hyperparameters.clone(),
            pbt_generator=self.pbt_generator.get_state(),
            window=torch.from_numpy(self.window.copy()),
            objective=torch.from_numpy(self.objective.copy()),
            rounds=self.rounds,
            since_round=self.since_round,
        )
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.hyperparameters = state["hyperparameters"].clone()
        self.pbt_generator.set_state(state["pbt_generator"])
        self.window = state["window"].numpy().copy()
        self.objective = state["objective"].numpy().copy()
        self.rounds = int(state["rounds"])
        self.since_round = int(state["since_round"])
        self.apply_hyperparameters()
