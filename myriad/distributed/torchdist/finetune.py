"""Finetuning (PPO, SAPG, CPO, PBT) over the ranks of a ``torchrun`` launch (docs/distributed.md).

:class:`~myriad.finetune.runner.FinetuneRunner` runs on every rank with a
:class:`~myriad.distributed.torchdist.role.RankRole`. Every rank holds the whole population and
the whole algorithm (optimiser, discriminator, KL set point, PBT's hyperparameters) and steps
the envs of its members only. Per iteration:

1. collect ``T`` steps of its own envs;
2. gather the rollouts of all ranks (:func:`~myriad.distributed.torchdist.rollout.gather_rollout`),
   so every rank holds the storage one process would have filled;
3. update, split over the ranks as the algorithm's
   :attr:`~myriad.finetune.base.FinetuneAlgorithm.rank_split` says. ``"envs"`` (``algo=ppo``,
   each row's loss reads its own member only): each rank updates on its own envs' rows, with
   gradients averaged and normalisers merged over the ranks, as pretraining does. ``"rows"``
   (SAPG, CPO, PBT): every rank draws the same minibatches of the gathered rollout and learns
   from its half (``1/R``) of every member's rows of each (:class:`~myriad.rl.row_share.RowShare`),
   with gradients averaged; the couplings that read rows of several members (the leader's
   off-policy loss on the followers' rows, the followers' AWAC pull on the leader's rows) find
   them in the gathered rollout. The update-wide quantities are computed on each rank's part
   and combined: the advantage moments (group sums and counts, all-reduced), the leader's
   log-probs of every action and the discriminator's bonuses (``[T, E/R]``, gathered), the AWAC
   advantages of the leader's steps (``[M, T E_L / R]``, gathered), the followers' KL to the
   leader that drives the set point (``[2, M]`` sums and counts, all-reduced) and the
   discriminator's gradients (averaged). PBT's exploit step ranks members by the episode returns
   summed over the ranks and draws from a generator in the same state on every rank, so every
   rank copies the same members; the KL diagnostics read the gathered rollout. Every rank
   takes the same step (docs/distributed.md lists the bytes);
4. sum the finished episodes over the ranks (the member returns PBT ranks by, the logged
   success rates).

The evaluations during training run on every rank (equal replicas, envs seeded alike: equal
scalars, nothing sent); rank 0 alone runs the final one and writes the run folder and its one
checkpoint.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from myriad.distributed.torchdist.group import RankGroup, check_no_env_workers, check_sharding
from myriad.distributed.torchdist.role import RankRole
from myriad.distributed.torchdist.runner import train_on_ranks
from myriad.finetune.runner import FinetuneRunner
from myriad.utils.config import ConfigError
from myriad.utils.launch import RunRequest


def check_finetune_launch(cfg: Mapping[str, Any], world_size: int) -> None:
    """Refuse, before anything is built, what a sharded finetuning cannot run.

    A population of one policy (``algo=ppo``) splits its envs over the ranks; a larger one
    splits its members, whole.

    Raises:
        ConfigError: members (or, for one policy, envs) that do not split over the ranks, or
            Ray env workers combined with ranks.
    """
    size, num_envs = int(cfg["population"]["size"]), int(cfg["num_envs"])
    if size > 1:
        check_sharding(size, world_size)
    elif num_envs % world_size:
        raise ConfigError(
            f"num_envs={num_envs} does not split over {world_size} torchrun ranks: use a "
            f"multiple of {world_size}"
        )
    check_no_env_workers(cfg)


def finetune_runner(
    cfg: Mapping[str, Any], run_dir: str | os.PathLike[str], ranks: RankGroup
) -> FinetuneRunner:
    """This rank's :class:`~myriad.finetune.runner.FinetuneRunner` (with a
    :class:`~myriad.distributed.torchdist.role.RankRole`), once :func:`check_finetune_launch`
    accepts the config."""
    check_finetune_launch(cfg, ranks.world_size)
    return FinetuneRunner(cfg, run_dir, role=RankRole(ranks))


def finetune_on_ranks(request: RunRequest) -> dict[str, Any]:
    """:func:`myriad.finetune.finetune` on this rank of a ``torchrun`` launch (its arguments in
    ``request``, the same result; rank 0 chooses the run folder and prints the report)."""
    from myriad.finetune.api import report, resolve_config
    from myriad.nn.population import check_population

    def configure(world_size: int) -> dict[str, Any]:
        r = request
        cfg = resolve_config(r.algo, r.overrides, r.init, r.resume)
        check_population(int(cfg["num_envs"]), int(cfg["population"]["size"]))
        check_finetune_launch(cfg, world_size)
        return cfg

    summary, folder, ranks = train_on_ranks(
        "finetune",
        configure,
        lambda cfg: f"{cfg['algo']['name']}-{cfg['env']['name']}",
        finetune_runner,
        resume=request.resume,
        run_dir=request.run_dir,
        overwrite=request.overwrite,
        start=(
            (lambda r: r.initialise(r.config["init"]["source"]))
            if request.init is not None
            else None
        ),
    )
    if ranks.is_writer and not request.quiet:
        report(summary, folder)
    ranks.close()
    return summary
