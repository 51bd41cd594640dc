"""Figures a finetuning run writes to ``plots/``: the members' pairwise KL matrix and an
overview of the leader's progress, its off-policy ESS and the followers' distance to it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from myriad.utils.plotting import pyplot, save_figure


def kl_heatmap(path: str | Path, matrix: torch.Tensor, leader: int = 0) -> Path:
    """Heatmap of ``matrix [M, M]`` (entry (i, j) = KL(pi_i || pi_j)); the leader's row and
    column are labelled ``L``."""
    plt = pyplot()
    m = matrix.shape[0]
    values = matrix.detach().cpu().numpy()
    fig, ax = plt.subplots(figsize=(1.0 + 0.55 * m, 0.6 + 0.5 * m))
    image = ax.imshow(values, cmap="viridis")
    labels = [f"{i}{' (L)' if i == leader else ''}" for i in range(m)]
    ax.set_xticks(range(m), labels, fontsize=7, rotation=90)
    ax.set_yticks(range(m), labels, fontsize=7)
    ax.set_xlabel("j", fontsize=8)
    ax.set_ylabel("i", fontsize=8)
    ax.set_title("KL(pi_i || pi_j), last rollout's states", fontsize=9)
    if m <= 12:
        top = values.max() if values.size else 0.0
        for i in range(m):
            for j in range(m):
                color = "black" if values[i, j] > 0.6 * top else "white"
                ax.text(
                    j, i, f"{values[i, j]:.2g}", ha="center", va="center", fontsize=6, color=color
                )
    fig.colorbar(image, ax=ax, fraction=0.046)
    return save_figure(fig, path, dpi=110)


def _legend(ax, **kwargs) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(**kwargs)


def _series(history: Mapping[str, Sequence[tuple[int, float]]], key: str, per_step: int):
    points = history.get(key) or []
    return [s * per_step for s, _ in points], [v for _, v in points]


def _lines(
    ax: Any,
    history: Mapping[str, Sequence[tuple[int, float]]],
    steps_per_iteration: int,
    *curves: tuple[str, str],
) -> None:
    """Plot each logged ``(key, label)`` against env steps; keys never logged are skipped."""
    for key, label in curves:
        x, y = _series(history, key, steps_per_iteration)
        if x:
            ax.plot(x, y, label=label, linewidth=1.2)


def overview(
    path: str | Path,
    history: Mapping[str, Sequence[tuple[int, float]]],
    steps_per_iteration: int,
    title: str = "",
) -> Path:
    """Four panels against env steps: the leader's evaluation and training success, each
    member's training success, the followers' KL to the leader, and the leader's off-policy
    ESS with the discriminator's accuracy (panels without data are left empty)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.5))
    ax = axes[0, 0]
    _lines(
        ax,
        history,
        steps_per_iteration,
        ("eval/leader_success", "leader, deterministic eval"),
        ("episode/success/leader", "leader, training episodes"),
        ("episode/success", "all members, training episodes"),
    )
    ax.set_title("success rate", fontsize=9)
    ax.set_ylim(-0.02, 1.02)
    _legend(ax, fontsize=7)

    ax = axes[0, 1]
    members = sorted(
        (k for k in history if k.startswith("episode/success/member_")),
        key=lambda k: int(k.rsplit("_", 1)[1]),
    )
    for key in members:
        x, y = _series(history, key, steps_per_iteration)
        ax.plot(x, y, label=key.rsplit("/", 1)[1], linewidth=0.9)
    ax.set_title("success rate per member (training episodes)", fontsize=9)
    _legend(ax, fontsize=6, ncol=2)

    ax = axes[1, 0]
    _lines(
        ax,
        history,
        steps_per_iteration,
        ("kl_to_leader/on_leader_states_mean", "on the leader's states"),
        ("kl_to_leader/on_own_states_mean", "on the followers' own states"),
        ("diversity/pairwise_kl_mean", "pairwise mean, all members"),
    )
    ax.set_yscale("symlog", linthresh=1e-2)
    ax.set_title("KL(follower || leader)", fontsize=9)
    _legend(ax, fontsize=7)

    ax = axes[1, 1]
    _lines(
        ax,
        history,
        steps_per_iteration,
        ("train/leader_ess", "leader's off-policy ESS"),
        ("train/disc_accuracy", "discriminator accuracy"),
    )
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("ESS / n and discriminator accuracy", fontsize=9)
    _legend(ax, fontsize=7)

    for a in axes.flat:
        a.set_xlabel("env steps", fontsize=8)
        a.tick_params(labelsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path, dpi=100)


def _followers(history: Mapping[str, Sequence[tuple[int, float]]], prefix: str) -> list[int]:
    """Member indices of the followers logged as ``<prefix>/follower_<i>``, sorted."""
    return sorted(int(k.rsplit("_", 1)[1]) for k in history if k.startswith(f"{prefix}/follower_"))


def kl_setpoint(
    path: str | Path, history: Mapping[str, Sequence[tuple[int, float]]], title: str = ""
) -> Path | None:
    """CPO's couplings per follower against iterations: the KL to the leader on the follower's
    own states with its target and the band [0.5, 2] x target (set-point mode), the KL
    penalty's coefficient (``lambda - rho``, negative while the set point repels) and the
    adversarial coefficient (the values each update used). Iterations
    that only fit the critics are shaded. None (nothing written) when no ``cpo/kl`` was logged.
    """
    followers = _followers(history, "cpo/kl")
    if not followers:
        return None
    plt = pyplot()
    adversarial = bool(_followers(history, "cpo/adversarial_coef"))
    panels = 3 if adversarial else 2
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    warmup = [s for s, v in history.get("train/critic_only", []) if v > 0]
    for k, i in enumerate(followers):
        color = colors[k % len(colors)]
        x, y = _series(history, f"cpo/kl/follower_{i}", 1)
        axes[0].plot(x, y, color=color, linewidth=1.1, label=f"follower {i}")
        targets = [v for _, v in history.get(f"cpo/kl_target/follower_{i}", [])]
        if targets:
            target = targets[-1]
            axes[0].axhline(target, color=color, linestyle="--", linewidth=0.8)
            axes[0].axhspan(0.5 * target, 2.0 * target, color=color, alpha=0.1, linewidth=0)
        x, y = _series(history, f"cpo/kl_coef/follower_{i}", 1)
        axes[1].plot(x, y, color=color, linewidth=1.1)
        if adversarial:
            x, y = _series(history, f"cpo/adversarial_coef/follower_{i}", 1)
            axes[2].plot(x, y, color=color, linewidth=1.1)
    titles = [
        "KL(follower || leader), own states",
        "KL penalty lambda - rho (< 0: repulsion)",
        "adversarial c_adv",
    ]
    for k, (ax, name) in enumerate(zip(axes, titles)):
        if warmup:
            ax.axvspan(min(warmup) - 0.5, max(warmup) + 0.5, color="0.85", linewidth=0)
        if k == 1:  # the set point's repulsion makes the coefficient negative
            ax.set_yscale("symlog", linthresh=0.01)
            ax.axhline(0.0, color="0.5", linewidth=0.6)
        else:
            ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("iteration", fontsize=8)
        ax.tick_params(labelsize=7)
    _legend(axes[0], fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    return save_figure(fig, path, dpi=100)
