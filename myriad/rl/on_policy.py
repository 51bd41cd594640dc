"""The on-policy runner base: collect a rollout, update, log, checkpoint.

:class:`OnPolicyRunner` owns the collector and the rollout storage of a population acting in a
VecEnv. :func:`population_setup` is the one place a run config becomes its seed, environments and
population; the pretraining and finetuning runners call it, choose their algorithm, and hand the
pieces to :class:`OnPolicyRunner`, adding only what differs (the entropy objective and dataset;
the task evaluation and diagnostics).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from myriad.envs import RemoteEnvFactory, make_from_config
from myriad.envs.base import TensorVecEnv, VecEnv
from myriad.nn.population import (
    PopulationActorCritic,
    block_members,
    build_population,
    check_population,
)
from myriad.rl.collector import RolloutCollector
from myriad.rl.ppo import PPO
from myriad.rl.runner import RunnerBase, plain_config
from myriad.utils.seeding import make_generator, seed_everything

#: ``env_shard(num_envs, num_members, seed) -> (envs this process steps, their seed)``.
EnvShard = Callable[[int, int, int], tuple[slice, int]]


def whole_run(num_envs: int, num_members: int, seed: int) -> tuple[slice, int]:
    """The envs of a single-process run: all of them, seeded with the run's seed."""
    return slice(0, num_envs), seed


@dataclass
class PopulationSetup:
    """A run config's seed, environments and population, built in that order.

    Attributes:
        config: the resolved config as plain Python values.
        seed: the run's seed (already applied to Python, NumPy and torch).
        env: the environments this process steps (``envs.stop - envs.start`` of them).
        model: the population, on ``env.device``.
        member: ``[E]`` the member acting in each env of the whole run (contiguous blocks).
        envs: the slice of ``member`` this process steps (all of it in one process).
        env_seed: the seed of this process's env resets and action sampling.
    """

    config: dict[str, Any]
    seed: int
    env: VecEnv
    model: PopulationActorCritic
    member: torch.Tensor
    envs: slice
    env_seed: int


def population_setup(
    cfg: Mapping[str, Any],
    env_shard: EnvShard = whole_run,
    min_states: int | None = None,
    remote_envs: RemoteEnvFactory | None = None,
) -> PopulationSetup:
    """Seed, check the population layout, make the envs and the population of a run config.

    Args:
        cfg: the run config (``seed``, ``num_envs``, ``num_steps``, ``device``, ``env``,
            ``population``, optional ``distributed``).
        env_shard: which envs this process steps (torchrun ranks step a share).
        min_states: each member must collect more than this many states per rollout (the
            k-NN objective's ``k``).
        remote_envs: builds the envs of a config with a ``distributed`` entry (chosen by the
            command layer; see :func:`~myriad.envs.registry.make_from_config`).

    Raises:
        ConfigError: the layout does not split (the message gives the nearest sizes that do).
    """
    config = plain_config(cfg)
    seed = int(config["seed"])
    seed_everything(seed)
    num_envs, size = int(config["num_envs"]), int(config["population"]["size"])
    ppo = config.get("ppo")
    minibatches = (
        int(ppo["minibatches"]) if isinstance(ppo, dict) and "minibatches" in ppo else None
    )
    check_population(num_envs, size, int(config["num_steps"]), min_states, minibatches)
    envs, env_seed = env_shard(num_envs, size, seed)
    env = make_from_config(
        config["env"],
        envs.stop - envs.start,
        config["device"],
        config.get("distributed"),
        remote=remote_envs,
    )
    model = build_population(config["population"], env.obs_dim, env.action_dim).to(env.device)
    member = block_members(num_envs, model.num_members, env.device)
    return PopulationSetup(config, seed, env, model, member, envs, env_seed)


def runner_settings(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The :class:`RunnerBase` options of a run config's top-level keys."""
    return {
        "progress": bool(cfg.get("progress", True)),
        "tensorboard": bool(cfg.get("tensorboard", True)),
        "plots": bool(cfg.get("plots", True)),
        "checkpoint_every": int(cfg.get("checkpoint_every", 0)),
        "keep_checkpoints": cfg.get("keep_checkpoints"),
        "console_every": int((cfg.get("console") or {}).get("every", 0)),
        "console_every_s": float((cfg.get("console") or {}).get("every_s", 10.0)),
        "logger": str(cfg.get("logger", "tensorboard")),
        "wandb": dict(cfg.get("wandb") or {}),
    }


#: Keys of a stage's run config (pretraining, finetuning) that a resumed run may change: how far
#: it goes, its final evaluation, its threads and videos, none of which the saved state depends on.
STAGE_RESUME_IGNORED_KEYS: tuple[str, ...] = ("iterations", "eval.*", "torch_threads", "video.*")


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
        store_transitions: keep next observations and entropy features in the storage.
        desync: spread the first episodes' ends (torch envs only): envs reset together would
            also end together, and every rollout should mix episode phases from the start.
        **runner_options: :class:`RunnerBase` options (progress, checkpoint_every, role, ...).
            With a ``role`` over several processes, ``env`` holds this process's envs and
            ``member`` their members; episode statistics cover every process's episodes.
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
        store_transitions: bool = False,
        desync: bool = False,
        **runner_options: Any,
    ) -> None:
        super().__init__(config, run_dir, **runner_options)
        self.env = env
        self.model = model
        self.algorithm = algorithm
        self.collector = RolloutCollector(
            env,
            model,
            member,
            generator=make_generator(seed, env.device),
            store_transitions=store_transitions,
        )
        self.storage = self.collector.make_storage(num_steps)
        self.collector.reset(seed)
        if desync and isinstance(env, TensorVecEnv):
            env.randomize_episode_progress()
        self.collector.episodes = self.role.track_episodes(self.collector.episodes)
        #: The collector's checkpoint entry (on a rank, every rank's collector).
        self.collector_state = self.role.collector_entry(self.collector)

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
        return {"model": self.model, "algorithm": self.algorithm, "collector": self.collector_state}

    def checkpoint(self) -> dict[str, Any]:
        return {**super().checkpoint(), **self.role.checkpoint_extras(self.model)}
