"""What the finetuning runner asks of an algorithm, with plain PPO's answers as defaults."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from myriad.rl.ppo import PPO


class FinetuneAlgorithm(PPO):
    """A :class:`~myriad.rl.PPO` (the update over the shared rollout) driven by
    :class:`~myriad.finetune.runner.FinetuneRunner`, which also reads:

    - :attr:`needs_transitions`: the collector must store each step's ``next_obs``;
    - :attr:`splits_over_ranks`: under torchrun, each rank may update on its own envs' rows
      with gradients averaged over the ranks;
    - :attr:`leader`: the member reported and evaluated as the leader;
    - :meth:`end_iteration`: called after each iteration with the finished episodes' sums.

    Plain PPO (``algo=ppo``) is this class as it is; SAPG, CPO and PBT override what they use.
    """

    #: The collector must store each step's ``next_obs`` (SAPG's and CPO's one-step targets).
    needs_transitions: ClassVar[bool] = False
    #: The loss is a mean over rows, each row's terms reading its own member only, so the
    #: update may be split over torchrun ranks: each rank's minibatches come from its own envs
    #: and the gradients are averaged (docs/distributed.md). False for an algorithm whose terms
    #: read the rows of several members (SAPG's and CPO's leader on the followers' rows) or
    #: act on the population as a whole (PBT): its update is replicated on every rank.
    splits_over_ranks: ClassVar[bool] = True

    @property
    def leader(self) -> int:
        """The member reported and evaluated as the leader."""
        return 0

    def end_iteration(self, returns: np.ndarray, counts: np.ndarray) -> dict[str, float]:
        """Called after each iteration with the per-member sums of the returns of the episodes
        that finished in it and their counts (``[M]`` each); returns scalars to log."""
        return {}
