"""Behaviour plots: what states each member visits, and how far apart the members are.

- ``behaviour_features.png``: per member, the distribution of its entropy features (the env's
  :class:`~myriad.envs.base.FeatureSpec`): a 2-D histogram for two features (torso x-y for Ant
  and the Ant mazes, x and pitch for HalfCheetah), one violin per member and feature otherwise.
- ``behaviour_orientation.png`` (features with a quaternion ``qw qx qy qz``, the hand's cube):
  per member, where the cube's +z face points (azimuth, elevation).
- ``behaviour_embedding.png``: the members' pairwise energy distances (heatmap) and a 2-D
  classical MDS embedding of them, so near members are near points.
- ``behaviour.json``: the distance matrix, the embedding and the share of the distances' variance
  it shows.

The energy distance between two members' state distributions (features scaled by their
FeatureSpec range, docs/visualization.md) is

``D(X, Y) = sqrt(2 E|X - Y| - E|X - X'| - E|Y - Y'|)``

on the empirical distributions (the V-statistic, as ``scipy.stats.energy_distance`` in 1-D). It
is zero only for identical distributions and is a metric, so the embedding is meaningful.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from myriad.envs.base import FeatureSpec
from myriad.utils.checkpoint import atomic_write_text
from myriad.utils.plotting import pyplot, save_figure

#: Elements of the pairwise-distance block computed at once (float64).
DISTANCE_BUDGET = 1 << 22
_QUATERNION = ("qw", "qx", "qy", "qz")


def scale_features(features: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """Features ``[N, p]`` in units of their FeatureSpec range: ``(f - low) / (high - low)``."""
    low = np.asarray(spec.low, dtype=np.float64)
    high = np.asarray(spec.high, dtype=np.float64)
    return (np.asarray(features, dtype=np.float64) - low) / (high - low)


def subsample_members(
    features: np.ndarray, member: np.ndarray, num_members: int, per_member: int, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """At most ``per_member`` rows of each member, padded: ``(points [M, n, p], weights [M, n])``
    with each member's weights summing to 1 (0 on padding).

    Raises:
        ValueError: a member has no rows.
    """
    rng = np.random.default_rng(seed)
    counts = np.bincount(member, minlength=num_members)
    if (counts == 0).any():
        raise ValueError(f"members {np.flatnonzero(counts == 0).tolist()} have no states")
    n = int(min(per_member, counts.max()))
    p = features.shape[1]
    points = np.zeros((num_members, n, p))
    weights = np.zeros((num_members, n))
    order = np.argsort(member, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    for m in range(num_members):  # index bookkeeping per member; the distances are batched
        rows = order[starts[m] : starts[m] + counts[m]]
        if len(rows) > n:
            rows = np.sort(rng.choice(rows, n, replace=False))
        points[m, : len(rows)] = features[rows]
        weights[m, : len(rows)] = 1.0 / len(rows)
    return points, weights


def energy_distances(points: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Pairwise energy distances ``[M, M]`` between ``M`` weighted samples.

    Args:
        points: ``[M, n, p]`` the samples (padding rows have weight 0).
        weights: ``[M, n]`` per-row weights, summing to 1 per member.

    ``A[i, j] = sum_ab w_ia w_jb |x_ia - x_jb|``, computed as ``W D W^T`` with ``W [M, M n]``
    the block-diagonal weights and ``D`` the ``[M n, M n]`` distances, in row chunks of at most
    :data:`DISTANCE_BUDGET` elements; then ``D[i, j] = sqrt(max(0, 2 A[i, j] - A[i, i] -
    A[j, j]))``.
    """
    m, n, p = points.shape
    flat = points.reshape(m * n, p)
    block = torch.zeros(m, m * n, dtype=points.dtype)
    block.view(m, m, n)[torch.arange(m), torch.arange(m)] = weights
    cross = torch.zeros(m, m, dtype=points.dtype)
    chunk = max(1, DISTANCE_BUDGET // (m * n))
    for start in range(0, m * n, chunk):  # bounded memory: one row block of D at a time
        rows = slice(start, start + chunk)
        cross += block[:, rows] @ torch.cdist(flat[rows], flat) @ block.T
    self_term = cross.diagonal()
    squared = 2 * cross - self_term[:, None] - self_term[None, :]
    out = squared.clamp(min=0).sqrt()
    out.fill_diagonal_(0.0)
    return out


def member_energy_distances(
    features: np.ndarray,
    member: np.ndarray,
    num_members: int,
    spec: FeatureSpec | None = None,
    per_member: int = 1000,
    seed: int = 0,
) -> tuple[np.ndarray, int]:
    """Energy distances ``[M, M]`` between the members' feature distributions, on features
    scaled by ``spec`` (when given), from at most ``per_member`` states of each member (drawn
    without replacement); returns the matrix and the number of states used per member."""
    x = scale_features(features, spec) if spec is not None else np.asarray(features, np.float64)
    points, weights = subsample_members(x, np.asarray(member), num_members, per_member, seed)
    d = energy_distances(torch.from_numpy(points), torch.from_numpy(weights))
    return d.numpy(), points.shape[1]


def classical_mds(distances: np.ndarray, dim: int = 2) -> tuple[np.ndarray, float]:
    """Classical (Torgerson) MDS of a distance matrix ``[M, M]``: coordinates ``[M, dim]``
    whose Euclidean distances best match, and the share of the double-centred matrix's positive
    eigenvalue mass the ``dim`` axes keep (1.0: the distances are exactly shown)."""
    d = np.asarray(distances, dtype=np.float64)
    m = d.shape[0]
    centre = np.eye(m) - np.full((m, m), 1.0 / m)
    gram = -0.5 * centre @ (d**2) @ centre
    values, vectors = np.linalg.eigh((gram + gram.T) / 2)
    order = np.argsort(values)[::-1]
    values, vectors = values[order], vectors[:, order]
    kept = np.clip(values[:dim], 0.0, None)
    coords = np.zeros((m, dim))
    coords[:, : len(kept)] = vectors[:, : len(kept)] * np.sqrt(kept)
    positive = values[values > 0].sum()
    share = float(kept.sum() / positive) if positive > 0 else 1.0
    return coords, share


def _panels(count: int, width: float, height: float) -> tuple[Any, list[Any]]:
    """A figure of ``count`` panels of ``width x height`` inches, at most four a row; returns
    it and the panels' axes (the grid's spare cells are hidden)."""
    cols = min(count, 4)
    rows = math.ceil(count / cols)
    fig, axes = pyplot().subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    for ax in axes.flat[count:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:count])


