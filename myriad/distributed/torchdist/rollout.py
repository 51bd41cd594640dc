"""The whole rollout on every rank, from the ranks' shares of it.

A rank collects ``[T, E/R, ...]`` of its own envs. :func:`gather_rollout` concatenates every
rank's columns in rank order into a storage of the run's ``[T, E, ...]`` layout, which is the
storage one process would have filled: the same member blocks, so the same member-major
minibatches. An update that reads rows of several members at once (a leader's transitions, every
member's samples, per-member sums) then runs on every rank as in one process.
"""

from __future__ import annotations

import torch

from myriad.distributed.torchdist.group import RankGroup
from myriad.rl.storage import RolloutStorage

#: The ``[T, E, ...]`` buffers a collector fills (``features``, ``means`` and ``log_stds`` may be
#: absent); ``advantages`` and ``returns`` are the update's own.
COLLECTED = (
    "obs",
    "actions",
    "log_probs",
    "values",
    "rewards",
    "truncation_values",
    "terminated",
    "truncated",
    "dones",
    "features",
    "means",
    "log_stds",
)


def rollout_like(local: RolloutStorage, member: torch.Tensor) -> RolloutStorage:
    """An empty storage of the whole run: ``local``'s fields and steps over the envs of
    ``member`` (``[E]``, the run's member of every env), with ``local``'s extra fields."""
    full = RolloutStorage(
        local.num_steps,
        member,
        local.obs_dim,
        local.action_dim,
        num_members=local.num_members,
        feature_dim=local.feature_dim,
        store_action_params=local.means is not None,
        device=local.device,
        dtype=local.dtype,
    )
    for name, buffer in local.extras.items():
        full.register_field(
            name,
            tuple(buffer.shape[2:]),
            dtype=buffer.dtype,
            in_batch=name not in local._rollout_only,
        )
    return full


def _pairs(local: RolloutStorage, full: RolloutStorage) -> list[tuple[torch.Tensor, torch.Tensor]]:
    pairs = []
    for name in COLLECTED:
        mine = getattr(local, name)
        if mine is not None:
            pairs.append((mine, getattr(full, name)))
    pairs.extend((buffer, full.extras[name]) for name, buffer in local.extras.items())
    return pairs


@torch.no_grad()
def gather_rollout(ranks: RankGroup, local: RolloutStorage, full: RolloutStorage) -> None:
    """Fill ``full`` (from :func:`rollout_like`) with every rank's ``local`` rollout.

    One all-gather per dtype of the ``[T, E/R, ...]`` buffers (packed along a last axis) and one
    for ``last_values`` ``[E/R]``; on return ``full`` holds the rank-order concatenation of the
    ranks' columns, on every rank.
    """
    t, e = local.num_steps, local.num_envs
    groups: dict[torch.dtype, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    for mine, whole in _pairs(local, full):
        groups.setdefault(mine.dtype, []).append((mine, whole))
    for pairs in groups.values():
        packed = torch.cat([mine.reshape(t, e, -1) for mine, _ in pairs], dim=2)
        every = ranks.all_gather_cat(packed, dim=1)  # [T, E, C]
        widths = [mine[0, 0].numel() for mine, _ in pairs]
        for (_, whole), part in zip(pairs, every.split(widths, dim=2)):
            whole.copy_(part.reshape(whole.shape))
    full.last_values.copy_(ranks.all_gather_cat(local.last_values))
    full.step = local.step
