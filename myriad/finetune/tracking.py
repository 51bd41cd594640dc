"""Success rates of the finetuning rollouts, from the collector's per-member episode sums."""

from __future__ import annotations

import numpy as np

from myriad.rl.collector import EpisodeSums


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
