"""Evaluating members of a population on a task: one full episode per env, fresh envs.

:func:`rollout_members` runs every requested member in one batched rollout and keeps each env's
first episode; :meth:`EpisodeBatch.scores` scores it per member. :class:`PopulationEvaluator` is
the finetuning runner's evaluation: all members at once, the leader's and the best member's
success, the number of distinct solutions (:mod:`myriad.assess.solutions`) and, with
``eval.perturb=block_leader_route``, the same evaluation on the layout with the leader's route
walled off.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from myriad.assess.solutions import (
    DEFAULT_GRID_BINS,
    DEFAULT_MIN_SHARE,
    RegionMap,
    Solutions,
    blocked_layout,
    distinct_solutions,
    exclusive_regions,
    layout_regions,
)
from myriad.envs.base import VecEnv
from myriad.envs.layout import Layout, LayoutError
from myriad.envs.nav import PointNavEnv
from myriad.nn.population import PopulationActorCritic, member_blocks
from myriad.utils.config import ConfigError
from myriad.utils.seeding import make_generator

# A host read of "has every env finished?" every this many steps lets evaluation stop early
# without a sync on every step.
_CHECK_EVERY = 16

#: Values of ``eval.perturb``.
PERTURBATIONS = ("block_leader_route",)


class MemberScores(NamedTuple):
    """Per evaluated member, over its episodes: ``success`` rate and mean ``returns`` (``[K]``
    float tensors on the CPU; ``success`` is 0 for envs that report no success flag)."""

    success: torch.Tensor
    returns: torch.Tensor


@dataclass
class EpisodeBatch:
    """The first episode of every env of one evaluation rollout (CPU tensors).

    Attributes:
        member: ``[N]`` member that acted.
        success: ``[N]`` bool (False where the env reports no success flag).
        returns: ``[N]`` episode return.
        has_success: the env reports a success flag.
        length: ``[N]`` episode length in steps (the time limit for an episode still running
            when the rollout stopped).
        features: ``[N, T + 1, p]`` entropy features of the start state and of every step's
            state, or None when not recorded.
        valid: ``[N, T + 1]`` bool, the states that belong to each episode (None with
            ``features``).
    """

    member: torch.Tensor
    success: torch.Tensor
    returns: torch.Tensor
    has_success: bool
    length: torch.Tensor | None = None
    features: torch.Tensor | None = None
    valid: torch.Tensor | None = None

    def scores(self, num: int) -> MemberScores:
        """Success rate and mean return of each of the ``num`` equal blocks of episodes."""
        return MemberScores(
            self.success.float().view(num, -1).mean(dim=1),
            self.returns.view(num, -1).mean(dim=1),
        )


@torch.no_grad()
def rollout_members(
    model: PopulationActorCritic,
    make_env: Callable[[int], VecEnv],
    members: Sequence[int],
    episodes: int,
    *,
    deterministic: bool,
    seed: int,
    record_features: bool = False,
) -> EpisodeBatch:
    """Run ``episodes`` episodes of each of ``members`` in one batched rollout.

    Member ``members[k]`` acts in envs ``k * episodes .. (k + 1) * episodes - 1`` of one batched
    env built by ``make_env(num_envs)``; each env's first episode counts. The env's reset and
    the action sampling are seeded with ``seed``, so the result is reproducible and consumes
    no global randomness.

    Args:
        model: the population.
        make_env: builds the task env with the given number of envs.
        members: the members to evaluate (repeats allowed).
        episodes: episodes per member.
        deterministic: act with the policy means instead of sampling.
        seed: env reset and action-sampling seed.
        record_features: keep the entropy features of every state (memory
            ``N * (T + 1) * p`` floats, T the longest episode).
    """
    k = len(members)
    env = make_env(k * episodes)
    try:
        device = env.device
        member = torch.as_tensor(list(members), dtype=torch.long, device=device)
        member = member.repeat_interleave(episodes)
        blocked = member_blocks(member, model.num_members)
        generator = make_generator(seed, device)
        obs = env.reset(seed)
        n = env.num_envs
        finished = torch.zeros(n, dtype=torch.bool, device=device)
        returns = torch.zeros(n, device=device)
        success = torch.zeros(n, dtype=torch.bool, device=device)
        length = torch.zeros(n, dtype=torch.long, device=device)
        has_success = False
        trajectory = [env.current_features()] if record_features else []
        for step in range(env.max_episode_steps):
            actions = model.act(
                obs, member, generator, deterministic=deterministic, blocked=blocked
            ).actions
            obs, _, terminated, truncated, info = env.step(actions)
            done = info.get("done")
            if done is None:
                done = terminated | truncated
            first = done & ~finished
            returns = torch.where(first, info["episode_return"].to(returns.dtype), returns)
            length = torch.where(first, step + 1, length)
            if "success" in info:
                has_success = True
                success |= first & info["success"]
            if record_features:
                trajectory.append(info["features"])
            finished |= done
            if (step + 1) % _CHECK_EVERY == 0 and bool(finished.all()):
                break
        # An env still running at the time limit ended there (TensorVecEnv truncates it).
        length = torch.where(finished, length, torch.full_like(length, step + 1))
    finally:
        env.close()
    batch = EpisodeBatch(member.cpu(), success.cpu(), returns.cpu(), has_success, length.cpu())
    if record_features:
        features = torch.stack(trajectory, dim=1)  # [N, T + 1, p]
        steps = torch.arange(features.shape[1], device=device)
        batch.features = features.cpu()
        batch.valid = (steps.unsqueeze(0) <= length.unsqueeze(1)).cpu()
    return batch


@dataclass
class PopulationEvaluation:
    """One evaluation of every member (deterministic actions, fresh envs).

    Attributes:
        scalars: ``eval/leader_success``, ``eval/leader_return``, ``eval/population_success``
            (the best member's success rate) and ``eval/distinct_solutions``.
        member_success: ``[M]`` success rate per member.
        solutions: the successful episodes grouped into solutions.
        member_route: ``[M]`` each member's most frequent solution (-1: no success).
        episodes: the episodes, with their features.
    """

    scalars: dict[str, float]
    member_success: torch.Tensor
    solutions: Solutions
    member_route: torch.Tensor
    episodes: EpisodeBatch

    def to_dict(self, regions: RegionMap) -> dict[str, Any]:
        """Plain summary: per-member success and route label, and the solutions."""
        labels = self.solutions.labels
        names = region_names(regions)
        return {
            "member_success": [round(float(s), 6) for s in self.member_success],
            "member_route": [labels[r] if r >= 0 else None for r in self.member_route.tolist()],
            **self.solutions.to_dict(names),
        }


def region_names(regions: RegionMap) -> list[str] | None:
    """Names of a layout's regions (``corridor 3``, ``junction 0``), None for a plain grid."""
    if regions.junction is None:
        return None
    return [f"{'junction' if j else 'corridor'} {i}" for i, j in enumerate(regions.junction)]


class PopulationEvaluator:
    """The finetuning runner's evaluation (module docstring).

    Args:
        make_env: ``make_env(num_envs, **option_overrides)`` builds the task env.
        num_members: M.
        seed: evaluation seed (the same envs at every evaluation).
        regions: the region map of the solutions metric (:meth:`RegionMap.for_env`).
        min_share: a solution counts with at least this share of the successful episodes.
        perturb: None or ``"block_leader_route"``.
    """

    def __init__(
        self,
        make_env: Callable[..., VecEnv],
        num_members: int,
        seed: int,
        regions: RegionMap,
        min_share: float = DEFAULT_MIN_SHARE,
        perturb: str | None = None,
    ) -> None:
        if perturb is not None and perturb not in PERTURBATIONS:
            raise ConfigError(
                f"eval.perturb={perturb!r} is not known; use one of {list(PERTURBATIONS)} or null"
            )
        if perturb is not None and regions.layout is None:
            raise ConfigError(
                f"eval.perturb={perturb} walls off cells of a navigation layout; this env has no "
                "layout (use a nav env, or eval.perturb=null)"
            )
        if not 0.0 <= min_share <= 1.0:
            raise ConfigError(f"eval.solution_share must be in [0, 1], got {min_share}")
        self.make_env = make_env
        self.num_members = num_members
        self.seed = seed
        self.regions = regions
        self.min_share = float(min_share)
        self.perturb = perturb

    @classmethod
    def from_config(
        cls,
        eval_cfg: dict[str, Any],
        env: VecEnv,
        make_env: Callable[..., VecEnv],
        num_members: int,
        seed: int,
    ) -> PopulationEvaluator:
        """From the run's ``eval`` config (``solution_share``, ``solution_bins``, ``perturb``)."""
        bins = int(eval_cfg.get("solution_bins", DEFAULT_GRID_BINS))
        try:
            regions = RegionMap.for_env(env, bins)
        except ValueError as error:
            raise ConfigError(f"eval.solution_bins={bins}: {error}") from None
        return cls(
            make_env,
            num_members,
            seed,
            regions,
            float(eval_cfg.get("solution_share", DEFAULT_MIN_SHARE)),
            eval_cfg.get("perturb"),
        )

    def evaluate(
        self, model: PopulationActorCritic, leader: int, episodes: int, **env_overrides: Any
    ) -> PopulationEvaluation:
        """Every member for ``episodes`` deterministic episodes in one batched rollout."""
        batch = rollout_members(
            model,
            lambda n: self.make_env(n, **env_overrides),
            list(range(self.num_members)),
            episodes,
            deterministic=True,
            seed=self.seed,
            record_features=True,
        )
        scores = batch.scores(self.num_members)
        assert batch.features is not None and batch.valid is not None
        region_ids, valid = self.regions.route_states(batch.features, batch.valid)
        solutions = distinct_solutions(
            region_ids,
            valid,
            batch.success if batch.has_success else None,
            self.min_share,
        )
        scalars = {"eval/leader_return": float(scores.returns[leader])}
        if batch.has_success:  # an env without a success flag has no success rates to report
            scalars["eval/leader_success"] = float(scores.success[leader])
            scalars["eval/population_success"] = float(scores.success.max())
        scalars["eval/distinct_solutions"] = float(solutions.count)
        return PopulationEvaluation(
            scalars,
            scores.success,
            solutions,
            solutions.member_routes(batch.member, self.num_members),
            batch,
        )

    def sampled(self, model: PopulationActorCritic, leader: int, episodes: int) -> dict[str, float]:
        """Every member for ``episodes`` episodes with sampled actions, as in training, in one
        batched rollout of the same envs: ``eval/leader_return_sampled`` and, where the env
        reports success, ``eval/leader_success_sampled`` and ``eval/population_success_sampled``.
        A wide policy's mean action can fail where its samples succeed (docs/finetune.md)."""
        batch = rollout_members(
            model,
            self.make_env,
            list(range(self.num_members)),
            episodes,
            deterministic=False,
            seed=self.seed,
        )
        scores = batch.scores(self.num_members)
        scalars = {"eval/leader_return_sampled": float(scores.returns[leader])}
        if batch.has_success:
            scalars["eval/leader_success_sampled"] = float(scores.success[leader])
            scalars["eval/population_success_sampled"] = float(scores.success.max())
        return scalars

    def robustness(
        self,
        model: PopulationActorCritic,
        leader: int,
        episodes: int,
        before: PopulationEvaluation,
    ) -> tuple[dict[str, Any], PopulationEvaluation | None, Layout | None]:
        """Evaluate again with the leader's route walled off (``eval.perturb``).

        The route is the leader's most frequent solution in ``before`` (or, if the leader never
        succeeded, the population's largest); the walls go on its corridors that no other
        counted solution uses (all of its corridors if it shares every one). Returns the
        report (success of the best member and of the leader, before and after, and the
        walled cells), the perturbed evaluation and the perturbed layout (None when nothing
        could be evaluated: no member succeeded, or the walls cut the start off the goal,
        which scores 0 after).
        """
        layout = self.regions.layout
        assert layout is not None
        report: dict[str, Any] = {
            "perturb": self.perturb,
            "before": {
                "population_success": before.scalars["eval/population_success"],
                "leader_success": before.scalars["eval/leader_success"],
            },
        }
        route = int(before.member_route[leader])
        report["route_of"] = "leader"
        if route < 0 and len(before.solutions.sizes):
            route, report["route_of"] = 0, "population"
        if route < 0:
            report.update(
                route_of=None, after=None, blocked_cells=[], reason="no member reached the goal"
            )
            return report, None, None
        blocked = exclusive_regions(before.solutions, route, self.regions)
        grid, _ = layout_regions(layout)
        cells = np.argwhere(np.isin(grid, blocked))
        report["route"] = before.solutions.labels[route]
        report["blocked_regions"] = blocked
        report["blocked_cells"] = [[int(r), int(c)] for r, c in cells]
        try:
            perturbed = blocked_layout(layout, grid, blocked)
        except LayoutError:
            perturbed = None
        probe = self.make_env(1)
        assert isinstance(probe, PointNavEnv)  # the env of a layout is a nav env
        try:
            goals = [(math.floor(x), math.floor(y)) for x, y in probe.goal_set.tolist()]
        finally:
            probe.close()
        reachable = perturbed is not None and all(
            perturbed.reachable_xy()[ix, iy] for ix, iy in goals
        )
        report["goal_reachable"] = bool(reachable)
        if not reachable:
            report["after"] = {"population_success": 0.0, "leader_success": 0.0}
            report["reason"] = "walling off the route cuts the start off the goal"
            return report, None, None
        assert perturbed is not None
        after = self.evaluate(model, leader, episodes, layout=perturbed.text())
        report["after"] = {
            "population_success": after.scalars["eval/population_success"],
            "leader_success": after.scalars["eval/leader_success"],
            "distinct_solutions": after.scalars["eval/distinct_solutions"],
            "member_success": [round(float(s), 6) for s in after.member_success],
        }
        return report, after, perturbed
