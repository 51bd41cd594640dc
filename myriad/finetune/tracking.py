"""Per-member task statistics (return, success) of finished episodes, kept on the device."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from myriad.envs.base import StepResult, VecEnv
from myriad.rl.collector import env_state_dict, load_env_state_dict


class TaskStatsEnv(VecEnv):
    """A VecEnv that forwards to ``env`` and sums, per member, the return, the success flag
    (``info["success"]``, when the env reports one) and the count of finished episodes.

    The sums are updated with one ``index_add_`` per step (no host sync) and read once per
    iteration by :meth:`read`. Everything else (spaces, features, attributes such as a nav env's
    ``layout``) is the wrapped env's.

    Args:
        env: the environments.
        member: ``[E]`` long, the member acting in each env.
        num_members: M.
    """

    def __init__(self, env: VecEnv, member: torch.Tensor, num_members: int) -> None:
        self.env = env
        self.num_envs = env.num_envs
        self.device = env.device
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.features = env.features
        self.max_episode_steps = env.max_episode_steps
        self.name = env.name
        self.member = member.to(env.device, torch.long)
        self.num_members = num_members
        self.sums = torch.zeros(3, num_members, dtype=torch.float64, device=env.device)
        self.has_success = False

    def __getattr__(self, name: str) -> Any:
        # Only called for attributes not found on the wrapper: forward to the wrapped env.
        if name == "env":
            raise AttributeError(name)
        return getattr(self.env, name)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        return self.env.reset(seed)

    def step(self, actions: torch.Tensor) -> StepResult:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        done = info.get("done")
        if done is None:
            done = terminated | truncated
        success = info.get("success")
        self.has_success = self.has_success or success is not None
        mask = done.to(torch.float64)
        rows = torch.stack(
            [
                info["episode_return"].to(torch.float64) * mask,
                (success & done).to(torch.float64) if success is not None else mask * 0.0,
                mask,
            ]
        )
        self.sums.index_add_(1, self.member, rows)
        return obs, reward, terminated, truncated, info

    def current_features(self) -> torch.Tensor:
        return self.env.current_features()

    def close(self) -> None:
        self.env.close()

    def read(self, reset: bool = True) -> dict[str, np.ndarray]:
        """Per-member sums since the last read: ``return``, ``success`` and ``count``, ``[M]``
        each (one device read)."""
        ret, success, count = self.sums.cpu().numpy().copy()
        if reset:
            self.sums.zero_()
        return {"return": ret, "success": success, "count": count}

    def state_dict(self) -> dict[str, Any]:
        return {
            "env": env_state_dict(self.env),
            "sums": self.sums.detach().cpu().clone(),
            "has_success": self.has_success,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        load_env_state_dict(self.env, state["env"])
        self.sums.copy_(state["sums"])
        self.has_success = bool(state["has_success"])


def member_scalars(
    stats: dict[str, np.ndarray], leader: int, has_success: bool, per_member: bool = True
) -> dict[str, float]:
    """Scalars of one :meth:`TaskStatsEnv.read`: success rates overall, of the leader and (with
    ``per_member``) of each member with finished episodes. Returns per member are logged by the
    collector's episode tracker already."""
    if not has_success:
        return {}
    count, success = stats["count"], stats["success"]
    out: dict[str, float] = {}
    if count.sum() > 0:
        out["episode/success"] = float(success.sum() / count.sum())
    if count[leader] > 0:
        out["episode/success/leader"] = float(success[leader] / count[leader])
    if per_member and len(count) > 1:
        for i in np.flatnonzero(count > 0):
            out[f"episode/success/member_{i}"] = float(success[i] / count[i])
    return out
