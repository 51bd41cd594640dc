"""The routes figure of a finetuning run: every member's successful evaluation paths on the
layout, coloured by member, and, with ``eval.perturb``, the same after the leader's route is
walled off."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from myriad.assess.evaluation import PopulationEvaluation
from myriad.assess.solutions import RegionMap
from myriad.envs.base import FeatureSpec
from myriad.envs.layout import Layout
from myriad.utils.plotting import member_colors, project_2d, pyplot, save_figure

# Members on the same route would hide each other: each member's paths are shifted by a small
# offset of its own (in feature units, a fraction of a nav cell).
_MEMBER_OFFSET = 0.12


def _panel(
    ax,
    legend_ax,
    evaluation: PopulationEvaluation,
    spec: FeatureSpec,
    leader: int,
    layout: Layout | None,
    blocked_cells: list[list[int]],
    max_paths: int,
    heading: str,
) -> None:
    batch = evaluation.episodes
    assert batch.features is not None and batch.valid is not None
    num_members = len(evaluation.member_success)
    colors = member_colors(num_members)
    features = batch.features.numpy()
    if layout is not None:
        ax.imshow(
            layout.walls_xy().T,
            origin="lower",
            extent=(0, layout.width, 0, layout.height),
            cmap="Greys",
            vmin=0,
            vmax=1.4,
            interpolation="nearest",
        )
        for r, c in blocked_cells:
            x, y = c, layout.height - 1 - r
            ax.add_patch(_rectangle((x, y), 1, 1, color="tab:red", alpha=0.55, linewidth=0))
    labels = evaluation.solutions.labels
    success = batch.success.numpy() if batch.has_success else np.ones(len(batch.member), bool)
    member = batch.member.numpy()
    valid = batch.valid.numpy()
    offsets = (np.arange(num_members) - (num_members - 1) / 2) * _MEMBER_OFFSET
    for m in range(num_members):
        chosen = np.flatnonzero((member == m) & success)[:max_paths]
        for n in chosen:
            xy, _ = project_2d(features[n, valid[n]].astype(np.float64))
            ax.plot(
                xy[:, 0] + offsets[m], xy[:, 1] + offsets[m], color=colors[m], lw=1.1, alpha=0.8
            )
        route = int(evaluation.member_route[m])
        text = f"route {labels[route]}" if route >= 0 else "no success"
        rate = 100 * float(evaluation.member_success[m])
        name = f"member {m}{' (leader)' if m == leader else ''}: {text}, {rate:.0f}%"
        ax.plot([], [], color=colors[m], lw=2, label=name)
    if layout is not None:
        ax.set_xlim(0, layout.width)
        ax.set_ylim(0, layout.height)
    elif spec.dim == 2:
        ax.set_xlim(spec.low[0], spec.high[0])
        ax.set_ylim(spec.low[1], spec.high[1])
    if spec.dim <= 2:
        ax.set_aspect("equal")
    ax.set_title(heading, fontsize=9)
    ax.tick_params(labelsize=7)
    # The legend gets an axis of its own under the map, so the layout leaves room for it.
    legend_ax.axis("off")
    handles, names = ax.get_legend_handles_labels()
    legend_ax.legend(handles, names, loc="upper left", fontsize=7, frameon=False, ncol=2)


def _rectangle(xy, width, height, **kwargs):
    from matplotlib.patches import Rectangle

    return Rectangle(xy, width, height, **kwargs)


def route_map(
    path: str | Path,
    evaluation: PopulationEvaluation,
    regions: RegionMap,
    spec: FeatureSpec,
    leader: int,
    perturbed: PopulationEvaluation | None = None,
    perturbed_layout: Layout | None = None,
    blocked_cells: list[list[int]] | None = None,
    title: str = "",
    max_paths: int = 6,
) -> Path:
    """Draw up to ``max_paths`` successful evaluation paths per member over the layout
    (features projected to 2-D where the env has no layout), one colour per member, with each
    member's route label and success rate; a second panel shows ``perturbed`` on
    ``perturbed_layout`` with the walled-off cells (``blocked_cells``, ``[row, col]``) in red.

    Args:
        evaluation: the final evaluation (with features).
        regions: its region map (gives the layout).
        spec: the env's features.
        leader: the leader's index.
    """
    plt = pyplot()
    panels = 2 if perturbed is not None else 1
    layout = regions.layout
    width = 6.0 if layout is None else max(4.5, 0.33 * layout.width + 1.0)
    height = 6.0 if layout is None else max(3.0, 0.33 * layout.height + 1.0)
    legend_height = 0.2 * ((len(evaluation.member_success) + 1) // 2) + 0.2
    fig, axes = plt.subplots(
        2,
        panels,
        figsize=(width * panels, height + legend_height),
        squeeze=False,
        gridspec_kw={"height_ratios": [height, legend_height]},
    )
    count = evaluation.solutions.count
    _panel(
        axes[0, 0],
        axes[1, 0],
        evaluation,
        spec,
        leader,
        layout,
        [],
        max_paths,
        f"successful paths, {count} distinct solution{'s' if count != 1 else ''}",
    )
    if perturbed is not None:
        after = perturbed.scalars
        _panel(
            axes[0, 1],
            axes[1, 1],
            perturbed,
            spec,
            leader,
            perturbed_layout if perturbed_layout is not None else layout,
            blocked_cells or [],
            max_paths,
            "leader's route walled off (red): best member "
            f"{100 * after['eval/population_success']:.0f}%, leader "
            f"{100 * after['eval/leader_success']:.0f}%",
        )
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path, dpi=110)
