"""Generalised advantage estimation with bootstrapping on truncation (docs/algorithms.md §5)."""

from __future__ import annotations

import torch


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    dones: torch.Tensor,
    last_values: torch.Tensor,
    gamma: float,
    lam: float,
    truncation_values: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(gamma, lambda) advantages and returns of a ``[T, E]`` rollout.

    Step t of env e has ``values[t]`` = V(s_t) and reward ``rewards[t]``; ``dones[t]`` says the
    episode ended at that step (terminated or truncated), in which case ``values[t + 1]`` belongs
    to the next episode and is not bootstrapped from. A truncated episode did not end in the
    environment's terminal state, so its value is bootstrapped from the last observation:
    ``truncation_values[t]`` = V(final_obs_t) where truncated, 0 elsewhere (terminated steps
    included). The effective reward is ``rewards[t] + gamma * truncation_values[t]``:

        delta_t = r_t + gamma * V_trunc_t + gamma * (1 - done_t) * V(s_{t+1}) - V(s_t)
        A_t     = delta_t + gamma * lam * (1 - done_t) * A_{t+1}

    with ``V(s_T) = last_values``.

    Args:
        rewards, values: ``[T, E]``.
        dones: ``[T, E]`` bool (or 0/1).
        last_values: ``[E]``, values of the observations after the last step.
        gamma, lam: discount and GAE lambda.
        truncation_values: ``[T, E]`` or None (no truncation bootstrap).

    Returns:
        ``(advantages [T, E], returns [T, E])`` with ``returns = advantages + values``.
    """
    num_steps = rewards.shape[0]
    not_done = 1.0 - dones.to(values.dtype)
    rewards = rewards if truncation_values is None else rewards + gamma * truncation_values
    advantages = torch.empty_like(values)
    next_adv = torch.zeros_like(last_values)
    next_value = last_values
    for t in reversed(range(num_steps)):
        delta = rewards[t] + gamma * not_done[t] * next_value - values[t]
        next_adv = delta + gamma * lam * not_done[t] * next_adv
        advantages[t] = next_adv
        next_value = values[t]
    return advantages, advantages + values