def _label(ax: Any, title: str, xlabel: str, ylabel: str | None = None) -> None:
    """A panel's title and axis labels, in the text sizes of every behaviour figure."""
    ax.set_title(title, fontsize=9)
    ax.set_xlabel(xlabel, fontsize=8)
    if ylabel is not None:
        ax.set_ylabel(ylabel, fontsize=8)
    ax.tick_params(labelsize=7)


def _save(fig: Any, path: Path, title: str) -> Path:
    """Title ``fig`` and write it at the resolution of every behaviour figure."""
    fig.suptitle(title)
    return save_figure(fig, path, dpi=110)


def _shade(
    ax: Any, hist: np.ndarray, color: Any, extent: tuple[float, float, float, float]
) -> None:
    """Draw the 2-D histogram ``hist [nx, ny]`` in ``color``, opacity growing with the log of
    the count (sparse and dense regions both stay visible)."""
    shade = np.ones((*hist.T.shape, 4))
    shade[..., :3] = np.asarray(color[:3])
    shade[..., 3] = np.log1p(hist.T) / max(np.log1p(hist.max()), 1e-9)
    ax.imshow(shade, origin="lower", extent=extent, aspect="auto", interpolation="nearest")


class _States(NamedTuple):
    """The states a features figure draws: features ``x [N, p]``, ``member [N]``, the env's
    ``spec`` and one colour per member."""

    x: np.ndarray
    member: np.ndarray
    spec: FeatureSpec
    colors: Sequence[Any]


