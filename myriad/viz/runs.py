"""Behaviour plots and videos of a run, as the runners and ``myriad report`` call them."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myriad.envs import import_env_modules, make_from_config
from myriad.envs.base import FeatureSpec
from myriad.envs.registry import entry
from myriad.nn.population import PopulationActorCritic
from myriad.utils.config import ConfigError
from myriad.viz.behaviour import behaviour_plots
from myriad.viz.rollout import Recording, record_episodes
from myriad.viz.video import FORMATS

#: Env families whose runs get behaviour plots at the end of training (the nav envs have the
#: coverage map).
BEHAVIOUR_FAMILIES: tuple[str, ...] = ("mujoco", "gymnasium")
#: Offset of the seed of recorded episodes from the run's seed, so videos and behaviour plots
#: never replay the training envs' episodes.
RECORD_SEED_OFFSET = 30_000


def env_family(env_cfg: Mapping[str, Any]) -> str:
    """The registry family of a run's env (``"nav"``, ``"mujoco"``, ...), after importing the
    module that registers it (``env.module``)."""
    import_env_modules(env_cfg.get("module"))
    return entry(str(env_cfg["name"])).family


def run_behaviour_plots(
    env_cfg: Mapping[str, Any],
    plots_dir: str | os.PathLike[str],
    features: np.ndarray | torch.Tensor,
    member: np.ndarray | torch.Tensor,
    spec: FeatureSpec,
    num_members: int,
    title: str = "",
) -> list[Path]:
    """:func:`~myriad.viz.behaviour.behaviour_plots` for runs on a MuJoCo env (the families in
    :data:`BEHAVIOUR_FAMILIES`); nothing for other envs. ``features [T, E, p]`` or ``[N, p]``
    and ``member`` of the same leading shape, as a runner's final evaluation collects them."""
    if env_family(env_cfg) not in BEHAVIOUR_FAMILIES:
        return []
    return behaviour_plots(plots_dir, features, member, spec, num_members, title)


@torch.no_grad()
def record_features(
    model: PopulationActorCritic,
    env_cfg: Mapping[str, Any],
    *,
    episodes: int = 1,
    seed: int = 0,
    deterministic: bool = False,
    max_steps: int | None = None,
    device: torch.device | str = "cpu",
) -> tuple[Recording, FeatureSpec]:
    """``episodes`` episodes of every member in one env batch, recording only the entropy
    features; returns the recording and the env's FeatureSpec."""
    members = list(range(model.num_members))
    env = make_from_config(dict(env_cfg), len(members) * episodes, device)
    try:
        model = model.to(env.device)
        rec = record_episodes(
            model,
            env,
            members,
            episodes,
            lambda e: e.current_features(),
            deterministic=deterministic,
            seed=seed,
            max_steps=max_steps,
        )
        return rec, env.features
    finally:
        env.close()


def model_behaviour_plots(
    model: PopulationActorCritic,
    env_cfg: Mapping[str, Any],
    plots_dir: str | os.PathLike[str],
    *,
    seed: int,
    episodes: int = 1,
    title: str = "",
    device: torch.device | str = "cpu",
    families: tuple[str, ...] | None = BEHAVIOUR_FAMILIES,
) -> list[Path]:
    """Behaviour plots of a population from a fresh rollout of ``episodes`` episodes per member
    (for runners without a final rollout of their own, and for ``myriad report``); nothing when
    the env's family is not in ``families`` (None: every env)."""
    if families is not None and env_family(env_cfg) not in families:
        return []
    rec, spec = record_features(
        model, env_cfg, episodes=episodes, seed=seed + RECORD_SEED_OFFSET, device=device
    )
    features, member = rec.member_features()
    return behaviour_plots(plots_dir, features, member, spec, model.num_members, title)


def evaluation_behaviour_plots(
    env_cfg: Mapping[str, Any],
    plots_dir: str | os.PathLike[str],
    model: PopulationActorCritic,
    episodes: Any,
    spec: FeatureSpec,
    *,
    seed: int,
    title: str = "",
) -> list[Path]:
    """Behaviour plots of a finetuning run (MuJoCo envs only, as :func:`run_behaviour_plots`):
    from its final evaluation's episodes when they hold features (an
    :class:`~myriad.assess.evaluation.EpisodeBatch`: ``features [N, T + 1, p]``, ``valid
    [N, T + 1]``, ``member [N]``), else from a fresh rollout of one episode per member."""
    if env_family(env_cfg) not in BEHAVIOUR_FAMILIES:
        return []
    features = getattr(episodes, "features", None)
    valid = getattr(episodes, "valid", None)
    if features is None or valid is None:
        device = next(model.parameters()).device
        return model_behaviour_plots(
            model, env_cfg, plots_dir, seed=seed, title=title, device=device
        )
    member = episodes.member[:, None].expand(valid.shape)
    return behaviour_plots(
        plots_dir, features[valid], member[valid], spec, model.num_members, title
    )


