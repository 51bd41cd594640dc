"""What a command hands to the code that runs it on a rank of a ``torchrun`` launch.

:mod:`myriad.distributed.torchdist` runs pretraining and finetuning on the ranks of a launch. It
sits above both stages (it builds their runners with a rank's
:class:`~myriad.distributed.torchdist.role.RankRole`), so a stage does not import it: the command
layer (:mod:`myriad.cli`) passes its entry point to :func:`myriad.pretrain.pretrain` or
:func:`myriad.finetune.finetune` as their ``ranks`` (a :data:`RankRunner`), and they hand it the
call's :class:`RunRequest`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from myriad.utils.config import ConfigError


@dataclass(frozen=True)
class RunRequest:
    """The arguments of :func:`myriad.pretrain.pretrain` or :func:`myriad.finetune.finetune`
    (``algo`` and ``init`` are finetuning's)."""

    overrides: Sequence[str] = ()
    resume: str | Path | None = None
    run_dir: str | Path | None = None
    quiet: bool = False
    overwrite: bool = False
    algo: str | None = None
    init: str | Path | None = None


#: What runs a stage on a rank of a ``torchrun`` launch: ``ranks(request) -> summary``
#: (:func:`myriad.distributed.torchdist.pretrain_on_ranks` or ``finetune_on_ranks``).
RankRunner = Callable[[RunRequest], dict[str, Any]]


def on_torchrun_rank() -> bool:
    """Whether this process is a rank of a ``torchrun`` launch of more than one process."""
    return os.environ.get("WORLD_SIZE", "1") not in ("", "1")


def launch_rank() -> int:
    """This process's rank in a ``torchrun`` launch (0 outside one)."""
    return int(os.environ.get("RANK", "0") or 0)


class CollectiveFailed(RuntimeError):
    """A collective started without waiting failed when waited for (its message is
    torch.distributed's); raised where no ``torch.distributed`` frame is on the stack."""


def lost_in_collective(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside ``torch.distributed`` on a rank of a launch: a
    collective that failed, in practice because another rank ended (gloo's "Connection closed
    by peer"), or a :class:`CollectiveFailed` (such a failure met when waiting for a collective
    started without waiting). That rank's own message says why; this one adds nothing."""
    if not on_torchrun_rank():
        return False
    if isinstance(exc, CollectiveFailed):
        return True
    marker = f"torch{os.sep}distributed{os.sep}"
    frame = exc.__traceback__
    while frame is not None:
        if marker in frame.tb_frame.f_code.co_filename:
            return True
        frame = frame.tb_next
    return False


def run_on_ranks(command: str, request: RunRequest, ranks: RankRunner | None) -> dict[str, Any]:
    """``ranks(request)``: the run of ``myriad <command>`` on this rank.

    Raises:
        ConfigError: no ``ranks`` was given (a program calling the stage's function on a rank).
    """
    if ranks is None:
        raise ConfigError(
            f"this process is a rank of a torchrun launch (WORLD_SIZE="
            f"{os.environ.get('WORLD_SIZE')}) and {command}() was given no ranks runner: launch "
            f"`torchrun ... -m myriad {command} ...`, or pass "
            f"ranks=myriad.distributed.torchdist.{command}_on_ranks"
        )
    return ranks(request)
