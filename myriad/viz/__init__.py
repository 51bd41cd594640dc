"""Seeing a population: videos of every member, behaviour plots and a shareable run report.

- :func:`render_run` / :func:`render_population` (:mod:`myriad.viz.render`): one video per member
  and a labelled grid of the whole population, for the nav envs (top-down, NumPy raster) and the
  MuJoCo envs (MuJoCo's renderer, headless through :mod:`myriad.viz.gl`).
- :func:`behaviour_plots` (:mod:`myriad.viz.behaviour`): per-member feature distributions and a
  2-D embedding of the members' energy distances.
- :func:`write_report` (:mod:`myriad.viz.report`): ``RUN/report.html`` with everything embedded.
- :class:`TrainingVideos` (:mod:`myriad.viz.runs`): videos every ``video.every`` iterations.
- The figures a run writes to ``plots/``, each from plain data (arrays, scalar histories,
  evaluation results): :mod:`myriad.viz.pretrain_plots` (coverage map, entropy and coverage
  curves), :mod:`myriad.viz.finetune_plots` (pairwise KL heatmap, overview, KL set point) and
  :mod:`myriad.viz.route_plots` (the members' evaluation routes).

Names are imported on first use, so ``import myriad.viz`` costs nothing until then.
docs/visualization.md describes the commands and files.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "render_run": "myriad.viz.render",
    "render_population": "myriad.viz.render",
    "RenderResult": "myriad.viz.render",
    "record_episodes": "myriad.viz.rollout",
    "Recording": "myriad.viz.rollout",
    "behaviour_plots": "myriad.viz.behaviour",
    "member_energy_distances": "myriad.viz.behaviour",
    "classical_mds": "myriad.viz.behaviour",
    "write_report": "myriad.viz.report",
    "TrainingVideos": "myriad.viz.runs",
    "run_behaviour_plots": "myriad.viz.runs",
    "model_behaviour_plots": "myriad.viz.runs",
    "VideoWriter": "myriad.viz.video",
    "read_video": "myriad.viz.video",
    "ensure_headless_gl": "myriad.viz.gl",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'myriad.viz' has no attribute {name!r}")
