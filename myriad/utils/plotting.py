"""Figures written to files: the headless pyplot, one way to save and release a figure, and the
members' colours and 2-D projection every population figure shares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend (runs have no display)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, path: str | Path, dpi: int = 100) -> Path:
    """Lay out ``fig``, write it to ``path`` (creating the folder) and free it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return path


def member_colors(num_members: int) -> list[tuple[float, float, float, float]]:
    """Distinct colours, one per member (tab10 / tab20, then evenly spaced hues)."""
    from matplotlib import colormaps

    if num_members <= 10:
        cmap = colormaps["tab10"]
        return [cmap(i) for i in range(num_members)]
    if num_members <= 20:
        cmap = colormaps["tab20"]
        return [cmap(i) for i in range(num_members)]
    cmap = colormaps["hsv"]
    return [cmap(i / num_members) for i in range(num_members)]


def project_2d(points: np.ndarray) -> tuple[np.ndarray, str]:
    """Points ``[N, p]`` in 2-D: unchanged when p <= 2, else their first two principal axes."""
    if points.shape[1] == 1:
        return np.concatenate([points, np.zeros_like(points)], axis=1), "feature"
    if points.shape[1] == 2:
        return points, "feature"
    centred = points - points.mean(axis=0)
    _, _, vt = np.linalg.svd(centred[: min(len(centred), 20000)], full_matrices=False)
    return centred @ vt[:2].T, "principal component"
