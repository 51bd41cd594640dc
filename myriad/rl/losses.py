"""PPO loss pieces as pure functions (docs/algorithms.md §5).

Shapes: ``B`` samples in a minibatch, ``M`` members. Per-sample losses are returned unreduced
where an algorithm may want to weight or mask samples before averaging.
"""

from __future__ import annotations

import torch

from myriad.nn.distributions import gaussian_kl
from myriad.utils.tensors import member_rows


def clipped_surrogate(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip: float | torch.Tensor,
) -> torch.Tensor:
    """Per-sample PPO policy loss ``-min(r * A, clip(r, 1 - c, 1 + c) * A)``, ``[B]``.

    ``r = exp(log_prob - old_log_prob)``; minimise the mean. ``clip`` is one number or one per
    row, ``[B]`` (PBT gives each member its own).
    """
    ratio = torch.exp(log_prob - old_log_prob)
    unclipped = ratio * advantages
    # torch's stubs type clamp's bounds as two tensors or two numbers, not either.
    clipped = ratio.clamp(1.0 - clip, 1.0 + clip) * advantages  # type: ignore[arg-type]
    return -torch.minimum(unclipped, clipped)


def clip_fraction(
    log_prob: torch.Tensor, old_log_prob: torch.Tensor, clip: float | torch.Tensor
) -> torch.Tensor:
    """Fraction of samples whose ratio lies outside ``[1 - clip, 1 + clip]`` (scalar)."""
    ratio = torch.exp(log_prob - old_log_prob)
    return ((ratio - 1.0).abs() > clip).float().mean()


def clipped_value_loss(
    values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip: float | None
) -> torch.Tensor:
    """Per-sample value loss, ``[B]``.

    ``max((v - R)^2, (v_old + clip(v - v_old, -c, c) - R)^2)``; plain ``(v - R)^2`` when ``clip``
    is None. All three inputs are in the critic's output scale (normalised when value
    normalisation is on); ``v_old`` is the critic's output when the rollout was collected, so the
    clip bounds how far an update moves it (:meth:`myriad.rl.PPO.value_loss`).
    """
    loss = (values - returns).square()
    if clip is None:
        return loss
    clipped = old_values + (values - old_values).clamp(-clip, clip)
    return torch.maximum(loss, (clipped - returns).square())


def entropy_bonus(
    entropy: torch.Tensor, member: torch.Tensor | None, coef: float | torch.Tensor
) -> torch.Tensor:
    """Mean of ``coef[member] * entropy`` over the batch (scalar; subtract it from the loss).

    Args:
        entropy: ``[B]``.
        member: ``[B]`` long, needed when ``coef`` is per member.
        coef: a float, or ``[M]`` per-member coefficients (SAPG gives followers larger ones).
    """
    if isinstance(coef, torch.Tensor) and coef.ndim == 1:
        if member is None:
            raise ValueError("per-member entropy coefficients need the member of each sample")
        return (member_rows(coef, member) * entropy).mean()
    return coef * entropy.mean()


def approx_kl(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    """Sample estimate of ``KL(old || new)``: ``mean((r - 1) - log r)``, non-negative (scalar)."""
    log_ratio = log_prob - old_log_prob
    return (torch.exp(log_ratio) - 1.0 - log_ratio).mean()


def exact_gaussian_kl(
    old_mean: torch.Tensor,
    old_log_std: torch.Tensor,
    mean: torch.Tensor,
    log_std: torch.Tensor,
) -> torch.Tensor:
    """Batch mean of the exact ``KL(old || new)`` between diagonal Gaussians ``[B, A]`` (scalar)."""
    return gaussian_kl(old_mean, old_log_std, mean, log_std).mean()


def adaptive_lr(
    lr: float,
    kl: float,
    desired_kl: float,
    factor: float = 1.5,
    min_lr: float = 1e-5,
    max_lr: float = 1e-2,
) -> float:
    """The KL-adaptive learning-rate rule.

    Divide by ``factor`` when ``kl > 2 * desired_kl``, multiply by it when
    ``kl < desired_kl / 2``, keep it otherwise (and when ``kl`` is NaN); the result is clamped
    to ``[min_lr, max_lr]``.
    """
    if kl > 2.0 * desired_kl:
        lr = lr / factor
    elif kl < 0.5 * desired_kl:
        lr = lr * factor
    return min(max_lr, max(min_lr, lr))


def normalize_advantages(
    advantages: torch.Tensor,
    member: torch.Tensor | None = None,
    num_members: int = 1,
    blocked: bool = False,
    eps: float = 1e-8,
) -> torch.Tensor:
    """Advantages shifted and scaled to mean 0, std 1 within each member's samples, ``[B]``.

    Members are normalised separately so that a member with large returns does not drown the
    others' gradients. ``member=None`` normalises over the whole batch. With ``blocked=True``
    the batch is member-major with equal counts (reshaped, no scatter); otherwise per-member
    moments are accumulated with ``index_add`` (any assignment, no host sync). The standard
    deviation is the population one (divisor n).
    """
    if member is None or num_members == 1:
        return (advantages - advantages.mean()) / (advantages.std(unbiased=False) + eps)
    if blocked:
        a = advantages.view(num_members, -1)
        mean = a.mean(dim=1, keepdim=True)
        std = a.std(dim=1, unbiased=False, keepdim=True)
        return ((a - mean) / (std + eps)).reshape(-1)
    zeros = advantages.new_zeros(num_members)
    count = zeros.index_add(0, member, torch.ones_like(advantages)).clamp(min=1.0)
    mean = zeros.index_add(0, member, advantages) / count
    centred = advantages - member_rows(mean, member)
    var = zeros.index_add(0, member, centred.square()) / count
    return centred / (member_rows(var.sqrt(), member) + eps)


def explained_variance(values: torch.Tensor, returns: torch.Tensor) -> torch.Tensor:
    """``1 - Var(returns - values) / Var(returns)`` (scalar; NaN when returns are constant)."""
    var = returns.var(unbiased=False)
    return 1.0 - (returns - values).var(unbiased=False) / var
