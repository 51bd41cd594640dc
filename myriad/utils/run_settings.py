"""The keys every run has, whatever the command: the top-level run keys (seed, sizes, checkpoints,
output) and the ``wandb``, ``console`` and ``video`` sections.

The settings of each command (:class:`myriad.pretrain.settings.PretrainSettings`,
:class:`myriad.finetune.settings.FinetuneSettings`) extend :class:`RunSettings` with their own
sections and defaults; see :mod:`myriad.utils.settings` for how a field is a config key.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from myriad.utils.settings import at_least, check_fields, one_of, setting

#: The logger backends ``logger`` accepts, alone or joined with ``+``.
LOGGERS = ("tensorboard", "wandb", "tensorboard+wandb", "wandb+tensorboard", "none")


@dataclass
class WandbSettings:
    """The ``wandb`` section (with ``logger=wandb``)."""

    project: str = setting("myriad", help="W&B project")
    entity: str | None = setting(None, help="your W&B team or user (null: the default)")
    mode: str = setting(
        "offline",
        help="offline: written under RUN/wandb, no network; online: uploaded; disabled",
        check=one_of("offline", "online", "disabled"),
    )
    group: str | None = setting(None, help="W&B run group")
    tags: Sequence[str] = setting(factory=list, help="W&B run tags")


@dataclass
class ConsoleSettings:
    """The ``console`` section: key figures on stdout, beside the bar or as plain lines."""

    every: int = setting(
        0, help="iterations between blocks (0: by time, every_s)", check=at_least(0)
    )
    every_s: float = setting(10.0, help="seconds between blocks (0: no blocks)", check=at_least(0))


@dataclass
class VideoSettings:
    """The ``video`` section: population videos during training (docs/visualization.md)."""

    every: int = setting(
        0,
        help="record every this many iterations into RUN/videos/train (0: off)",
        check=at_least(0),
    )
    episodes: int = setting(1, help="episodes per member", check=at_least(1))
    max_steps: int | None = setting(
        None,
        help="cut episodes after this many steps (null: the env's time limit)",
        check=at_least(1),
    )
    format: str = setting("mp4", help="mp4 | gif", check=one_of("mp4", "gif"))
    deterministic: bool = setting(False, help="act with the policy means instead of sampling")


@dataclass
class RunSettings:
    """The top-level keys of every run, and the sections every command has."""

    seed: int = setting(0, help="the run's seed (envs, networks, minibatches)", check=at_least(0))
    device: str = setting("cpu", help="cpu | cuda | cuda:N")
    num_envs: int = setting(
        512, help="parallel envs, split into population.size contiguous blocks", check=at_least(1)
    )
    num_steps: int = setting(32, help="rollout length T per iteration", check=at_least(1))
    iterations: int = setting(150, help="iterations of the run", check=at_least(1))
    run_dir: str | None = setting(
        None, help="the run folder (null: runs/<command>/<name>-<date>-<time>)"
    )
    checkpoint_every: int = setting(
        25, help="iterations between checkpoints (0: only when the run ends)", check=at_least(0)
    )
    keep_checkpoints: int | None = setting(
        3, help="periodic checkpoints kept (null: all)", check=at_least(1)
    )
    desync_episodes: bool = setting(
        True, help="first episodes end at random steps, so rollouts mix episode phases"
    )
    progress: bool = setting(True, help="progress bar and console blocks")
    tensorboard: bool = setting(True, help="TensorBoard event files (also with logger=tensorboard)")
    plots: bool = setting(True, help="figures under RUN/plots when the run ends")
    torch_threads: int = setting(
        1,
        help="torch intra-op threads (small MLPs on a shared CPU run best on one; 0: torch's "
        "default)",
        check=at_least(0),
    )
    logger: str = setting(
        "tensorboard",
        help="tensorboard | wandb | tensorboard+wandb | none (x axis: env steps)",
        check=one_of(*LOGGERS),
    )
    wandb: WandbSettings = setting(factory=WandbSettings, help="W&B (logger=wandb)")
    console: ConsoleSettings = setting(factory=ConsoleSettings, help="console blocks")
    video: VideoSettings = setting(factory=VideoSettings, help="training videos")

    def __post_init__(self) -> None:
        check_fields(self)
