"""K-Myriad pretraining over the ranks of a ``torchrun`` launch (docs/distributed.md).

:class:`~myriad.pretrain.runner.PretrainRunner` runs on every rank with a
:class:`~myriad.distributed.torchdist.role.RankRole`. Every rank holds the whole population (any
parameterisation) and steps the envs of its members only. Per iteration: collect locally;
gather the entropy features of all ranks and measure
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

from myriad.distributed.torchdist.group import RankGroup, check_no_env_workers, check_sharding
from myriad.distributed.torchdist.role import RankRole
from myriad.distributed.torchdist.runner import train_on_ranks
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
    check_no_env_workers(cfg)


def pretrain_runner(
    cfg: Mapping[str, Any], run_dir: str | os.PathLike[str], ranks: RankGroup
) -> PretrainRunner:
    """This rank's :class:`~myriad.pretrain.runner.PretrainRunner` (with a
    :class:`~myriad.distributed.torchdist.role.RankRole`), once :func:`check_launch` accepts the
    config."""
    check_launch(cfg, ranks.world_size)
    return PretrainRunner(cfg, run_dir, role=RankRole(ranks))


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
        pretrain_runner,
        resume=request.resume,
        run_dir=request.run_dir,
        overwrite=request.overwrite,
    )
    if ranks.is_writer and not request.quiet:
        report(summary, folder)
    ranks.close()
    return summary
