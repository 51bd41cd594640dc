"""Running mean and variance over batches (Chan et al. parallel update), as a torch module.

Used for observation normalisation, value normalisation and entropy-feature normalisation. The
statistics are buffers, so they travel with ``state_dict`` into checkpoints.
"""

from __future__ import annotations

import torch
from torch import nn


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
        batch_mean = x.mean(dim=0)
        batch_var = x.var(dim=0, unbiased=False)
        batch_count = x.shape[0]
        delta = batch_mean - self.mean
        total = self.count + batch_count
        new_mean = self.mean + delta * (batch_count / total)
        m2 = (
            self.var * self.count
            + batch_var * batch_count
            + delta.square() * (self.count * batch_count / total)
        )
        self.mean.copy_(new_mean)
        self.var.copy_(m2 / total)
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
