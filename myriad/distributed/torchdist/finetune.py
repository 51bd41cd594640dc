"""Finetuning (PPO, SAPG, CPO, PBT) over the ranks of a ``torchrun`` launch (docs/distributed.md).

Every rank holds the whole population and the whole algorithm (optimiser, discriminator, KL set
point, PBT's hyperparameters) and steps the envs of its members only. Per iteration:

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

from myriad.distributed.torchdist.group import RankGroup, check_sharding
from myriad.distributed.torchdist.rollout import gather_rollout, rollout_like
from myriad.distributed.torchdist.runner import RankLocalState, RankRunnerMixin, train_on_ranks
from myriad.distributed.torchdist.sync import (
    GradientAverager,
    SummedEpisodeTracker,
    broadcast_module_,
    share_normalizers,
)
from myriad.finetune.init import InitReport
from myriad.finetune.runner import FinetuneRunner
from myriad.nn.population import block_members
from myriad.rl.row_share import RowShare
from myriad.rl.storage import RolloutStorage
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
    if cfg.get("distributed"):
        raise ConfigError(
            "distributed=local|cluster (envs on Ray workers) and torchrun ranks do not combine: "
            "drop distributed= or launch without torchrun"
        )


class ShardedFinetuneRunner(RankRunnerMixin, FinetuneRunner):
    """:class:`~myriad.finetune.runner.FinetuneRunner` on one rank of a launch (arguments:
    :class:`~myriad.distributed.torchdist.runner.RankRunnerMixin`)."""

    check_launch = staticmethod(check_finetune_launch)

    def __init__(
        self, cfg: Mapping[str, Any], run_dir: str | os.PathLike[str], ranks: RankGroup
    ) -> None:
        super().__init__(cfg, run_dir, ranks)
        # Seeded alike, the replicas start equal; the broadcasts make sure of it (an env that
        # draws from the global generator while it is built draws per env, so per rank).
        broadcast_module_(self.model, ranks)
        if not ranks.is_writer:
            self.algorithm.load_state_dict(ranks.broadcast_object(None))
        else:
            ranks.broadcast_object(self.algorithm.state_dict())
        #: How the ranks split the update: ``"envs"`` (each rank learns from its own envs'
        #: rows, normalisers merged over the ranks), ``"rows"`` (each rank learns from its
        #: share of every minibatch of the gathered rollout), None with one rank (or with
        #: ``rank_split="none"``: the whole update on every rank, a reference for benchmarks).
        self.update_split: str | None = None
        if ranks.world_size > 1 and self.algorithm.rank_split in ("envs", "rows"):
            self.update_split = self.algorithm.rank_split
            self.algorithm.grad_sync = GradientAverager(ranks, self.algorithm.parameters)
        if self.update_split == "envs":
            share_normalizers(self.model, ranks)
        elif self.update_split == "rows":
            self.algorithm.set_share(
                RowShare(ranks.rank, ranks.world_size, ranks.all_reduce_, ranks.all_gather_cat)
            )
        self.collector.episodes = SummedEpisodeTracker(self.collector.episodes, ranks)
        self.rank_state = RankLocalState(ranks, self.collector)
        num_envs = int(self.config["num_envs"])
        member = block_members(num_envs, self.model.num_members, self.env.device)
        #: This rank's share of each rollout ``[T, E/R]``; ``storage`` is the whole ``[T, E]``.
        self.local_storage = self.storage
        self.storage = rollout_like(self.local_storage, member)
        if not ranks.is_writer:
            self.videos = None

    # -- the rank's share --------------------------------------------------------------------
    def env_shard(self, num_envs: int, num_members: int, seed: int) -> tuple[slice, int]:
        # Equal contiguous blocks: whole members when the ranks divide the population.
        return self.ranks.env_block(num_envs), self.ranks.stream_seed(seed)

    def collect(self) -> RolloutStorage:
        """This rank's envs' rollout, then every rank's, in the run's layout."""
        self.collector.collect(self.local_storage)
        gather_rollout(self.ranks, self.local_storage, self.storage)
        return self.storage

    def learning_rollout(self, rollout: RolloutStorage) -> RolloutStorage:
        """This rank's own envs' rows when the update splits by envs, else the gathered
        rollout."""
        return self.local_storage if self.update_split == "envs" else rollout

    def initialise(self, source: str | os.PathLike[str]) -> InitReport:
        """``--init`` on every rank (the ranking's evaluation is seeded alike), then rank 0's
        population and report on every rank."""
        report = super().initialise(source)
        broadcast_module_(self.model, self.ranks)
        self.init_report = self.ranks.broadcast_object(report)
        return self.init_report

    def state_objects(self) -> dict[str, Any]:
        return {**super().state_objects(), "collector": self.rank_state}

    def finish(self) -> dict[str, Any]:
        """Rank 0's final evaluation, plots and summary; the summary on every rank."""
        summary = super().finish() if self.ranks.is_writer else None
        return dict(self.ranks.broadcast_object(summary))


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
        ShardedFinetuneRunner,
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
