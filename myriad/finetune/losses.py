"""Loss pieces of the finetuning algorithms as pure functions (docs/algorithms.md §6-8).

Shapes: ``N`` samples, ``M`` members, ``F`` followers. Everything here is differentiable where
its inputs are and free of host syncs, so the algorithms can call it on every minibatch.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def one_step_td(
    rewards: torch.Tensor,
    values: torch.Tensor,
    next_values: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One-step TD advantage and target of a critic on transitions ``(s, a, r, s')``.

    ``target = r + gamma * (1 - terminated) * V(s')`` and ``advantage = target - V(s)``, all
    ``[...]``. ``s'`` must be the observation the step reached *before* any reset (the env's
    ``final_obs``), so a truncated step is bootstrapped from its true last state while a
    terminated one is not bootstrapped at all.

    Returns:
        ``(advantage, target)``, both shaped like ``rewards``.
    """
    target = rewards + gamma * (1.0 - terminated.to(values.dtype)) * next_values
    return target - values, target


def dual_clipped_surrogate(
    log_prob: torch.Tensor,
    old_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip: float,
    dual_clip: float | None = 3.0,
) -> torch.Tensor:
    """Per-sample PPO policy loss with the dual clip of Ye et al. (2020), ``[N]``.

    ``-min(r A, clip(r, 1 - c, 1 + c) A)``, and for ``A < 0`` at most ``dual_clip * |A|``.
    PPO's clip leaves the ratio unbounded above when the advantage is negative; on off-policy
    data (the leader on its followers' actions) ratios far above 1 are common, and the bound
    keeps any one sample's loss and gradient finite. ``dual_clip=None`` is plain PPO.
    """
    ratio = torch.exp(log_prob - old_log_prob)
    loss = -torch.minimum(ratio * advantages, ratio.clamp(1.0 - clip, 1.0 + clip) * advantages)
    return bound_negative_advantages(loss, advantages, dual_clip)


def bound_negative_advantages(
    loss: torch.Tensor,
    advantages: torch.Tensor,
    dual_clip: float | None,
    weight: torch.Tensor | None = None,
) -> torch.Tensor:
    """The dual clip of Ye et al. (2020): a negative-advantage row's loss ``[N]`` bounded at
    ``dual_clip * |A|`` (times the row's ``weight [N]`` when the loss is weighted); ``loss``
    unchanged with ``dual_clip=None``."""
    if dual_clip is None:
        return loss
    if dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
    bound = -dual_clip * advantages if weight is None else -dual_clip * weight * advantages
    return torch.where(advantages < 0, torch.minimum(loss, bound), loss)


def leader_trust_region_surrogate(
    log_prob: torch.Tensor,
    anchor_log_prob: torch.Tensor,
    behaviour_log_prob: torch.Tensor,
    advantages: torch.Tensor,
    clip: float,
    dual_clip: float | None = None,
    truncation: float = 1.0,
) -> torch.Tensor:
    """Per-sample off-policy PPO loss with the trust region around the learner's own policy,
    ``[N]`` (docs/algorithms.md §6, ``off_policy_trust_region="leader"``).

    ``min(pi_old / mu, c) * dual_clipped_surrogate(log pi, log pi_old, A)``: the ratio that
    the clip bounds is ``pi / pi_old`` (``anchor_log_prob``: the learner's log-probabilities as
    the update began, no gradient), and each row stands for the learner's own through the
    importance weight ``pi_old / mu`` (``behaviour_log_prob``: the policy that acted),
    truncated at ``truncation`` (the trust region of GePPO, Queeney et al. 2021, arXiv
    2111.00072, in multiplicative form; the truncation of V-trace, Espeholt et al. 2018).
    Within the trust region every row passes the gradient of both signs of its advantage, so
    zero-mean advantages that say nothing about the action move the policy nowhere on average,
    where the ratio ``pi / mu`` of
    :func:`dual_clipped_surrogate` pulls it towards ``mu``.
    """
    # In logarithms: on a row the learner would almost never take, the weight underflows to 0
    # while its step ratio overflows, and 0 * inf is NaN; their product pi / mu does not.
    log_weight = (anchor_log_prob - behaviour_log_prob).clamp(max=math.log(truncation))
    log_step = log_prob - anchor_log_prob
    unclipped = torch.exp(log_weight + log_step) * advantages
    # The clipped ratio from clamped logarithms: a clamp of an overflowed exp passes 0 * inf.
    bounded = log_step.clamp(math.log(1.0 - clip), math.log(1.0 + clip)).exp()
    weight = log_weight.exp()
    loss = -torch.minimum(unclipped, weight * bounded * advantages)
    return bound_negative_advantages(loss, advantages, dual_clip, weight)


