"""Closed-form quantities of the action distributions myriad's policies use.

Diagonal Gaussians (continuous actions) are described by ``(mean [..., A], log_std [..., A])``;
categoricals (discrete actions) by ``logits [..., K]``. All KL divergences are exact.
"""

from __future__ import annotations

import math

import torch

LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


def gaussian_log_prob(
    actions: torch.Tensor, mean: torch.Tensor, log_std: torch.Tensor
) -> torch.Tensor:
    """Log density of ``actions [..., A]`` under a diagonal Gaussian, summed over A -> ``[...]``."""
    z = (actions - mean) * torch.exp(-log_std)
    return (-0.5 * z.square() - log_std - LOG_SQRT_2PI).sum(dim=-1)


def gaussian_entropy(log_std: torch.Tensor) -> torch.Tensor:
    """Entropy of a diagonal Gaussian, ``log_std [..., A] -> [...]`` (nats)."""
    return (log_std + 0.5 + LOG_SQRT_2PI).sum(dim=-1)


def gaussian_kl(
    mean_p: torch.Tensor, log_std_p: torch.Tensor, mean_q: torch.Tensor, log_std_q: torch.Tensor
) -> torch.Tensor:
    """``KL(p || q)`` between diagonal Gaussians, broadcast over leading dims -> ``[...]``."""
    var_ratio = torch.exp(2.0 * (log_std_p - log_std_q))
    mahal = (mean_p - mean_q).square() * torch.exp(-2.0 * log_std_q)
    return 0.5 * (var_ratio + mahal - 1.0 - 2.0 * (log_std_p - log_std_q)).sum(dim=-1)


def gaussian_sample(
    mean: torch.Tensor, log_std: torch.Tensor, generator: torch.Generator | None = None
) -> torch.Tensor:
    """One sample per row, ``[..., A]``."""
    noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
    return mean + noise * torch.exp(log_std)


def categorical_log_prob(actions: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Log probability of integer ``actions [...]`` under ``logits [..., K]`` -> ``[...]``."""
    log_p = torch.log_softmax(logits, dim=-1)
    return log_p.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)


def categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of categoricals ``[..., K] -> [...]`` (nats)."""
    log_p = torch.log_softmax(logits, dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


def categorical_kl(logits_p: torch.Tensor, logits_q: torch.Tensor) -> torch.Tensor:
    """``KL(p || q)`` between categoricals given by logits ``[..., K]`` -> ``[...]``."""
    log_p = torch.log_softmax(logits_p, dim=-1)
    log_q = torch.log_softmax(logits_q, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(dim=-1)


def pairwise_gaussian_kl(mean: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """Mean KL between every pair of members on shared states.

    Args:
        mean: ``[M, N, A]``, member i's action mean on the N shared states.
        log_std: ``[M, N, A]`` or broadcastable (e.g. ``[M, 1, A]`` for state-independent std).

    Returns:
        ``[M, M]`` with entry ``(i, j) = mean_n KL(pi_i(.|s_n) || pi_j(.|s_n))``; zero diagonal.
    """
    log_std = log_std.expand_as(mean)
    kl = gaussian_kl(mean[:, None], log_std[:, None], mean[None, :], log_std[None, :])
    return kl.mean(dim=-1)


def pairwise_categorical_kl(logits: torch.Tensor) -> torch.Tensor:
    """Mean KL between every pair of members on shared states, ``logits [M, N, K] -> [M, M]``."""
    return categorical_kl(logits[:, None], logits[None, :]).mean(dim=-1)
