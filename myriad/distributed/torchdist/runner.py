"""A whole run on one rank of a ``torchrun`` launch: :func:`train_on_ranks`.

Rank 0 claims the run folder and holds its lock (the other ranks never touch either), every rank
builds its runner (the stage's runner with a :class:`~myriad.distributed.torchdist.role.RankRole`),
trains and finishes, rank 0 reports.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from myriad.distributed.torchdist.group import RankGroup, launched_world_size
from myriad.rl.runner import (
    RunnerBase,
    build_runner,
    lock_run,
    reported_failures,
    run_to_completion,
    set_torch_threads,
)
from myriad.utils.config import output_folder
from myriad.utils.runlock import RunLock


def quiet_unless_writer() -> None:
    """End a rank other than 0 with status 2 and no message, for an error every rank hit alike
    (a bad config, a taken run folder): the user reads it once, from rank 0."""
    if os.environ.get("RANK", "0") != "0":
        raise SystemExit(2)


def relaunch(world_size: int) -> str:
    """How to start this launch's ranks again, for a message: ``torchrun --nproc_per_node=R -m
    myriad`` on one machine; several machines each ran their own torchrun agent."""
    if int(os.environ.get("LOCAL_WORLD_SIZE", world_size) or world_size) == world_size:
        return f"torchrun --nproc_per_node={world_size} -m myriad"
    return f"the same torchrun launch ({world_size} ranks) of myriad"


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
        factory: ``factory(config, folder, ranks)`` builds this rank's runner (the stage's
            runner with a :class:`~myriad.distributed.torchdist.role.RankRole` of ``ranks``).
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
    new_run = resume is None and ranks.is_writer
    claimed: tuple[Path | None, BaseException | None] = (None, None)
    lock: RunLock | None = None
    if ranks.is_writer:  # rank 0 alone claims the folder and holds its lock
        try:
            folder = output_folder(kind, name(cfg), cfg, resume, run_dir, overwrite)
            lock = lock_run(folder, kind, new_run)
            claimed = (folder, None)
        except Exception as exc:  # every rank stops; rank 0 says why
            claimed = (None, exc)
    folder, error = ranks.broadcast_object(claimed)
    if error is not None:
        ranks.close()
        quiet_unless_writer()
        raise error
    try:
        set_torch_threads(cfg)
        runner = build_runner(lambda f: factory(cfg, f, ranks), folder, new_run=new_run)
        # After a failure on some ranks the others may be inside a collective: the group is
        # left to the end of the process (torchrun stops the other ranks when one exits with an
        # error; a rank that loses its peers ends quietly, see myriad.utils.launch).
        again = f"{relaunch(ranks.world_size)} {kind} --resume {folder}"
        with reported_failures(folder, again, new_run):
            if new_run:  # a launch killed before its first checkpoint is continued by --resume
                runner.write_config()
            summary = run_to_completion(runner, int(cfg["iterations"]), resume, start)
    finally:
        if lock is not None:
            lock.release()
    return summary, folder, ranks
