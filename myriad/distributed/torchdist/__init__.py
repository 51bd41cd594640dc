"""Populations sharded over the ranks of a ``torchrun`` launch (torch.distributed; NCCL on GPUs,
gloo on CPUs). ``torchrun --nproc_per_node=R -m myriad pretrain ...`` runs
:func:`pretrain_on_ranks` on every rank; see docs/distributed.md.

- :class:`RankGroup`: the launch, the member and env shard of each rank, the collectives.
- :class:`ShardedPretrainRunner`: K-Myriad pretraining on one rank.
- :class:`RankEntropyMeasurement`: the population's k-NN measurement from every rank's features.
- :class:`GradientAverager`, :class:`RankMeanStd`: what keeps the replicated model identical.
"""

from myriad.distributed.torchdist.group import (
    RankGroup,
    check_sharding,
    launched_world_size,
)
from myriad.distributed.torchdist.measure import RankEntropyMeasurement
from myriad.distributed.torchdist.pretrain import (
    ShardedPretrainRunner,
    check_launch,
    pretrain_on_ranks,
)
from myriad.distributed.torchdist.sync import (
    GradientAverager,
    RankMeanStd,
    SummedEpisodeTracker,
    replica_difference,
)
from myriad.pretrain.api import set_rank_launcher

# pretrain() hands a rank of a torchrun launch to pretrain_on_ranks (pretraining does not import
# this package, which sits above it).
set_rank_launcher(pretrain_on_ranks)

__all__ = [
    "GradientAverager",
    "RankEntropyMeasurement",
    "RankGroup",
    "RankMeanStd",
    "ShardedPretrainRunner",
    "SummedEpisodeTracker",
    "check_launch",
    "check_sharding",
    "launched_world_size",
    "pretrain_on_ranks",
    "replica_difference",
]
