"""How a command hands a rank of a ``torchrun`` launch to the package that runs it there.

:mod:`myriad.distributed.torchdist` runs pretraining and finetuning on the ranks of a launch. It
sits above both stages (it builds their runners with a rank's
:class:`~myriad.distributed.torchdist.role.RankRole`), so a stage does not import it: on the first
launch the stage's :class:`RankLauncher` imports it by name, and it installs its entry points.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


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


def on_torchrun_rank() -> bool:
    """Whether this process is a rank of a ``torchrun`` launch of more than one process."""
    return os.environ.get("WORLD_SIZE", "1") not in ("", "1")


def launch_rank() -> int:
    """This process's rank in a ``torchrun`` launch (0 outside one)."""
    return int(os.environ.get("RANK", "0") or 0)


def lost_in_collective(exc: BaseException) -> bool:
    """Whether ``exc`` was raised inside ``torch.distributed`` on a rank of a launch: a
    collective that failed, in practice because another rank ended (gloo's "Connection closed
    by peer"). That rank's own message says why; this one adds nothing."""
    if not on_torchrun_rank():
        return False
    marker = f"torch{os.sep}distributed{os.sep}"
    frame = exc.__traceback__
    while frame is not None:
        if marker in frame.tb_frame.f_code.co_filename:
            return True
        frame = frame.tb_next
    return False


class RankLauncher:
    """What a command runs on a rank of a ``torchrun`` launch: ``launcher(request) -> summary``,
    installed by ``module`` when it is imported."""

    def __init__(self, module: str = "myriad.distributed.torchdist") -> None:
        self.module = module
        self._launcher: Callable[[RunRequest], dict[str, Any]] | None = None

    def install(self, launcher: Callable[[RunRequest], dict[str, Any]]) -> None:
        self._launcher = launcher

    def __call__(self, request: RunRequest) -> dict[str, Any]:
        if self._launcher is None:
            importlib.import_module(self.module)  # installs its launcher
        if self._launcher is None:
            raise RuntimeError(f"{self.module} did not install a rank launcher")
        return self._launcher(request)
