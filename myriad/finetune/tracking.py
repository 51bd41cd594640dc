"""Success rates of the finetuning rollouts, from the collector's per-member episode sums."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from myriad.rl.collector import EpisodeSums, RolloutCollector


def member_scalars(
    sums: EpisodeSums, leader: int, has_success: bool, per_member: bool = True
) -> dict[str, float]:
    """Success rates of the episodes in ``sums``: overall, of the leader and (with
    ``per_member``) of each member with finished episodes. Nothing when the env reports no
    success. Returns per member are in :meth:`~myriad.rl.collector.EpisodeTracker.scalars`."""
    if not has_success:
        return {}
    count, success = sums.counts, sums.successes
    out: dict[str, float] = {}
    if count.sum() > 0:
        out["episode/success"] = float(success.sum() / count.sum())
    if count[leader] > 0:
        out["episode/success/leader"] = float(success[leader] / count[leader])
    if per_member and len(count) > 1:
        for i in np.flatnonzero(count > 0):
            out[f"episode/success/member_{i}"] = float(success[i] / count[i])
    return out


class CollectorState:
    """The finetuning collector's checkpoint entry. Loading also reads checkpoints of earlier
    versions, whose envs were wrapped in a task-statistics env keeping the success sums (now the
    collector's episode tracker keeps them)."""

    def __init__(self, collector: RolloutCollector) -> None:
        self.collector = collector

    def state_dict(self) -> dict[str, Any]:
        return self.collector.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        wrapped = state["env"].get("state_dict")
        if isinstance(wrapped, dict) and {"env", "sums", "has_success"} <= set(wrapped):
            # Earlier layout: env = {"state_dict": {"env", "sums": [return, success, count],
            # "has_success"}}, and the tracker's sums [return, length, count].
            episodes = state["episodes"]["sums"]
            success = wrapped["sums"][1]
            state = {
                **state,
                "env": wrapped["env"],
                "episodes": {
                    "sums": torch.stack(
                        [episodes[0], episodes[1], success.to(episodes), episodes[2]]
                    ),
                    "has_success": bool(wrapped["has_success"]),
                },
            }
        self.collector.load_state_dict(state)
