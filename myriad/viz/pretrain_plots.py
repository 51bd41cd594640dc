"""Figures a pretraining run writes to ``plots/``: where each member went, and how entropy grew."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from myriad.envs.base import FeatureSpec
from myriad.utils.plotting import member_colors, project_2d, pyplot, save_figure


def coverage_map(
    path: str | Path,
    features: np.ndarray,
    member: np.ndarray,
    spec: FeatureSpec,
    walls: np.ndarray | None = None,
    coverage: Sequence[float] | None = None,
    union_coverage: float | None = None,
    title: str = "",
    max_points: int = 60000,
) -> Path:
    """Each member's visited states in its own colour over the layout.

    Args:
        features: ``[N, p]`` entropy features of visited states.
        member: ``[N]`` member of each state.
        spec: the env's features (names, bounds).
        walls: ``[W, H]`` bool wall grid in feature coordinates (2-D layouts), drawn underneath.
        coverage: per-member coverage fractions of these states for the legend.
        union_coverage: the population's coverage of these states, shown in the title.

    The runner draws the final population's evaluation episodes, and the legend says so:
    ``myriad dataset info`` measures every state of the run, so its figures are larger.
    """
    plt = pyplot()
    num_members = int(member.max()) + 1 if member.size else 1
    rng = np.random.default_rng(0)
    if len(features) > max_points:
        keep = rng.choice(len(features), max_points, replace=False)
        features, member = features[keep], member[keep]
    xy, axis_kind = project_2d(np.asarray(features, dtype=np.float64))
    fig, ax = plt.subplots(figsize=(7.5, 7))
    if walls is not None and features.shape[1] == 2:
        ax.imshow(
            walls.T,
            origin="lower",
            extent=(spec.low[0], spec.high[0], spec.low[1], spec.high[1]),
            cmap="Greys",
            vmin=0,
            vmax=1.4,
            interpolation="nearest",
        )
    colors = member_colors(num_members)
    order = rng.permutation(len(xy))  # interleave members so none is hidden under another
    xy, member = xy[order], member[order]
    ax.scatter(xy[:, 0], xy[:, 1], c=[colors[m] for m in member], s=2, alpha=0.35, linewidths=0)
    for m in range(num_members):
        label = f"member {m}"
        if coverage is not None:
            label += f"  ({100 * coverage[m]:.0f}%)"
        ax.scatter([], [], color=colors[m], s=30, label=label)
    if num_members <= 20:
        ax.legend(
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            frameon=False,
            fontsize=9,
            title="coverage, final population" if coverage is not None else None,
            title_fontsize=8,
        )
    if axis_kind == "feature" and features.shape[1] == 2:
        spec = spec.with_data_bounds(features)  # features without declared bounds: their range
        ax.set_xlim(spec.low[0], spec.high[0])
        ax.set_ylim(spec.low[1], spec.high[1])
        ax.set_xlabel(spec.names[0])
        ax.set_ylabel(spec.names[1])
        ax.set_aspect("equal")
    else:
        ax.set_xlabel(f"{axis_kind} 1")
        ax.set_ylabel(f"{axis_kind} 2")
    heading = title
    if union_coverage is not None:
        heading += f"\nfinal population: union coverage {100 * union_coverage:.1f}%"
    ax.set_title(heading.strip())
    return save_figure(fig, path, dpi=130)


def entropy_curves(
    path: str | Path, history: Mapping[str, list[tuple[int, float]]], steps_per_iteration: int
) -> Path | None:
    """Collective / individual entropy, diversity and coverage against environment steps (the
    coverage panel only for envs with a coverage grid)."""
    panels = [
        ("entropy (nats)", ["entropy/collective", "entropy/individual_mean", "entropy/diversity"]),
        ("coverage", ["coverage/union", "coverage/member_mean", "coverage/cumulative_union"]),
    ]
    panels = [(label, keys) for label, keys in panels if any(k in history for k in keys)]
    if not panels:
        return None
    plt = pyplot()
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), squeeze=False)
    for ax, (ylabel, keys) in zip(axes[0], panels):
        for key in keys:
            if key not in history:
                continue
            it, val = zip(*history[key])
            ax.plot(np.asarray(it) * steps_per_iteration, val, label=key.split("/")[1])
        ax.set_xlabel("environment steps")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(frameon=False)
    return save_figure(fig, path, dpi=120)