def _feature_histograms(states: _States) -> Any:
    """Two features: one 2-D histogram per member on shared axes (the data's extent)."""
    x, member, spec, colors = states
    m = len(colors)
    lo = np.maximum(x.min(axis=0), spec.low)
    hi = np.minimum(x.max(axis=0), spec.high)
    pad = 0.05 * np.maximum(hi - lo, 1e-6)
    lo, hi = np.maximum(lo - pad, spec.low), np.minimum(hi + pad, spec.high)
    fig, axes = _panels(m, 3.1, 2.9)
    for i, ax in enumerate(axes):
        pts = x[member == i]
        hist, xe, ye = np.histogram2d(
            pts[:, 0], pts[:, 1], bins=40, range=[[lo[0], hi[0]], [lo[1], hi[1]]]
        )
        ax.set_facecolor("white")
        _shade(ax, hist, colors[i], (xe[0], xe[-1], ye[0], ye[-1]))
        _label(ax, f"member {i}  ({len(pts)} states)", spec.names[0], spec.names[1])
    return fig


def _feature_violins(states: _States) -> Any:
    """More than two features: per feature, one violin per member."""
    x, member, spec, colors = states
    m, p = len(colors), x.shape[1]
    fig, axes = _panels(p, 3.4, 2.6)
    for f, ax in enumerate(axes):
        data = [x[member == i, f] for i in range(m)]
        parts = ax.violinplot(data, positions=range(m), showextrema=False, widths=0.85)
        for body, color in zip(parts["bodies"], colors):
            body.set_facecolor(color)
            body.set_alpha(0.75)
        ax.set_xticks(range(m))
        ax.set_xticklabels([str(i) for i in range(m)], fontsize=7)
        _label(ax, spec.names[f], "member")
    return fig


