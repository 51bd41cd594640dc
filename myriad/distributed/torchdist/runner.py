"""What a runner does differently on the ranks of a launch: one rank writes, all resume.

Rank 0 writes the run folder (config, TensorBoard events, ``summary.json``, plots, checkpoints,
dataset); the other ranks keep their scalars in memory only. A checkpoint is one file written by
rank 0 holding the replicated state once and, under its ``collector`` entry, the state of every
rank's envs, observations, episode sums and random generators (gathered at save time); on
resume each rank takes its own entry back. A checkpoint records how many processes wrote it and
is resumed with as many (:class:`~myriad.rl.runner.RunnerBase` refuses otherwise).

:func:`train_on_ranks` is a whole run on one rank: rank 0 claims the run folder, every rank
builds its runner, trains and finishes, rank 0 reports.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from myriad.distributed.torchdist.group import RankGroup, launched_world_size
from myriad.distributed.torchdist.sync import replica_difference
from myriad.rl.runner import (
    RunnerBase,
    build_runner,
    run_to_completion,
    set_torch_threads,
)
from myriad.utils.checkpoint import CheckpointError, capture_rng_state, restore_rng_state
from myriad.utils.config import output_folder
from myriad.utils.logging import ScalarLogger


class Stateful(Protocol):
    """What a checkpoint entry provides."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


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
    episode sums, sampling generator; or the checkpoint entry that wraps it) and the global
    random generators.

    ``state_dict`` is a collective (every rank calls it; rank 0 receives every rank's state);
    ``load_state_dict`` takes this rank's entry and keeps its generators for :meth:`restore_rng`,
    which the runner calls after the base class has restored rank 0's.
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


class RankRunnerMixin:
    """Rank behaviour of a :class:`~myriad.rl.runner.RunnerBase` subclass (list it first).

    Args:
        cfg: the run's resolved config (the same on every rank).
        run_dir: the run folder (chosen by rank 0).
        ranks: the process group.

    The launch is checked (:attr:`check_launch`) before anything is built, then the stage's
    runner is built, then the output of the ranks that do not write is silenced. The subclass
    sets ``self.rank_state`` (a :class:`RankLocalState`).
    """

    ranks: RankGroup
    rank_state: RankLocalState
    #: Refuses, before anything is built, a config the launch cannot run:
    #: ``check_launch(cfg, world_size)``.
    check_launch: Callable[[Mapping[str, Any], int], None]

    def __init__(
        self, cfg: Mapping[str, Any], run_dir: str | os.PathLike[str], ranks: RankGroup
    ) -> None:
        self.check_launch(cfg, ranks.world_size)
        self.ranks = ranks
        stage: Any = super()  # the stage's runner, next in the method order
        stage.__init__(cfg, run_dir)
        self.setup_ranks()

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


def quiet_unless_writer() -> None:
    """End a rank other than 0 with status 2 and no message, for an error every rank hit alike
    (a bad config, a taken run folder): the user reads it once, from rank 0."""
    if os.environ.get("RANK", "0") != "0":
        raise SystemExit(2)


def train_on_ranks(
    kind: str,
    configure: Callable[[int], dict[str, Any]],
    name: Callable[[Mapping[str, Any]], str],
    factory: Callable[[Mapping[str, Any], Path, RankGroup], RunnerBase],
    *,
    resume: str | os.PathLike[str] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    start: Callable[[Any], Any] | None = None,
) -> tuple[dict[str, Any], Path, RankGroup]:
    """A whole run on this rank of a ``torchrun`` launch, as
    :func:`~myriad.rl.runner.train_in_folder` in one process.

    Args:
        kind: ``"pretrain"`` or ``"finetune"`` (the default run folder's parent).
        configure: ``configure(world_size) -> config``; raises on what the launch cannot run
            (every rank alike, so rank 0 alone reports it).
        name: the default run folder's name from the config.
        factory: ``factory(config, folder, ranks)`` builds this rank's runner.
        resume, run_dir, overwrite: as for ``train_in_folder``.
        start: called with the runner of a new run before training (``--init``).

    Returns:
        Rank 0's summary (on every rank), the run folder and the process group, which the
        caller closes once it has reported.
    """
    try:
        cfg = configure(launched_world_size())
    except Exception:
        quiet_unless_writer()  # the same error on every rank: rank 0 reports it
        raise
    ranks = RankGroup.launch(str(cfg["device"]))
    claimed: tuple[Path | None, BaseException | None] = (None, None)
    if ranks.is_writer:
        try:
            claimed = (output_folder(kind, name(cfg), cfg, resume, run_dir, overwrite), None)
        except Exception as exc:  # every rank stops; rank 0 says why
            claimed = (None, exc)
    folder, error = ranks.broadcast_object(claimed)
    if error is not None:
        ranks.close()
        quiet_unless_writer()
        raise error
    set_torch_threads(cfg)
    runner = build_runner(
        lambda f: factory(cfg, f, ranks),
        folder,
        new_run=resume is None and ranks.is_writer,
    )
    # After a failure on some ranks the others may be inside a collective: the group is left
    # to the end of the process (torchrun stops the other ranks when one exits with an error).
    summary = run_to_completion(runner, int(cfg["iterations"]), resume, start)
    return summary, folder, ranks
