"""Evaluating members of a population on a task: one full episode per env, fresh envs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from myriad.envs.base import VecEnv
from myriad.nn.population import PopulationActorCritic, is_blocked
from myriad.utils.seeding import make_generator

# A host read of "has every env finished?" every this many steps lets evaluation stop early
# without a sync on every step.
_CHECK_EVERY = 16


class MemberScores(NamedTuple):
    """Per evaluated member, over its episodes: ``success`` rate and mean ``returns`` (``[K]``
    float tensors on the CPU; ``success`` is 0 for envs that report no success flag)."""

    success: torch.Tensor
    returns: torch.Tensor


@torch.no_grad()
def evaluate_members(
    model: PopulationActorCritic,
    make_env: Callable[[int], VecEnv],
    members: Sequence[int],
    episodes: int,
    *,
    deterministic: bool,
    seed: int,
) -> MemberScores:
    """Run ``episodes`` episodes of each of ``members`` and score them.

    Member ``members[k]`` acts in envs ``k * episodes .. (k + 1) * episodes - 1`` of one batched
    env built by ``make_env(num_envs)``; each env's first episode counts. The env's reset and
    the action sampling are seeded with ``seed``, so the scores are reproducible and consume
    no global randomness.

    Args:
        model: the population.
        make_env: builds the task env with the given number of envs.
        members: the members to evaluate (repeats allowed).
        episodes: episodes per member.
        deterministic: act with the policy means instead of sampling.
        seed: env reset and action-sampling seed.
    """
    k = len(members)
    env = make_env(k * episodes)
    try:
        device = env.device
        member = torch.as_tensor(list(members), dtype=torch.long, device=device)
        member = member.repeat_interleave(episodes)
        blocked = is_blocked(member, model.num_members)
        generator = make_generator(seed, device)
        obs = env.reset(seed)
        n = env.num_envs
        finished = torch.zeros(n, dtype=torch.bool, device=device)
        returns = torch.zeros(n, device=device)
        success = torch.zeros(n, dtype=torch.bool, device=device)
        for step in range(env.max_episode_steps):
            actions = model.act(
                obs, member, generator, deterministic=deterministic, blocked=blocked
            ).actions
            obs, _, terminated, truncated, info = env.step(actions)
            done = info.get("done")
            if done is None:
                done = terminated | truncated
            first = done & ~finished
            returns = torch.where(first, info["episode_return"].to(returns.dtype), returns)
            if "success" in info:
                success |= first & info["success"]
            finished |= done
            if (step + 1) % _CHECK_EVERY == 0 and bool(finished.all()):
                break
    finally:
        env.close()
    return MemberScores(
        success.float().view(k, episodes).mean(dim=1).cpu(),
        returns.view(k, episodes).mean(dim=1).cpu(),
    )
