"""What a runner does differently on the ranks of a launch: one rank writes, all resume.

Rank 0 writes the run folder (config, TensorBoard events, ``summary.json``, plots, checkpoints,
dataset); the other ranks keep their scalars in memory only. A checkpoint is one file written by
rank 0 holding the replicated state once and, under its ``collector`` entry, the state of every
rank's envs, observations, episode sums and random generators (gathered at save time); on
resume each rank takes its own entry back. A checkpoint records how many processes wrote it and
is resumed with as many (:class:`~myriad.rl.runner.RunnerBase` refuses otherwise).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

from myriad.distributed.torchdist.group import RankGroup
from myriad.distributed.torchdist.sync import replica_difference
from myriad.rl.collector import RolloutCollector
from myriad.rl.runner import RunnerBase
from myriad.utils.checkpoint import CheckpointError, capture_rng_state, restore_rng_state
from myriad.utils.logging import ScalarLogger


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
    which the runner calls after the base class has restored rank 0's.
    """

    def __init__(self, ranks: RankGroup, collector: RolloutCollector) -> None:
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


class RankRunnerMixin:
    """Rank behaviour of a :class:`~myriad.rl.runner.RunnerBase` subclass (list it first).

    The subclass sets ``self.ranks`` and ``self.rank_state`` (a :class:`RankLocalState`) and
    calls :meth:`setup_ranks` once its model exists.
    """

    ranks: RankGroup
    rank_state: RankLocalState

    def setup_ranks(self) -> None:
        """Silence the output of the ranks that do not write."""
        runner: Any = self
        runner.world_size = self.ranks.world_size
        if not self.ranks.is_writer:
            runner.progress = runner.plots = runner.tensorboard = False

    @property
    def logger(self) -> ScalarLogger:
        runner: Any = self
        if not self.ranks.is_writer and runner._logger is None:
            runner._logger = HistoryOnlyLogger()
            if runner._pending_history is not None:
                runner._logger.load_state_dict(runner._pending_history)
                runner._pending_history = None
        return RunnerBase.logger.fget(self)  # type: ignore[attr-defined]

    def checkpoint(self) -> dict[str, Any]:
        """The base checkpoint (a collective: see :class:`RankLocalState`), plus the largest
        difference between the ranks' replicas of the model, 0.0 when they are identical."""
        payload = super().checkpoint()  # type: ignore[misc]
        difference = replica_difference(self.model, self.ranks)  # type: ignore[attr-defined]
        if difference and self.ranks.is_writer:
            warnings.warn(
                f"the ranks' copies of the model differ by up to {difference:.3g}; the run "
                "continues with each rank's own copy",
                RuntimeWarning,
                stacklevel=2,
            )
        payload["replica_max_abs_diff"] = difference
        return payload

    def save_checkpoint(self, path: str | os.PathLike[str] | None = None) -> Path:
        """Every rank takes part in building the checkpoint; rank 0 writes it."""
        if self.ranks.is_writer:
            return super().save_checkpoint(path)  # type: ignore[misc]
        self.checkpoint()
        return Path(path) if path else Path()

    def write_summary(self) -> Path:
        runner: Any = self
        if not self.ranks.is_writer:
            return runner.run_dir / "summary.json"
        return super().write_summary()  # type: ignore[misc]

    def resume(self, path: str | os.PathLike[str]) -> Path:
        source = super().resume(path)  # type: ignore[misc]
        self.rank_state.restore_rng()
        return source
