"""K-Myriad pretraining over the ranks of a ``torchrun`` launch (docs/distributed.md).

Every rank holds the whole population (any parameterisation) and steps the envs of its members
only. Per iteration: collect locally; gather the entropy features of all ranks and measure
(:class:`~myriad.distributed.torchdist.measure.RankEntropyMeasurement`: the entropies and
coverage of the whole population on every rank, the reward of its own states); PPO on the
rank's own samples with gradients averaged over the ranks
(:class:`~myriad.distributed.torchdist.sync.GradientAverager`), so the replicas stay identical;
rank 0 receives every rank's transitions and writes the one dataset, in the row order of a
single-process run.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from myriad.distributed.torchdist.group import RankGroup, check_sharding
from myriad.distributed.torchdist.measure import RankEntropyMeasurement
from myriad.distributed.torchdist.runner import RankLocalState, RankRunnerMixin, train_on_ranks
from myriad.distributed.torchdist.sync import (
    GradientAverager,
    SummedEpisodeTracker,
    broadcast_module_,
    share_normalizers,
)
from myriad.pretrain.runner import PretrainRunner
from myriad.utils.config import ConfigError
from myriad.utils.launch import RunRequest


def check_launch(cfg: Mapping[str, Any], world_size: int) -> None:
    """Refuse, before anything is built, what a sharded pretraining cannot run.

    Raises:
        ConfigError: members that do not split over the ranks, the importance-weighted
            objective (its inner steps weigh every state by the whole population's policy),
            or Ray env workers combined with ranks.
    """
    check_sharding(int(cfg["population"]["size"]), world_size)
    if str(cfg["objective"]["name"]) != "knn_reward":
        raise ConfigError(
            f"objective={cfg['objective']['name']} runs in one process only; under torchrun use "
            "objective=knn_reward"
        )
    if cfg.get("distributed"):
        raise ConfigError(
            "distributed=local|cluster (envs on Ray workers) and torchrun ranks do not combine: "
            "drop distributed= or launch without torchrun"
        )


class _RowsSentToWriter:
    """The dataset of a rank other than 0: its rows went to rank 0 in ``_rollout_rows``."""

    def record(self, rows: Mapping[str, torch.Tensor]) -> None:
        pass

    def finish(self, iteration: int) -> None:
        return None

    def cut_episodes(self) -> int:
        return 0  # rank 0's recorder stages (and cuts) every rank's episodes

    def close(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: Mapping[str, Any], iteration: int) -> None:
        pass


class ShardedPretrainRunner(RankRunnerMixin, PretrainRunner):
    """:class:`~myriad.pretrain.runner.PretrainRunner` on one rank of a launch (arguments:
    :class:`~myriad.distributed.torchdist.runner.RankRunnerMixin`)."""

    check_launch = staticmethod(check_launch)

    def __init__(
        self, cfg: Mapping[str, Any], run_dir: str | os.PathLike[str], ranks: RankGroup
    ) -> None:
        super().__init__(cfg, run_dir, ranks)
        cfg = self.config
        envs = ranks.env_shard(len(self.member), self.num_members)
        # Seeded alike, the replicas start equal; the broadcast makes sure of it (GPU inits).
        broadcast_module_(self.model, ranks)
        share_normalizers(self.model, ranks)
        self.algorithm.grad_sync = GradientAverager(ranks, self.algorithm.parameters)
        obj_cfg = cfg["objective"]
        self.measure = RankEntropyMeasurement(
            ranks,
            envs,
            int(obj_cfg["k"]),
            self.num_members,
            self.env.features.dim,
            backend=str(obj_cfg.get("backend", "auto")),
            min_distance=float(obj_cfg.get("min_distance", 1e-3)),
        )
        self.collector.episodes = SummedEpisodeTracker(self.collector.episodes, ranks)
        self.rank_state = RankLocalState(ranks, self.collector)
        if not ranks.is_writer:
            self.videos = None
            if self.dataset is not None:
                self.dataset = _RowsSentToWriter()  # type: ignore[assignment]

    # -- the rank's share --------------------------------------------------------------------
    def env_shard(self, num_envs: int, num_members: int, seed: int) -> tuple[slice, int]:
        return self.ranks.env_shard(num_envs, num_members), self.ranks.stream_seed(seed)

    def _gathered(self, local: torch.Tensor, dim: int = 1) -> torch.Tensor:
        return self.ranks.all_gather_cat(local, dim)

    def _rollout_rows(self) -> dict[str, torch.Tensor]:
        """Every rank's transitions, ``[T, E, ...]`` per column, on rank 0 (empty elsewhere)."""
        rows = super()._rollout_rows()
        gathered = {name: self.ranks.gather_cat(value, dim=1) for name, value in rows.items()}
        return {k: v for k, v in gathered.items() if v is not None}

    def state_objects(self) -> dict[str, Any]:
        return {**super().state_objects(), "collector": self.rank_state}

    @torch.no_grad()
    def evaluate(self, episodes: int = 1) -> dict[str, Any]:
        """Rank 0 evaluates the whole population alone (the replicas are equal)."""
        if not self.ranks.is_writer:
            return {}
        return super().evaluate(episodes)

    def finish(self) -> dict[str, Any]:
        """Rank 0's summary, on every rank."""
        return self.ranks.broadcast_object(super().finish())


def pretrain_on_ranks(request: RunRequest) -> dict[str, Any]:
    """:func:`myriad.pretrain.pretrain` on this rank of a ``torchrun`` launch (its arguments in
    ``request``, the same result; rank 0 chooses the run folder and prints the report)."""
    from myriad.pretrain.api import report, resolve_config

    def configure(world_size: int) -> dict[str, Any]:
        cfg = resolve_config(request.overrides, request.resume)
        check_launch(cfg, world_size)
        return cfg

    summary, folder, ranks = train_on_ranks(
        "pretrain",
        configure,
        lambda cfg: str(cfg["env"]["name"]),
        ShardedPretrainRunner,
        resume=request.resume,
        run_dir=request.run_dir,
        overwrite=request.overwrite,
    )
    if ranks.is_writer and not request.quiet:
        report(summary, folder)
    ranks.close()
    return summary
