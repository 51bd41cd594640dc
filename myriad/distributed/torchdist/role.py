"""The part a rank of a ``torchrun`` launch takes in a run: :class:`RankRole`.

A runner given a :class:`RankRole` (a :class:`~myriad.rl.roles.ProcessRole`) runs the same code
as in one process and asks the role wherever the ranks differ:

- each rank steps an equal contiguous block of the run's envs (whole members when the ranks
  divide the population) with its own random streams;
- the replicas of the model start equal (rank 0's parameters and algorithm state) and stay so:
  gradients averaged, normalisers merged or the update's rows shared over the ranks;
- finished episodes are summed over the ranks, rollouts and entropy features gathered;
- rank 0 writes the run folder (config, TensorBoard events, ``summary.json``, plots, checkpoints,
  dataset); the other ranks keep their scalars in memory only. A checkpoint is one file written
  by rank 0 holding the replicated state once and, under its ``collector`` entry, the state of
  every rank's envs, observations, episode sums and random generators (gathered at save time);
  on resume each rank takes its own entry back. A checkpoint records how many processes wrote it
  and is resumed with as many (:class:`~myriad.rl.runner.RunnerBase` refuses otherwise).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any, TypeVar, cast

import torch
from torch import nn

from myriad.distributed.torchdist.group import RankGroup
from myriad.distributed.torchdist.measure import RankEntropyMeasurement
from myriad.distributed.torchdist.rollout import gather_rollout, rollout_like
from myriad.distributed.torchdist.sync import (
    GradientAverager,
    SummedEpisodeTracker,
    broadcast_module_,
    replica_difference,
    share_normalizers,
)
from myriad.nn.population import PopulationActorCritic
from myriad.pretrain.objectives import EntropyMeasurement
from myriad.rl.collector import EpisodeTracker
from myriad.rl.ppo import PPO
from myriad.rl.roles import Stateful
from myriad.rl.row_share import RowShare
from myriad.rl.storage import RolloutStorage
from myriad.utils.checkpoint import CheckpointError, capture_rng_state, restore_rng_state
from myriad.utils.logging import ScalarLogger

T = TypeVar("T")


class HistoryOnlyLogger(ScalarLogger):
    """The logger of a rank other than 0: keeps the history, writes nothing."""

    def __init__(self) -> None:
        super().__init__(None, tensorboard=False)

    def write_summary(self, path: str | os.PathLike[str], **extra: Any) -> Path:
        return Path(path)

    def plot(self, *args: Any, **kwargs: Any) -> list[Path]:
        return []


class RankLocalState:
    """Checkpoint entry of what differs between ranks: the collector (envs, observations,
    episode sums, sampling generator) and the global random generators.

    ``state_dict`` is a collective (every rank calls it; rank 0 receives every rank's state);
    ``load_state_dict`` takes this rank's entry and keeps its generators for :meth:`restore_rng`,
    which the role calls after the runner has restored rank 0's.
    """

    def __init__(self, ranks: RankGroup, collector: Stateful) -> None:
        self.ranks, self.collector = ranks, collector
        self._pending_rng: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        mine = {"collector": self.collector.state_dict(), "rng": capture_rng_state()}
        return {"world_size": self.ranks.world_size, "ranks": self.ranks.gather_objects(mine)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "ranks" not in state or int(state["world_size"]) != self.ranks.world_size:
            saved = state.get("world_size", 1)
            raise CheckpointError(
                f"the checkpoint holds the envs of {saved} process(es), this launch has "
                f"{self.ranks.world_size}: resume with --nproc_per_node={saved}"
            )
        mine = state["ranks"][self.ranks.rank]
        self.collector.load_state_dict(mine["collector"])
        self._pending_rng = mine["rng"]

    def restore_rng(self) -> None:
        if self._pending_rng is not None:
            restore_rng_state(self._pending_rng)
            self._pending_rng = None


class RankRole:
    """:class:`~myriad.rl.roles.ProcessRole` of one rank of a launch (see the module docstring).

    Args:
        ranks: the process group.
    """

    def __init__(self, ranks: RankGroup) -> None:
        self.ranks = ranks
        self._local_state: RankLocalState | None = None

    @property
    def world_size(self) -> int:
        return self.ranks.world_size

    @property
    def is_writer(self) -> bool:
        return self.ranks.is_writer

    def env_shard(self, num_envs: int, num_members: int, seed: int) -> tuple[slice, int]:
        # Equal contiguous blocks: whole members when the ranks divide the population.
        return self.ranks.env_block(num_envs), self.ranks.stream_seed(seed)

    def all_gather(self, local: torch.Tensor, dim: int = 1) -> torch.Tensor:
        return self.ranks.all_gather_cat(local, dim)

    def gather_rows(self, rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        gathered = {name: self.ranks.gather_cat(value, dim=1) for name, value in rows.items()}
        return {k: v for k, v in gathered.items() if v is not None}

    def whole_rollout(self, local: RolloutStorage, member: torch.Tensor) -> RolloutStorage:
        return rollout_like(local, member)

    def gather_rollout(self, local: RolloutStorage, whole: RolloutStorage) -> None:
        gather_rollout(self.ranks, local, whole)

    def track_episodes(self, tracker: EpisodeTracker) -> EpisodeTracker:
        return SummedEpisodeTracker(tracker, self.ranks)

    def collector_entry(self, collector: Stateful) -> Stateful:
        self._local_state = RankLocalState(self.ranks, collector)
        return self._local_state

    def prepare(self, model: PopulationActorCritic, algorithm: PPO, split: str | None) -> None:
        broadcast_module_(model, self.ranks)
        if split is None:
            return
        algorithm.grad_sync = GradientAverager(self.ranks, algorithm.parameters)
        if split == "envs":
            share_normalizers(model, self.ranks)
        elif split == "rows":
            r = self.ranks
            algorithm.set_share(RowShare(r.rank, r.world_size, r.all_reduce_, r.all_gather_cat))

    def share_state(self, obj: Stateful) -> None:
        if self.ranks.is_writer:
            self.ranks.broadcast_object(obj.state_dict())
        else:
            obj.load_state_dict(self.ranks.broadcast_object(None))

    def share_module(self, module: nn.Module) -> None:
        broadcast_module_(module, self.ranks)

    def broadcast(self, obj: T) -> T:
        return cast(T, self.ranks.broadcast_object(obj))

    def measurement(self, local: T, envs: slice) -> T:
        if not isinstance(local, EntropyMeasurement):
            raise TypeError(f"a rank measures with an EntropyMeasurement, not {type(local)}")
        return cast(T, RankEntropyMeasurement.sharing(local, self.ranks, envs))

    def checkpoint_extras(self, model: nn.Module) -> dict[str, Any]:
        """The largest difference between the ranks' replicas of ``model``, 0.0 when they are
        identical (a collective)."""
        difference = replica_difference(model, self.ranks)
        if difference and self.ranks.is_writer:
            warnings.warn(
                f"the ranks' copies of the model differ by up to {difference:.3g}; the run "
                "continues with each rank's own copy",
                RuntimeWarning,
                stacklevel=2,
            )
        return {"replica_max_abs_diff": difference}

    def after_resume(self) -> None:
        if self._local_state is not None:
            self._local_state.restore_rng()

    def logger(self) -> ScalarLogger | None:
        return None if self.ranks.is_writer else HistoryOnlyLogger()
