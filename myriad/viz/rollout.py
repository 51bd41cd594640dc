"""Recording episodes of chosen members, all in one env batch.

Member ``members[j]`` acts in envs ``j * episodes .. (j + 1) * episodes - 1`` (member-major, as
in :func:`myriad.assess.evaluation.rollout_members`); every policy step is one batched call of
the population for all envs. Each env's first episode is recorded: the painter's state snapshot
after every step and the entropy features of every state reached, into tensors preallocated on
the env's device, copied to the host once at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from myriad.envs.base import VecEnv
from myriad.nn.population import PopulationActorCritic, member_blocks
from myriad.utils.seeding import make_generator

# A host read of "has every env finished?" every this many steps stops the rollout early without
# a sync per step.
_CHECK_EVERY = 16


@dataclass
class Recording:
    """The first episode of each env.

    Shapes: ``E = len(members) * episodes`` envs, ``F`` frames, ``d`` state size, ``p`` features.

    Attributes:
        members: the recorded members, in env-block order.
        episodes: episodes per member.
        member: ``[E]`` the member acting in each env.
        states: ``[F, E, d]`` painter states, ``states[t]`` after ``t`` steps.
        frames: ``[E]`` valid frames per env: the initial state plus every state reached before
            the episode ended (the state an episode ends in is replaced by the next episode's
            start in auto-resetting envs, so it is not shown).
        features: ``[F - 1, E, p]`` entropy features of the state reached by each step.
        steps: ``[E]`` steps of each episode; ``features[:steps[e], e]`` are its states.
        returns: ``[E]`` the episode's return (up to the last recorded step if unfinished).
    """

    members: list[int]
    episodes: int
    member: np.ndarray
    states: np.ndarray
    frames: np.ndarray
    features: np.ndarray
    steps: np.ndarray
    returns: np.ndarray

    def episode_envs(self, k: int) -> np.ndarray:
        """The envs of episode ``k`` of every member, ``[len(members)]``."""
        return np.arange(len(self.members)) * self.episodes + k

    def member_features(self) -> tuple[np.ndarray, np.ndarray]:
        """Features of every recorded state ``[N, p]`` and the member of each ``[N]``."""
        steps = self.features.shape[0]
        valid = np.arange(steps)[:, None] < self.steps[None, :]  # [F - 1, E]
        member = np.broadcast_to(self.member[None, :], valid.shape)
        return self.features[valid], member[valid]


@torch.no_grad()
def record_episodes(
    model: PopulationActorCritic,
    env: VecEnv,
    members: Sequence[int],
    episodes: int,
    capture: Callable[[VecEnv], torch.Tensor],
    *,
    deterministic: bool = False,
    seed: int = 0,
    max_steps: int | None = None,
) -> Recording:
    """Run the first episode of every env of ``env`` (``len(members) * episodes`` envs).

    Args:
        model: the population (on ``env.device``).
        env: a fresh env with ``len(members) * episodes`` envs.
        members: the members to record (repeats allowed).
        episodes: episodes per member.
        capture: ``env -> [E, d]`` state snapshot (a painter's :meth:`capture`).
        deterministic: act with the policy means instead of sampling.
        seed: env reset and action-sampling seed.
        max_steps: stop episodes after this many steps (default: the env's time limit).
    """
    k = len(members)
    if env.num_envs != k * episodes:
        raise ValueError(
            f"the env needs {k * episodes} envs ({k} members x {episodes}), got {env.num_envs}"
        )
    device = env.device
    member = torch.as_tensor(list(members), dtype=torch.long, device=device)
    member = member.repeat_interleave(episodes)
    blocked = member_blocks(member, model.num_members)
    generator = make_generator(seed, device)
    horizon = env.max_episode_steps if max_steps is None else min(max_steps, env.max_episode_steps)
    n = env.num_envs
    obs = env.reset(seed)
    first = capture(env)
    states = torch.empty((horizon + 1, *first.shape), dtype=first.dtype, device=first.device)
    states[0] = first
    features = torch.zeros(horizon, n, env.features.dim, device=device)
    steps = torch.full((n,), horizon, dtype=torch.long, device=device)
    returns = torch.zeros(n, device=device)
    running = torch.zeros(n, device=device)
    finished = torch.zeros(n, dtype=torch.bool, device=device)
    used = horizon
    for t in range(horizon):
        actions = model.act(obs, member, generator, deterministic=deterministic, blocked=blocked)
        obs, reward, terminated, truncated, info = env.step(actions.actions)
        done = info.get("done")
        if done is None:
            done = terminated | truncated
        features[t] = info["features"]
        running = torch.where(finished, running, running + reward.to(running.dtype))
        ended = done & ~finished
        steps = torch.where(ended, t + 1, steps)
        returns = torch.where(ended, running, returns)
        finished |= done
        states[t + 1] = capture(env)
        if (t + 1) % _CHECK_EVERY == 0 and bool(finished.all()):
            used = t + 1
            break
    returns = torch.where(finished, returns, running)
    # Frames: the start plus each state reached before the episode's last step.
    frames = torch.where(finished, steps, steps + 1)
    return Recording(
        members=[int(m) for m in members],
        episodes=int(episodes),
        member=member.cpu().numpy(),
        states=states[: used + 1].cpu().numpy(),
        frames=frames.clamp(max=used + 1).cpu().numpy(),
        features=features[:used].cpu().numpy(),
        steps=steps.clamp(max=used).cpu().numpy(),
        returns=returns.cpu().numpy(),
    )