def up_axis_angles(quaternion: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Azimuth and elevation (degrees) of the body's +z axis rotated by ``quaternion [N, 4]``
    (MuJoCo's ``w, x, y, z`` order)."""
    q = quaternion / np.linalg.norm(quaternion, axis=1, keepdims=True).clip(1e-12)
    w, x, y, z = q.T
    zx = 2 * (x * z + w * y)
    zy = 2 * (y * z - w * x)
    zz = 1 - 2 * (x**2 + y**2)
    return np.degrees(np.arctan2(zy, zx)), np.degrees(np.arcsin(np.clip(zz, -1, 1)))


def _orientation(
    path: Path, quaternion: np.ndarray, member: np.ndarray, colors: Sequence[Any], title: str
) -> Path:
    m = len(colors)
    azimuth, elevation = up_axis_angles(quaternion)
    fig, axes = _panels(m, 3.3, 2.4)
    for i, ax in enumerate(axes):
        sel = member == i
        hist, _, _ = np.histogram2d(
            azimuth[sel], elevation[sel], bins=(36, 18), range=[[-180, 180], [-90, 90]]
        )
        _shade(ax, hist, colors[i], (-180, 180, -90, 90))
        _label(ax, f"member {i}: cube +z axis", "azimuth (deg)", "elevation (deg)")
    return _save(fig, path, title)


def _embedding(
    path: Path,
    distances: np.ndarray,
    coords: np.ndarray,
    share: float,
    colors: Sequence[Any],
    title: str,
) -> Path:
    plt = pyplot()
    m = len(colors)
    fig, (ax_map, ax_heat) = plt.subplots(1, 2, figsize=(11, 4.6))
    ax_map.scatter(coords[:, 0], coords[:, 1], c=[c for c in colors], s=160, edgecolors="black")
    for i, (cx, cy) in enumerate(coords):
        ax_map.annotate(str(i), (cx, cy), ha="center", va="center", fontsize=8, color="white")
    span = max(float(np.ptp(coords, axis=0).max()), 1e-6)
    centre = coords.mean(axis=0)
    ax_map.set_xlim(centre[0] - 0.65 * span, centre[0] + 0.65 * span)
    ax_map.set_ylim(centre[1] - 0.65 * span, centre[1] + 0.65 * span)
    ax_map.set_aspect("equal")
    ax_map.set_xlabel("MDS axis 1 (energy distance)")
    ax_map.set_ylabel("MDS axis 2")
    ax_map.set_title(
        f"members' state distributions\n(2-D view keeps {100 * share:.0f}%)", fontsize=10
    )
    ax_map.grid(alpha=0.3)
    image = ax_heat.imshow(distances, cmap="viridis")
    if m <= 12:
        top = distances.max() if distances.size else 0.0
        for i in range(m):
            for j in range(m):
                ax_heat.text(
                    j,
                    i,
                    f"{distances[i, j]:.2f}",
                    ha="center",
                    va="center",
                    fontsize=7,
                    color="white" if distances[i, j] < 0.6 * top else "black",
                )
    ticks = range(m) if m <= 16 else range(0, m, math.ceil(m / 16))
    ax_heat.set_xticks(list(ticks))
    ax_heat.set_yticks(list(ticks))
    ax_heat.set_xlabel("member")
    ax_heat.set_ylabel("member")
    ax_heat.set_title("energy distance between members", fontsize=10)
    fig.colorbar(image, ax=ax_heat, shrink=0.85)
    return _save(fig, path, title)


def behaviour_plots(
    plots_dir: str | os.PathLike[str],
    features: np.ndarray | torch.Tensor,
    member: np.ndarray | torch.Tensor,
    spec: FeatureSpec,
    num_members: int | None = None,
    title: str = "",
    seed: int = 0,
) -> list[Path]:
    """Write the behaviour figures and ``behaviour.json`` (module docstring) into
    ``plots_dir``; returns the files written.

    Args:
        features: ``[N, p]`` (or ``[T, E, p]``) entropy features of visited states.
        member: ``[N]`` (or ``[T, E]``) the member of each state.
        spec: the env's features (names, bounds; an infinite bound is replaced by the data's).
        num_members: M (default: the largest member index + 1).
        title: figure titles (e.g. the env and run).
        seed: subsampling seed of the distance estimate.
    """
    from myriad.viz.render import member_colors

    x = np.asarray(torch.as_tensor(features).detach().cpu(), dtype=np.float64).reshape(-1, spec.dim)
    who = np.asarray(torch.as_tensor(member).detach().cpu(), dtype=np.int64).reshape(-1)
    spec = spec.with_data_bounds(x)  # features without declared bounds: scaled by their range
    m = int(num_members if num_members is not None else who.max() + 1)
    colors = member_colors(m)
    out = Path(plots_dir)
    written = []
    draw = _feature_histograms if spec.dim == 2 else _feature_violins
    fig = draw(_States(x, who, spec, colors))
    written.append(_save(fig, out / "behaviour_features.png", title))
    names = tuple(spec.names)
    if all(q in names for q in _QUATERNION):
        quaternion = x[:, [names.index(q) for q in _QUATERNION]]
        written.append(
            _orientation(out / "behaviour_orientation.png", quaternion, who, colors, title)
        )
    distances, per_member = member_energy_distances(x, who, m, spec, seed=seed)
    coords, share = classical_mds(distances)
    written.append(
        _embedding(out / "behaviour_embedding.png", distances, coords, share, colors, title)
    )
    record = {
        "feature_names": list(spec.names),
        "feature_scaling": "(f - low) / (high - low) with the FeatureSpec bounds",
        "states_per_member": per_member,
        "energy_distance": distances.round(6).tolist(),
        "mds_coordinates": coords.round(6).tolist(),
        "mds_variance_share": round(share, 6),
    }
    path = out / "behaviour.json"
    atomic_write_text(path, json.dumps(record, indent=2) + "\n")
    written.append(path)
    return written
