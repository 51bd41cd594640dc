"""How this process takes part in a run: the collaborator a runner receives.

A runner is written once, for the whole run; what differs when the run is spread over the ranks
of a ``torchrun`` launch (which envs this process steps, who writes the run folder, which
tensors are combined over the processes) is asked of its :class:`ProcessRole`.
:class:`SingleProcess` is the default: every env, the writer, nothing sent. The torchrun role
(:class:`~myriad.distributed.torchdist.runner.RankRole`) sits in the distributed layer and is
chosen by the command layer; the runners never import it.
"""

from __future__ import annotations

from typing import Any, Protocol, TypeVar

import torch
from torch import nn

from myriad.nn.population import PopulationActorCritic
from myriad.rl.collector import EpisodeTracker
from myriad.rl.ppo import PPO
from myriad.rl.storage import RolloutStorage
from myriad.utils.logging import ScalarLogger

T = TypeVar("T")


class Stateful(Protocol):
    """What a checkpoint entry provides."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ProcessRole(Protocol):
    """This process's part in a run (see the module docstring).

    Every method is called on every process of the run at the same point, so the torchrun role
    may run collectives in any of them.
    """

    @property
    def world_size(self) -> int:
        """Processes the run is spread over (checkpoints resume with as many)."""
        ...

    @property
    def is_writer(self) -> bool:
        """Whether this process writes the run folder (config, events, summary, plots,
        checkpoints, dataset, videos) and reports; the others keep their scalars in memory."""
        ...

    def env_shard(self, num_envs: int, num_members: int, seed: int) -> tuple[slice, int]:
        """The envs of the run this process steps, and the seed of their random streams."""
        ...

    def all_gather(self, local: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """Per-env tensors of this process's envs (along ``dim``) -> those of every env."""
        ...

    def gather_rows(self, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Dataset rows ``[T, E_local, ...]`` per column -> every process's ``[T, E, ...]`` on
        the writer (empty elsewhere)."""
        ...

    def whole_rollout(self, local: RolloutStorage, member: torch.Tensor) -> RolloutStorage:
        """The storage of the whole run's rollout (``member [E]``) that :meth:`gather_rollout`
        fills from this process's ``local`` one; ``local`` itself in one process."""
        ...

    def gather_rollout(self, local: RolloutStorage, whole: RolloutStorage) -> None:
        """Fill ``whole`` with every process's ``local`` rollout (nothing in one process)."""
        ...

    def track_episodes(self, tracker: EpisodeTracker) -> EpisodeTracker:
        """The episode tracker whose reads cover the finished episodes of every process."""
        ...

    def collector_entry(self, collector: Stateful) -> Stateful:
        """The checkpoint entry of this process's collector (envs, observations, episode sums,
        generators), which differs between processes."""
        ...

    def prepare(self, model: PopulationActorCritic, algorithm: PPO, split: str | None) -> None:
        """Make the replicas of ``model`` start equal and stay so under ``algorithm``'s updates.

        ``split``: how the processes share the update: ``"envs"`` (each learns from its own
        envs' rows; gradients averaged, normalisers merged), ``"rows"`` (each learns from its
        share of every minibatch of the gathered rollout; gradients averaged) or None (the
        whole update everywhere)."""
        ...

    def share_state(self, obj: Stateful) -> None:
        """Give every process the writer's state of ``obj``."""
        ...

    def share_module(self, module: nn.Module) -> None:
        """Give every process the writer's parameters and buffers of ``module``."""
        ...

    def broadcast(self, obj: T) -> T:
        """The writer's ``obj`` (picklable) on every process."""
        ...

    def measurement(self, local: T, envs: slice) -> T:
        """Pretraining's entropy measurement for this process's ``envs``: ``local`` (an
        :class:`~myriad.pretrain.objectives.EntropyMeasurement`) in one process, one that
        measures the whole population from every process's features on a rank."""
        ...

    def checkpoint_extras(self, model: nn.Module) -> dict[str, Any]:
        """Entries the checkpoint payload gains (a check that the replicas agree)."""
        ...

    def after_resume(self) -> None:
        """Called once a checkpoint is restored (a rank takes back its own generators)."""
        ...

    def logger(self) -> ScalarLogger | None:
        """The logger of a process that does not write (None: the runner's own)."""
        ...


class SingleProcess:
    """The whole run in this process: every env, the writer, nothing combined."""

    world_size = 1
    is_writer = True

    def env_shard(self, num_envs: int, num_members: int, seed: int) -> tuple[slice, int]:
        return slice(0, num_envs), seed

    def all_gather(self, local: torch.Tensor, dim: int = 1) -> torch.Tensor:
        return local

    def gather_rows(self, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return rows

    def whole_rollout(self, local: RolloutStorage, member: torch.Tensor) -> RolloutStorage:
        return local

    def gather_rollout(self, local: RolloutStorage, whole: RolloutStorage) -> None:
        pass

    def track_episodes(self, tracker: EpisodeTracker) -> EpisodeTracker:
        return tracker

    def collector_entry(self, collector: Stateful) -> Stateful:
        return collector

    def prepare(self, model: PopulationActorCritic, algorithm: PPO, split: str | None) -> None:
        pass

    def share_state(self, obj: Stateful) -> None:
        pass

    def share_module(self, module: nn.Module) -> None:
        pass

    def broadcast(self, obj: T) -> T:
        return obj

    def measurement(self, local: T, envs: slice) -> T:
        return local

    def checkpoint_extras(self, model: nn.Module) -> dict[str, Any]:
        return {}

    def after_resume(self) -> None:
        pass

    def logger(self) -> ScalarLogger | None:
        return None
