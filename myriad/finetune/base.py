"""What the finetuning runner asks of an algorithm, with plain PPO's answers as defaults."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from myriad.rl.ppo import PPO


class FinetuneAlgorithm(PPO):
    """A :class:`~myriad.rl.PPO` (the update over the shared rollout) driven by
    :class:`~myriad.finetune.runner.FinetuneRunner`, which also reads:

    - :attr:`needs_transitions`: the collector must store each step's ``next_obs``;
    - :attr:`rank_split`: how torchrun ranks split the update;
    - :attr:`leader`: the member reported and evaluated as the leader;
    - :meth:`end_iteration`: called after each iteration with the finished episodes' sums.

    Plain PPO (``algo=ppo``) is this class as it is; SAPG, CPO and PBT override what they use.
    """

    #: The collector must store each step's ``next_obs`` (SAPG's and CPO's one-step targets).
    needs_transitions: ClassVar[bool] = False
    #: How the update splits over torchrun ranks (docs/distributed.md). ``"envs"``: each rank
    #: learns from its own envs' rows with gradients averaged and normalisers merged over the
    #: ranks; right for a loss whose rows each read their own member only (plain PPO, one
    #: policy). ``"rows"``: every rank holds the gathered rollout and learns from an equal share
    #: of every member's rows of each minibatch (:class:`~myriad.rl.row_share.RowShare`), so
    #: terms that read several members' rows (SAPG's and CPO's leader on the followers' rows,
    #: the followers on the leader's) find them on every rank; the update-wide quantities are
    #: computed on each rank's part and summed or gathered (SAPG, CPO, PBT). ``"none"``: every
    #: rank runs the whole update on the gathered rollout (the same step, no speed-up; a
    #: reference for benchmarks/torchdist_finetune_throughput.py).
    rank_split: ClassVar[str] = "envs"

    @property
    def leader(self) -> int:
        """The member reported and evaluated as the leader."""
        return 0

    def end_iteration(self, returns: np.ndarray, counts: np.ndarray) -> dict[str, float]:
        """Called after each iteration with the per-member sums of the returns of the episodes
        that finished in it and their counts (``[M]`` each); returns scalars to log."""
        return {}
