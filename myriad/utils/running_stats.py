"""Running mean and variance over batches (Chan et al. parallel update), as a torch module.

Used for observation normalisation, value normalisation and entropy-feature normalisation. The
statistics are buffers, so they travel with ``state_dict`` into checkpoints.
"""

from __future__ import annotations

import torch
from torch import nn

from myriad.utils.tensors import member_rows


class RunningMeanStd(nn.Module):
    """Mean and variance of every feature seen so far.

    Args:
        shape: feature shape, e.g. ``(obs_dim,)``; ``()`` for a scalar stream.
        epsilon: initial pseudo-count, keeps the first normalisations finite.
        clip: normalised values are clamped to ``[-clip, clip]`` (None: no clamp).
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(
        self, shape: tuple[int, ...] | int = (), epsilon: float = 1e-4, clip: float | None = 10.0
    ) -> None:
        super().__init__()
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        self.register_buffer("mean", torch.zeros(shape, dtype=torch.float64))
        self.register_buffer("var", torch.ones(shape, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(epsilon, dtype=torch.float64))
        self.clip = clip

    @torch.no_grad()
    def update(self, x: torch.Tensor) -> None:
        """Fold a batch ``[N, *shape]`` into the statistics (float64 accumulation)."""
        x = x.detach().reshape(-1, *self.mean.shape).to(torch.float64)
        if x.shape[0] == 0:
            return
        count = torch.full_like(self.count, float(x.shape[0]))
        total, mean, var = merge_moments(
            self.count, self.mean, self.var, count, x.mean(dim=0), x.var(dim=0, unbiased=False)
        )
        self.mean.copy_(mean)
        self.var.copy_(var)
        self.count.copy_(total)

    @property
    def std(self) -> torch.Tensor:
        return torch.sqrt(self.var + 1e-8)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """``(x - mean) / std`` in the dtype of ``x``, clamped to ``[-clip, clip]``."""
        y = (x - self.mean.to(x.dtype)) / self.std.to(x.dtype)
        return y if self.clip is None else y.clamp(-self.clip, self.clip)

    def scale(self, x: torch.Tensor) -> torch.Tensor:
        """``x / std`` without centring (distance-preserving up to per-feature scale)."""
        return x / self.std.to(x.dtype)

    def denormalize(self, y: torch.Tensor) -> torch.Tensor:
        return y * self.std.to(y.dtype) + self.mean.to(y.dtype)


def merge_moments(
    count_a: torch.Tensor,
    mean_a: torch.Tensor,
    var_a: torch.Tensor,
    count_b: torch.Tensor,
    mean_b: torch.Tensor,
    var_b: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Count, mean and (population) variance of two samples merged, elementwise (Chan et al.).

    Every argument has the same shape; an element where both counts are zero stays
    ``(0, mean_a, var_a)``. No branch on values, so it never synchronises with a device.
    """
    total = count_a + count_b
    safe = total.clamp_min(torch.finfo(total.dtype).tiny)
    delta = mean_b - mean_a
    mean = mean_a + delta * (count_b / safe)
    m2 = var_a * count_a + var_b * count_b + delta.square() * (count_a * count_b / safe)
    var = torch.where(total > 0, m2 / safe, var_a)
    return total, mean, var


class GroupMeanStd(nn.Module):
    """Mean and variance of a scalar stream, kept separately for each of ``G`` groups.

    The return statistics of value normalisation: with one group per member, each member's
    critic is normalised by its own returns, so members paid different rewards (CPO followers'
    adversarial reward, PBT's differently tuned members) do not rescale each other's value
    targets; with one group, every member shares the statistics.

    Args:
        groups: ``G``.
        epsilon: initial pseudo-count of every group.

    Buffers ``mean``, ``var``, ``count``: ``[G]`` float64. A state saved with one scalar
    statistic (``shape ()``) loads into every group.
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, groups: int, epsilon: float = 1e-4) -> None:
        super().__init__()
        if groups < 1:
            raise ValueError(f"groups must be >= 1, got {groups}")
        self.groups = int(groups)
        self.register_buffer("mean", torch.zeros(groups, dtype=torch.float64))
        self.register_buffer("var", torch.ones(groups, dtype=torch.float64))
        self.register_buffer("count", torch.full((groups,), epsilon, dtype=torch.float64))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        for name in ("mean", "var", "count"):
            key = prefix + name
            value = state_dict.get(key)
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                state_dict[key] = value.expand(self.groups).clone()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def group_of(self, member: torch.Tensor | int) -> torch.Tensor | int:
        """The statistics' index of each row's member (0 for every row with one group)."""
        return 0 if self.groups == 1 else member

    def batch_moments(
        self, x: torch.Tensor, member: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-group count, mean and variance of ``x [N]`` whose rows belong to ``member [N]``,
        each ``[G]`` float64 (mean 0, variance 1 where a group has no row)."""
        x = x.detach().reshape(-1).to(torch.float64)
        group = member.reshape(-1).to(x.device) if self.groups > 1 else torch.zeros_like(x).long()
        zeros = torch.zeros(self.groups, dtype=torch.float64, device=x.device)
        count = zeros.index_add(0, group, torch.ones_like(x))
        safe = count.clamp_min(1.0)
        mean = zeros.index_add(0, group, x) / safe
        var = zeros.index_add(0, group, (x - member_rows(mean, group)).square()) / safe
        return count, mean, torch.where(count > 0, var, torch.ones_like(var))

    @torch.no_grad()
    def fold(self, count: torch.Tensor, mean: torch.Tensor, var: torch.Tensor) -> None:
        """Fold a batch's per-group moments ``[G]`` into the running statistics."""
        total, new_mean, new_var = merge_moments(
            self.count, self.mean, self.var, *(t.to(self.mean) for t in (count, mean, var))
        )
        self.mean.copy_(new_mean)
        self.var.copy_(new_var)
        self.count.copy_(total)

    @torch.no_grad()
    def update(self, x: torch.Tensor, member: torch.Tensor) -> None:
        """Fold ``x [N]`` into the statistics of its rows' members ``member [N]``."""
        self.fold(*self.batch_moments(x, member))

    @property
    def std(self) -> torch.Tensor:
        """``[G]``."""
        return torch.sqrt(self.var + 1e-8)

    def row_stats(
        self, member: torch.Tensor | int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean and std for rows of ``member`` (``[N]`` or one member), broadcastable to ``[N]``."""
        group = self.group_of(member)
        return member_rows(self.mean.to(dtype), group), member_rows(self.std.to(dtype), group)

    def normalize(self, x: torch.Tensor, member: torch.Tensor | int) -> torch.Tensor:
        """``(x - mean) / std`` of each row's member, ``[N]``."""
        mean, std = self.row_stats(member, x.dtype)
        return (x - mean) / std

    def denormalize(self, y: torch.Tensor, member: torch.Tensor | int) -> torch.Tensor:
        """``y * std + mean`` of each row's member, ``[N]``."""
        mean, std = self.row_stats(member, y.dtype)
        return y * std + mean

    @torch.no_grad()
    def copy_groups(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copy the statistics of groups ``src`` into groups ``dst`` (no-op with one group)."""
        if self.groups > 1:
            for buf in (self.mean, self.var, self.count):
                buf[dst] = buf[src].clone()
