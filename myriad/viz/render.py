"""Videos of a population: one per member and a labelled grid of all of them side by side.

:func:`render_run` loads the population of a pretraining or finetuning run (or of one checkpoint)
with :func:`myriad.rl.saved_population.load_population`, records its members in one env batch
(:func:`myriad.viz.rollout.record_episodes`) and writes ``member_MM.<fmt>`` and
``population.<fmt>`` into the run's ``videos/`` folder. :func:`render_population` does the same
for a population in memory (training-time videos).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myriad.envs import make_from_config
from myriad.nn.population import PopulationActorCritic
from myriad.utils.checkpoint import atomic_write_text
from myriad.utils.config import ConfigError, run_folder
from myriad.utils.ownership import claim_output
from myriad.utils.runlock import RunLock
from myriad.viz.painters import make_painter
from myriad.viz.rollout import Recording, record_episodes
from myriad.viz.video import GridComposer, VideoWriter, check_format


@dataclass
class RenderResult:
    """What :func:`render_population` wrote.

    Attributes:
        grid: the population video (all members side by side, labelled).
        members: member index -> its video (absent when only the grid was written).
        frames: video path -> number of frames written.
        fps: playback rate.
        still: a frame of the grid video ``[H, W, 3]`` (halfway through the first episodes).
        recording: the recorded episodes (states, features, returns).
        sizes: video path -> ``(H, W)`` of its frames (None for a video without frames).
    """

    grid: Path
    members: dict[int, Path]
    frames: dict[Path, int]
    fps: float
    still: np.ndarray
    recording: Recording
    sizes: dict[Path, tuple[int, int] | None] = field(default_factory=dict)


def member_colors(num_members: int) -> list[tuple[float, ...]]:
    """The colour of each member, as in the run's coverage map."""
    from myriad.utils.plotting import member_colors as colors

    return [tuple(c) for c in colors(num_members)]


def parse_members(members: Sequence[int] | str | None, num_members: int) -> list[int]:
    """``None`` or ``"all"``: every member; else the given indices, checked.

    Raises:
        ConfigError: an index is out of range (the message gives the range).
    """
    if members is None or members == "all":
        return list(range(num_members))
    chosen = [int(m) for m in members]
    bad = [m for m in chosen if not 0 <= m < num_members]
    if bad or not chosen:
        raise ConfigError(
            f"members {bad or chosen} out of range: the population has {num_members} members "
            f"(0..{num_members - 1}); pass indices in that range or 'all'"
        )
    return chosen


@torch.no_grad()
def render_population(
    model: PopulationActorCritic,
    env_cfg: Mapping[str, Any],
    out_dir: str | os.PathLike[str],
    *,
    members: Sequence[int] | str | None = None,
    episodes: int = 1,
    fmt: str = "mp4",
    deterministic: bool = False,
    seed: int = 0,
    max_steps: int | None = None,
    per_member: bool = True,
    grid_name: str = "population",
    device: torch.device | str = "cpu",
) -> RenderResult:
    """Record ``episodes`` episodes of each chosen member and write the videos.

    Args:
        model: the population.
        env_cfg: the run's env config (``name``, ``options``); a fresh local env is built.
        out_dir: folder of the videos.
        members: member indices, or None / ``"all"``.
        episodes: episodes per member; a member's video plays them one after the other, and so
            does the grid (each episode as long as the longest member's).
        fmt: ``"mp4"`` or ``"gif"``.
        deterministic: act with the policy means instead of sampling.
        seed: env and action-sampling seed.
        max_steps: cut episodes after this many steps (default: the env's time limit).
        per_member: also write one video per member (else only the grid).
        grid_name: file name (without suffix) of the grid video.
        device: where the env and the policy run.
    """
    check_format(fmt)
    if episodes < 1:
        raise ConfigError(f"episodes must be >= 1, got {episodes}")
    if max_steps is not None and max_steps < 1:
        raise ConfigError(f"max_steps must be >= 1, got {max_steps}")
    chosen = parse_members(members, model.num_members)
    out = Path(out_dir)
    colors = member_colors(model.num_members)
    env = make_from_config(dict(env_cfg), len(chosen) * episodes, device)
    try:
        painter = make_painter(env, colors)
        try:
            model = model.to(env.device)
            recording = record_episodes(
                model,
                env,
                chosen,
                episodes,
                painter.capture,
                deterministic=deterministic,
                seed=seed,
                max_steps=max_steps,
            )
            return _write_videos(painter, recording, out, fmt, colors, per_member, grid_name)
        finally:
            painter.close()
    finally:
        env.close()


