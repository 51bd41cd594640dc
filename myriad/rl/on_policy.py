"""A complete on-policy runner: collect a rollout, update, log, checkpoint."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from myriad.envs.base import VecEnv
from myriad.nn.population import PopulationActorCritic
from myriad.rl.collector import RolloutCollector
from myriad.rl.ppo import PPO
from myriad.rl.runner import RunnerBase
from myriad.utils.seeding import make_generator


class OnPolicyRunner(RunnerBase):
    """PPO (or any :class:`PPO` subclass) on a VecEnv with a population model.

    Each iteration collects ``num_steps`` steps of every env, runs ``algorithm.update`` and
    logs ``train/*`` (the update's stats) and ``episode/*`` (finished episodes).

    Args:
        env: the environments; ``env.num_envs`` must be a multiple of the population size
            unless ``member`` is given.
        model: the population.
        algorithm: the update rule (owns the optimiser).
        config: the resolved run config (see :class:`RunnerBase`).
        run_dir: the run directory.
        num_steps: rollout length T.
        seed: seeds the env reset and the action-sampling generator.
        member: ``[E]`` member of each env (default: contiguous equal blocks).
        **runner_options: :class:`RunnerBase` options (progress, checkpoint_every, ...).
    """

    def __init__(
        self,
        env: VecEnv,
        model: PopulationActorCritic,
        algorithm: PPO,
        config: Mapping[str, Any] | Any,
        run_dir: str | os.PathLike[str],
        *,
        num_steps: int,
        seed: int = 0,
        member: torch.Tensor | None = None,
        **runner_options: Any,
    ) -> None:
        super().__init__(config, run_dir, **runner_options)
        self.env = env
        self.model = model
        self.algorithm = algorithm
        self.collector = RolloutCollector(
            env, model, member, generator=make_generator(seed, env.device)
        )
        self.storage = self.collector.make_storage(num_steps)
        self.collector.reset(seed)

    @property
    def steps_per_iteration(self) -> int:
        return self.storage.num_steps * self.storage.num_envs

    def iteration(self) -> dict[str, float]:
        self.collector.collect(self.storage)
        stats = self.algorithm.update(self.storage)
        out = {f"train/{k}": v for k, v in stats.items()}
        out.update(self.collector.episodes.summary())
        return out

    def state_objects(self) -> dict[str, Any]:
        return {"model": self.model, "algorithm": self.algorithm, "collector": self.collector}