def masked_mean(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """``mean(x)`` or the ``weight``-weighted mean ``sum(w x) / sum(w)`` (0 when ``sum(w)`` is 0).

    Masks stand in for boolean indexing, which would read the selected count from the device.
    """
    if weight is None:
        return x.mean()
    return (x * weight).sum() / weight.sum().clamp(min=1e-12)


def normalize(
    x: torch.Tensor, weight: torch.Tensor | None = None, eps: float = 1e-8
) -> torch.Tensor:
    """``x`` shifted and scaled to mean 0 and (population) std 1 over the rows where ``weight``
    is 1, ``[N]``; rows outside the mask are transformed alike but do not enter the moments."""
    mean = masked_mean(x, weight)
    var = masked_mean((x - mean).square(), weight)
    return (x - mean) / (var.sqrt() + eps)


def effective_sample_size(
    log_weights: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Normalised effective sample size ``(sum w)^2 / (n * sum w^2)`` of importance weights.

    Args:
        log_weights: ``[N]``, ``log w`` (for SAPG's leader: ``log pi_L(a|s) - log pi_f(a|s)``).
        mask: ``[N]`` 0/1, the samples that count (default: all); ``n`` is their number.

    Returns:
        A scalar in ``(0, 1]``: 1 when all weights are equal, ``1 / n`` when one weight dominates.
        Computed from shifted log-weights, so large ratios do not overflow.
    """
    if mask is None:
        mask = torch.ones_like(log_weights)
    mask = mask.to(log_weights.dtype)
    shifted = torch.where(mask > 0, log_weights, torch.full_like(log_weights, -math.inf))
    w = torch.exp(shifted - shifted.max()) * mask
    n = mask.sum().clamp(min=1.0)
    return w.sum().square() / (n * w.square().sum()).clamp(min=1e-30)


def kl_penalized_advantages(
    advantages: torch.Tensor,
    log_prob_follower: torch.Tensor,
    log_prob_leader: torch.Tensor,
    coef: float | torch.Tensor,
    is_follower: torch.Tensor,
) -> torch.Tensor:
    """CPO's KL penalty toward the leader: ``A_f - lambda * (log pi_f(a|s) - log pi_L(a|s))``.

    The difference is a one-sample estimate of ``KL(pi_f || pi_L)`` at ``s`` (``a ~ pi_f``).

    Args:
        advantages: ``[N]``.
        log_prob_follower, log_prob_leader: ``[N]``, the behaviour policy's and the leader's
            log-density of the action taken.
        coef: lambda, one for all rows or ``[N]`` (each row's member's).
        is_follower: ``[N]`` bool; leader rows are returned unchanged.
    """
    penalty = coef * (log_prob_follower - log_prob_leader)
    return advantages - penalty * is_follower.to(advantages.dtype)


def awac_weights(
    advantages: torch.Tensor, temperature: float, max_weight: float = 100.0
) -> torch.Tensor:
    """Advantage weights ``min(exp(A / temperature), max_weight)``, shaped like ``advantages``.

    The exponent is clamped at ``log(max_weight)`` before ``exp``, which gives the same value
    without overflowing for large advantages.
    """
    if temperature <= 0:
        raise ValueError(f"the AWAC temperature must be > 0, got {temperature}")
    return torch.exp((advantages / temperature).clamp(max=math.log(max_weight)))


def awac_loss(
    log_prob: torch.Tensor, weights: torch.Tensor, coef: float, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``- coef * mean(w * log pi_f(a_L | s_L))`` over followers and leader samples (scalar).

    Args:
        log_prob: ``[F, N]``, each follower's log-density of the leader's actions.
        weights: ``[F, N]`` from :func:`awac_weights` (treated as constants).
        coef: beta.
        mask: ``[N]`` 0/1 leader rows (default: every row is a leader sample).
    """
    per_row = (weights.detach() * log_prob).mean(dim=0)
    return -coef * masked_mean(per_row, mask)


def discriminator_bonus(
    log_q: torch.Tensor,
    member: torch.Tensor,
    coef: float,
    leader: int = 0,
    floor: float = -10.0,
) -> torch.Tensor:
    """CPO's adversarial diversity reward ``c_adv * log q(i|s,a)``, 0 for the leader.

    The bonus is never positive: a follower pays for every step on which the discriminator
    cannot tell it from the others, and pays nothing once it is recognisable. (A bonus centred
    on the uniform prior, ``log q + log M``, would be positive for recognisable followers and
    would pay them to postpone reaching a goal that ends the episode.) ``log q`` is floored at
    ``floor`` so that a confidently misclassified step cannot dominate the task reward.

    Args:
        log_q: ``[...]``, ``log q(member | s, a)`` of each sample's own member.
        member: ``[...]`` long, who acted.
        coef: c_adv.
        leader: the member that gets no bonus.
        floor: lower clamp of ``log q``.
    """
    bonus = coef * log_q.clamp(min=floor)
    return torch.where(member == leader, torch.zeros_like(bonus), bonus)


def sapg_entropy_coefficients(num_members: int, scale: float) -> torch.Tensor:
    """SAPG's per-member entropy coefficients, ``[M]``, for the leader at member 0.

    The values ``linspace(0.5, 0, M) * scale`` go to the members in reverse, so the leader gets
    the 0 and follower ``i`` gets ``0.5 * scale * i / (M - 1)``: the further down the list a
    follower, the more it explores.
    """
    return torch.linspace(0.5, 0.0, num_members).flip(0) * scale


def pooled_moments(
    groups: list[tuple[torch.Tensor, float]],
    eps: float = 1e-8,
    all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and standard deviation of a batch made of several groups of rows, each group known
    from a sample of its values and counted with its own number of rows.

    SAPG's and CPO's authors normalise every advantage of an update with one mean and std over
    the whole augmented batch (on-policy rows, the leader's off-policy rows, the followers'
    AWAC rows; docs/algorithms.md §6-7). The groups' rows are not all materialised here (the
    off-policy rows are a sample of the follower rows), so each group enters with its sample's
    moments weighted by its row count in that batch.

    Args:
        groups: ``(values [n_g], count_g)``: a sample of the group's values and the number of
            rows it has in the batch (> 0).
        eps: floor of the returned std.
        all_reduce: sums a tensor over processes in place (torchrun ranks that split an
            update): each process gives its own part of every group's sample and row count,
            and the moments are those of the union (one all-reduce of ``[G, 4]``).

    Returns:
        ``(mean, std)`` scalars; ``std`` uses the divisor ``C - 1`` for ``C`` rows in all, as
        ``torch.std`` does on the whole batch.
    """
    counts = torch.tensor([float(c) for _, c in groups], dtype=torch.float64)
    if all_reduce is None:
        means = torch.stack([v.detach().double().mean() for v, _ in groups])
        variances = torch.stack([v.detach().double().var(unbiased=False) for v, _ in groups])
        counts = counts.to(means.device)
    else:
        sums = torch.stack(
            [
                torch.stack([v.new_tensor(float(v.numel())), v.sum(), v.square().sum()])
                for v in (v.detach().double() for v, _ in groups)
            ]
        )
        sums = all_reduce(torch.cat([sums, counts.to(sums.device).unsqueeze(1)], dim=1))
        n, total, square, counts = sums.unbind(dim=1)
        means = total / n
        variances = (square / n - means.square()).clamp(min=0.0)
    total = counts.sum()
    mean = (counts * means).sum() / total
    second = (counts * (variances + (means - mean).square())).sum() / total
    std = (second * total / (total - 1).clamp(min=1.0)).sqrt().clamp(min=eps)
    dtype = groups[0][0].dtype
    return mean.to(dtype), std.to(dtype)