def _write_videos(
    painter: Any,
    rec: Recording,
    out: Path,
    fmt: str,
    colors: Sequence[Sequence[float]],
    per_member: bool,
    grid_name: str,
) -> RenderResult:
    labels = [f"member {m}" for m in rec.members]
    grid = GridComposer(len(rec.members), painter.size, labels, [colors[m] for m in rec.members])
    grid_path = out / f"{grid_name}.{fmt}"
    writers: dict[int, VideoWriter] = {}
    grid_writer = VideoWriter(grid_path, painter.fps)
    still = None
    try:
        # A member listed twice gets its video from its first listing.
        first: dict[int, int] = {}
        for j, m in enumerate(rec.members):
            first.setdefault(m, j)
        if per_member:
            for m in first:
                writers[m] = VideoWriter(out / f"member_{m:02d}.{fmt}", painter.fps)
        for k in range(rec.episodes):
            envs = rec.episode_envs(k)
            frames = rec.frames[envs]
            middle = int(frames.max()) // 2
            stream = painter.episode(rec.states[:, envs], frames, rec.member[envs])
            for t, tiles in enumerate(stream):
                for m, writer in writers.items():
                    j = first[m]
                    if t < frames[j]:
                        writer.append(tiles[j])
                frame = grid.compose(tiles)
                grid_writer.append(frame)
                if k == 0 and t == middle:
                    still = frame
    finally:
        paths = {m: w.close() for m, w in writers.items()}
        grid_writer.close()
    assert still is not None  # episodes >= 1, and the first one has its middle frame
    counts = {grid_path: grid_writer.frames, **{paths[m]: w.frames for m, w in writers.items()}}
    sizes = {grid_path: grid_writer.size, **{paths[m]: w.size for m, w in writers.items()}}
    return RenderResult(grid_path, paths, counts, painter.fps, still, rec, sizes)


def render_run(
    source: str | os.PathLike[str],
    out_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    **options: Any,
) -> RenderResult:
    """Videos of the population saved at ``source`` (a run folder of ``myriad pretrain`` or
    ``myriad finetune``, its ``checkpoints/`` folder, or a checkpoint file), written to
    ``out_dir`` (default: ``<run>/videos``). ``options`` are those of
    :func:`render_population` (the seed defaults to the run's).

    Raises:
        OwnershipError: ``out_dir`` is a file or folder of a run, or a video to write exists
            and was not written by render (unless ``overwrite``;
            :func:`myriad.utils.ownership.claim_output`)."""
    from myriad.rl.saved_population import load_population

    pre = load_population(source)
    folder = run_folder(pre.path)
    root = folder if (folder / "config.yaml").is_file() else pre.path.parent
    default = root / "videos"
    out = Path(out_dir) if out_dir is not None else default
    options.setdefault("seed", int(pre.config.get("seed", 0)))
    fmt = str(options.get("fmt", "mp4"))
    chosen = parse_members(options.get("members"), pre.model.num_members)
    names = [f"population.{fmt}"]
    if options.get("per_member", True):
        names += [f"member_{m:02d}.{fmt}" for m in dict.fromkeys(chosen)]
    # The run's own videos/ folder is render's; elsewhere, only the files render listed.
    ours = _rendered(out) | (set(names) if out.resolve() == default.resolve() else set())
    claim_output(out, "render", overwrite=overwrite, made_by_command=Path.is_dir)
    for name in names:
        claim_output(
            out / name, "render", overwrite=overwrite, made_by_command=lambda p: p.name in ours
        )
    # Into a run's folder only while no other process trains it.
    inside = root.resolve() in (out.resolve(), *out.resolve().parents)
    with RunLock(root, "render") if inside and (root / "config.yaml").is_file() else nullcontext():
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / RENDER_MARKER, json.dumps(sorted(ours | set(names))))
        return render_population(pre.model, pre.env, out, **options)


#: The list of the videos ``myriad render`` wrote into a folder: only those it replaces.
RENDER_MARKER = ".myriad-render.json"


def _rendered(folder: Path) -> set[str]:
    try:
        names = json.loads((folder / RENDER_MARKER).read_text())
    except (OSError, ValueError):
        return set()
    return {str(n) for n in names} if isinstance(names, list) else set()
