"""Scalar logging: an in-memory history for plots and ``summary.json``, and the backends that
write it out (TensorBoard, Weights & Biases: :mod:`myriad.utils.loggers`)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from myriad.utils.checkpoint import atomic_write_text

if TYPE_CHECKING:
    from myriad.utils.loggers import LogBackend

History = dict[str, list[tuple[int, float]]]


def to_float(value: float | int | torch.Tensor) -> float:
    """A Python float from a number or a one-element tensor."""
    return float(value.item() if isinstance(value, torch.Tensor) else value)


class ScalarLogger:
    """Keeps every logged value in memory and writes them to its backends.

    Args:
        log_dir: TensorBoard event directory; None keeps the history only.
        tensorboard: write TensorBoard events to ``log_dir`` (when ``backends`` is None).
        purge_step: on resume, TensorBoard hides events at or after this x value left by the
            interrupted run, so curves do not fold back.
        backends: where scalars go (:mod:`myriad.utils.loggers`); None: TensorBoard in
            ``log_dir`` as ``tensorboard`` says.
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str] | None = None,
        tensorboard: bool = True,
        purge_step: int | None = None,
        backends: Sequence[LogBackend] | None = None,
    ) -> None:
        self.history: History = {}
        if backends is None:
            backends = []
            if log_dir is not None and tensorboard:
                from myriad.utils.loggers import TensorBoardBackend

                backends = [TensorBoardBackend(log_dir, purge_step)]
        self.backends: list[LogBackend] = list(backends)

    def log(
        self,
        step: int,
        scalars: Mapping[str, float | int | torch.Tensor],
        env_steps: int | None = None,
    ) -> None:
        """Record ``scalars`` of iteration ``step``; the backends get them at x = ``env_steps``
        (default ``step``). Non-finite values are kept in the history only."""
        finite = {}
        for name, value in scalars.items():
            v = to_float(value)
            self.history.setdefault(name, []).append((int(step), v))
            if math.isfinite(v):
                finite[name] = v
        x = int(step if env_steps is None else env_steps)
        for backend in self.backends:
            backend.log_scalars(finite, x, int(step))

    def log_video(
        self, tag: str, path: str | os.PathLike[str], step: int, env_steps: int | None = None
    ) -> None:
        """Give a video file of iteration ``step`` to the backends that show videos."""
        x = int(step if env_steps is None else env_steps)
        for backend in self.backends:
            backend.log_video(tag, Path(path), x, int(step))

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Give the run's resolved config to every backend (when training starts)."""
        for backend in self.backends:
            backend.log_config(config)

    def latest(self) -> dict[str, float]:
        """The last logged value of every scalar."""
        return {name: points[-1][1] for name, points in self.history.items() if points}

    def flush(self) -> None:
        for backend in self.backends:
            backend.flush()

    def close(self) -> None:
        backends, self.backends = self.backends, []
        for backend in backends:
            backend.close()

    def state_dict(self) -> dict[str, Any]:
        return {"history": {k: [list(p) for p in v] for k, v in self.history.items()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.history = {
            k: [(int(s), float(v)) for s, v in pts] for k, pts in state["history"].items()
        }

    def write_summary(self, path: str | os.PathLike[str], **extra: Any) -> Path:
        """Atomically write ``{**extra, "scalars": latest values}`` as JSON (NaN -> null), with
        its digest (:func:`myriad.utils.digest.summary_text`)."""
        latest = {k: (v if math.isfinite(v) else None) for k, v in self.latest().items()}
        from myriad.utils.digest import summary_text

        return atomic_write_text(path, summary_text({**extra, "scalars": latest}))

    def plot(
        self, directory: str | os.PathLike[str], prefixes: tuple[str, ...] | None = None
    ) -> list[Path]:
        """One PNG per scalar group (the part of the name before the first ``/``), each scalar
        of the group in its own panel; returns the files written.

        A scalar that was 0 at every iteration (a task return of an env without a task
        reward) gets no panel: the figure's title names it, and a group with nothing else
        writes no file.
        """
        from myriad.utils.plotting import pyplot, save_figure

        plt = pyplot()
        groups: dict[str, list[str]] = {}
        zeros: dict[str, list[str]] = {}
        for name in sorted(self.history):
            group = name.split("/", 1)[0]
            if prefixes is None or group in prefixes:
                flat = all(v == 0 for _, v in self.history[name])
                (zeros if flat else groups).setdefault(group, []).append(name)
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        for group, names in groups.items():
            cols = min(4, len(names))
            rows = math.ceil(len(names) / cols)
            fig, axes = plt.subplots(rows, cols, figsize=(3.2 * cols, 2.4 * rows), squeeze=False)
            for ax, name in zip(axes.flat, names):
                steps, values = zip(*self.history[name])
                ax.plot(steps, values, linewidth=1.0)
                ax.set_title(name, fontsize=8)
                ax.set_xlabel("iteration", fontsize=7)
                ax.tick_params(labelsize=7)
            for ax in list(axes.flat)[len(names) :]:
                ax.set_visible(False)
            if group in zeros:
                left_out = ", ".join(zeros[group])
                fig.suptitle(f"always 0, not drawn: {left_out}", fontsize=7, wrap=True)
            name = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', group)}.png"
            written.append(save_figure(fig, directory / name))
        return written


def print_report(
    title: str, rows: Sequence[tuple[str, str]], files: Sequence[tuple[str, Any]]
) -> None:
    """The closing report of a run: a bold title, aligned ``(name, value)`` rows, then where
    its files are (those that were not written, ``None``, are left out). Long paths stay on
    one line so they can be copied."""
    from rich.console import Console

    console = Console(soft_wrap=True)
    console.print(f"[bold]{title}[/bold]")
    width = max((len(name) for name, _ in rows), default=0)
    for name, value in rows:
        console.print(f"  {name:<{width}}  {value}")
    for name, where in files:
        if where is not None:
            console.print(f"  {name:<10}  {where}")
