"""Where a run's scalars go besides its in-memory history: TensorBoard and Weights & Biases.

A backend receives, for each iteration, the finite scalars of the iteration with the number of
env steps so far as the x axis (runs of different sizes compare by experience, not by
iteration count) and the iteration as a scalar of its own, and the run's resolved config once,
at the start. ``logger=`` in a run config chooses them: ``tensorboard`` (the default), ``wandb``,
``tensorboard+wandb`` or ``none``.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

#: Values of ``logger``: backend names joined by ``+``, or ``none``.
BACKENDS = ("tensorboard", "wandb")


class LogBackend(Protocol):
    """What :class:`~myriad.utils.logging.ScalarLogger` writes to."""

    def log_config(self, config: Mapping[str, Any]) -> None:
        """Record the run's resolved config (once, when training starts)."""

    def log_scalars(self, scalars: Mapping[str, float], env_steps: int, iteration: int) -> None:
        """Record one iteration's finite scalars at x = ``env_steps``."""

    def log_video(self, tag: str, path: Path, env_steps: int, iteration: int) -> None:
        """Record a video file (MP4 or GIF) at x = ``env_steps``, where the backend shows
        videos."""

    def flush(self) -> None: ...

    def close(self) -> None: ...


def parse_backends(spec: str | Sequence[str] | None) -> list[str]:
    """``"tensorboard+wandb"`` -> ``["tensorboard", "wandb"]``; ``"none"`` -> ``[]``.

    Raises:
        ConfigError: an unknown backend name.
    """
    from myriad.utils.config import ConfigError

    if spec is None:
        return ["tensorboard"]
    names = [spec] if isinstance(spec, str) else list(spec)
    parts = [p.strip() for name in names for p in str(name).split("+") if p.strip()]
    if parts == ["none"]:
        return []
    bad = [p for p in parts if p not in BACKENDS]
    if bad or not parts:
        raise ConfigError(
            f"logger={spec!r}: choose tensorboard, wandb, tensorboard+wandb or none"
            + (f" ({', '.join(bad)} unknown)" if bad else "")
        )
    return list(dict.fromkeys(parts))


#: Per-member and per-follower scalars (``entropy/member_3``, ``cpo/kl/follower_1``): their
#: prefix, overlaid in one TensorBoard chart.
_MEMBER_SCALAR = re.compile(r"^(.*)/(member|follower)_\d+$")


class TensorBoardBackend:
    """TensorBoard events in ``log_dir``; per-member scalars also overlaid in one chart each
    (the "Custom Scalars" tab), the config as text.

    Args:
        log_dir: the event folder (the run folder).
        purge_step: on resume, the env-step count of the checkpoint plus one: events the
            interrupted run logged at or after it are hidden, so curves do not fold back.
    """

    def __init__(self, log_dir: str | os.PathLike[str], purge_step: int | None = None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # slow import, only when used

        self.writer = SummaryWriter(str(log_dir), purge_step=purge_step)
        self._layout_written = False

    def log_config(self, config: Mapping[str, Any]) -> None:
        text = json.dumps(config, indent=2, default=str)
        # Four-space indentation: TensorBoard's text plugin renders Markdown.
        self.writer.add_text("config", "    " + text.replace("\n", "\n    "), 0)

    def _write_layout(self, names: Sequence[str]) -> None:
        groups = sorted({m.group(1) for n in names if (m := _MEMBER_SCALAR.match(n))})
        if groups:
            charts = {
                g: ["Multiline", [rf"^{re.escape(g)}/(member|follower)_\d+$"]] for g in groups
            }
            self.writer.add_custom_scalars({"members overlaid": charts})
        self._layout_written = True

    def log_scalars(self, scalars: Mapping[str, float], env_steps: int, iteration: int) -> None:
        if not self._layout_written:
            self._write_layout(list(scalars))
        for name, value in scalars.items():
            self.writer.add_scalar(name, value, env_steps)
        self.writer.add_scalar("perf/iteration", float(iteration), env_steps)

    def log_video(self, tag: str, path: Path, env_steps: int, iteration: int) -> None:
        """Nothing: TensorBoard's video summaries need moviepy; the training videos log their
        middle frame as an image instead (:class:`myriad.viz.runs.TrainingVideos`)."""

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbBackend:
    """A Weights & Biases run in ``<run_dir>/wandb``; ``env_steps`` is every chart's x axis.

    The W&B run id is kept in ``<run_dir>/wandb_run_id``, so a resumed myriad run continues
    the same W&B run. ``mode="offline"`` (the default) writes locally without a network or an
    account; ``wandb sync <run_dir>/wandb/offline-run-*`` uploads it later.

    Raises:
        MissingDependencyError: wandb is not installed (the ``wandb`` extra).
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        *,
        project: str = "myriad",
        entity: str | None = None,
        mode: str = "offline",
        group: str | None = None,
        tags: Sequence[str] = (),
    ) -> None:
        from myriad.utils.config import ConfigError
        from myriad.utils.optional import require

        if mode not in ("offline", "online", "disabled"):
            raise ConfigError(f"wandb.mode must be offline, online or disabled, got {mode!r}")
        wandb = require("wandb", "wandb")
        run_dir = Path(run_dir)
        id_file = run_dir / "wandb_run_id"
        run_id = id_file.read_text().strip() if id_file.is_file() else uuid.uuid4().hex[:12]
        if not id_file.is_file():
            from myriad.utils.checkpoint import atomic_write_text

            atomic_write_text(id_file, run_id + "\n")
        self.run = wandb.init(
            project=project,
            entity=entity,
            dir=str(run_dir),
            name=run_dir.name,
            id=run_id,
            resume="allow",
            mode=mode,
            group=group,
            tags=list(tags),
            settings=wandb.Settings(console="off", silent=True),
        )
        self.run.define_metric("env_steps")
        self.run.define_metric("*", step_metric="env_steps")

    def log_config(self, config: Mapping[str, Any]) -> None:
        self.run.config.update(dict(config), allow_val_change=True)

    def log_scalars(self, scalars: Mapping[str, float], env_steps: int, iteration: int) -> None:
        self.run.log({**scalars, "env_steps": env_steps, "iteration": iteration})

    def log_video(self, tag: str, path: Path, env_steps: int, iteration: int) -> None:
        import wandb

        fmt: Any = Path(path).suffix.lstrip(".")  # gif or mp4, what TrainingVideos writes
        video = wandb.Video(str(path), format=fmt)
        self.run.log({tag: video, "env_steps": env_steps, "iteration": iteration})

    def flush(self) -> None:
        """W&B writes in its own process; nothing to flush here."""

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() can return before W&B's service process has written the last records; its
        # teardown waits for them, so the run is complete on disk when the command ends (for
        # `wandb sync`). Only when no other W&B run of the process is active.
        if wandb.run is None:
            wandb.teardown()


def make_backends(
    spec: str | Sequence[str] | None,
    run_dir: str | os.PathLike[str],
    *,
    purge_step: int | None = None,
    wandb: Mapping[str, Any] | None = None,
) -> list[LogBackend]:
    """The backends ``spec`` names (see :func:`parse_backends`) for a run in ``run_dir``;
    ``wandb`` holds the options of :class:`WandbBackend` (the run config's ``wandb:`` block)."""
    backends: list[LogBackend] = []
    for name in parse_backends(spec):
        if name == "tensorboard":
            backends.append(TensorBoardBackend(run_dir, purge_step))
        else:
            options = {k: v for k, v in dict(wandb or {}).items() if v is not None}
            backends.append(WandbBackend(run_dir, **options))
    return backends