class TrainingVideos:
    """Population videos during training, every ``every`` iterations (the ``video:`` config
    block): a labelled grid of all members into ``<run>/videos/train/iter_NNNNNN.<fmt>``, and
    its middle frame as an image in TensorBoard (``videos/population``).

    TensorBoard's own video summaries need moviepy; the still keeps the events file light and
    the video file plays anywhere.

    Args:
        run_dir: the run folder.
        env_cfg: the run's env config; a fresh local env is built for each recording.
        every: iterations between recordings (> 0).
        episodes: episodes per member.
        max_steps: cut episodes after this many steps (None: the env's time limit).
        fmt: ``"mp4"`` or ``"gif"``.
        deterministic: act with the policy means.
        seed: the run's seed (the recorded episodes use an offset of it, the same every time, so
            successive videos start from the same states).
        device: where the population lives.
        tensorboard: also log the still.
    """

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        env_cfg: Mapping[str, Any],
        every: int,
        *,
        episodes: int = 1,
        max_steps: int | None = None,
        fmt: str = "mp4",
        deterministic: bool = False,
        seed: int = 0,
        device: torch.device | str = "cpu",
        tensorboard: bool = True,
    ) -> None:
        if every < 1 or episodes < 1 or (max_steps is not None and max_steps < 1):
            raise ConfigError(
                f"video.every and video.episodes must be >= 1 and video.max_steps >= 1 or null, "
                f"got {every}, {episodes}, {max_steps}"
            )
        if fmt not in FORMATS:
            raise ConfigError(f"video.format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        if env_family(env_cfg) != "nav":
            from myriad.viz.gl import ensure_headless_gl

            ensure_headless_gl()  # fail before training, not at the first recording
        self.folder = Path(run_dir) / "videos" / "train"
        self.run_dir = Path(run_dir)
        self.env_cfg = dict(env_cfg)
        self.every = int(every)
        self.episodes = int(episodes)
        self.max_steps = max_steps
        self.fmt = fmt
        self.deterministic = bool(deterministic)
        self.seed = int(seed) + RECORD_SEED_OFFSET
        self.device = device
        self.tensorboard = tensorboard
        self._writer: Any = None

    @classmethod
    def from_config(
        cls, cfg: Mapping[str, Any], run_dir: str | os.PathLike[str]
    ) -> TrainingVideos | None:
        """The recorder a run config asks for, or None when ``video.every`` is 0 or absent."""
        video = dict(cfg.get("video") or {})
        every = int(video.get("every") or 0)
        if every == 0:
            return None
        return cls(
            run_dir,
            cfg["env"],
            every,
            episodes=int(video.get("episodes", 1)),
            max_steps=video.get("max_steps"),
            fmt=str(video.get("format", "mp4")),
            deterministic=bool(video.get("deterministic", False)),
            seed=int(cfg.get("seed", 0)),
            device=cfg.get("device", "cpu"),
            tensorboard=bool(cfg.get("tensorboard", True)),
        )

    def due(self, iteration: int) -> bool:
        """Whether iteration ``iteration`` (1-based, just completed) is recorded."""
        return iteration % self.every == 0

    def record(
        self, model: PopulationActorCritic, iteration: int, env_steps: int | None = None
    ) -> Path:
        """Write the video of iteration ``iteration`` and log its still at x = ``env_steps``
        (default ``iteration``; the scalars' x axis is env steps); returns the file."""
        from myriad.viz.render import render_population

        result = render_population(
            model,
            self.env_cfg,
            self.folder,
            episodes=self.episodes,
            fmt=self.fmt,
            deterministic=self.deterministic,
            seed=self.seed,
            max_steps=self.max_steps,
            per_member=False,
            grid_name=f"iter_{iteration:06d}",
            device=self.device,
        )
        if self.tensorboard:
            if self._writer is None:
                from torch.utils.tensorboard import SummaryWriter

                self._writer = SummaryWriter(str(self.run_dir), filename_suffix=".videos")
            step = iteration if env_steps is None else env_steps
            self._writer.add_image("videos/population", result.still, step, dataformats="HWC")
            self._writer.flush()
        return result.grid

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None
