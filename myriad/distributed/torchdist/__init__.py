"""Populations sharded over the ranks of a ``torchrun`` launch (torch.distributed; NCCL on GPUs,
gloo on CPUs). ``torchrun --nproc_per_node=R -m myriad pretrain ...`` runs
:func:`pretrain_on_ranks` on every rank, ``... -m myriad finetune ...`` :func:`finetune_on_ranks`;
see docs/distributed.md. The command layer (:mod:`myriad.cli`) chooses them on a rank and hands
them to :func:`myriad.pretrain.pretrain` and :func:`myriad.finetune.finetune` as their ``ranks``.

- :class:`RankGroup`: the launch, the member and env shard of each rank, the collectives.
- :class:`RankRole`: how a rank takes part in a run; the pretraining and finetuning runners
  receive it (:func:`pretrain_runner`, :func:`finetune_runner`): the rollout gathered, the
  update split over the ranks (by envs for pretraining and PPO, by rows of every minibatch for
  SAPG, CPO and PBT), rank 0 writing.
- :class:`RankEntropyMeasurement`: the population's k-NN measurement from every rank's features.
- :class:`GradientAverager`, :class:`RankMeanStd`: what keeps the replicated model identical.
"""

from myriad.distributed.torchdist.finetune import (
    check_finetune_launch,
    finetune_on_ranks,
    finetune_runner,
)
from myriad.distributed.torchdist.group import (
    RankGroup,
    check_sharding,
    launched_world_size,
)
from myriad.distributed.torchdist.measure import RankEntropyMeasurement
from myriad.distributed.torchdist.pretrain import (
    check_launch,
    pretrain_on_ranks,
    pretrain_runner,
)
from myriad.distributed.torchdist.role import RankRole
from myriad.distributed.torchdist.rollout import gather_rollout, rollout_like
from myriad.distributed.torchdist.runner import train_on_ranks
from myriad.distributed.torchdist.sync import (
    GradientAverager,
    RankMeanStd,
    SummedEpisodeTracker,
    replica_difference,
)

__all__ = [
    "GradientAverager",
    "RankEntropyMeasurement",
    "RankGroup",
    "RankMeanStd",
    "RankRole",
    "SummedEpisodeTracker",
    "check_finetune_launch",
    "check_launch",
    "check_sharding",
    "finetune_on_ranks",
    "finetune_runner",
    "gather_rollout",
    "launched_world_size",
    "pretrain_on_ranks",
    "pretrain_runner",
    "replica_difference",
    "rollout_like",
    "train_on_ranks",
]
