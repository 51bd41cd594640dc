"""Adapters from Isaac Lab and IsaacGymEnvs environments to myriad's :class:`VecEnv`.

Both wrap an environment object that the user built (Isaac needs its simulation app launched
first, which only the user's script can do), following the frameworks' published interfaces:

- Isaac Lab ``ManagerBasedRLEnv`` / ``DirectRLEnv``: ``reset(seed) -> (obs_dict, extras)`` and
  ``step(actions) -> (obs_dict, reward, terminated, truncated, extras)``, observations under
  ``obs_dict["policy"]``, auto-reset inside ``step``, ``max_episode_length``, ``num_envs``,
  ``device``.
- IsaacGymEnvs ``VecTask``: ``reset() -> obs_dict`` and ``step(actions) -> (obs_dict, rew_buf,
  reset_buf, extras)``, observations under ``obs_dict["obs"]``, time-outs in
  ``extras["time_outs"]``, ``num_envs``, ``num_actions``, ``max_episode_length``, ``device``.

Entropy features are observation dimensions chosen by the caller (``feature_indices``), clipped
to the declared bounds.

Differences from the VecEnv contract that the frameworks impose (their envs do not expose them):

- Isaac Lab resets inside ``step`` and does not return the last observation of an episode:
  ``info["final_obs"]`` holds the first observation of the new episode for envs that ended
  (``info["final_obs_is_reset_obs"]`` is True), as rsl_rl and rl_games also use it.
- IsaacGymEnvs resets envs lazily at the start of the next ``step``: for envs that ended, ``obs``
  is their last observation (equal to ``final_obs``), and the action given for them at the next
  step is applied to their reset state.

These adapters are tested against objects that follow the interfaces above, not against real
Isaac Lab or Isaac Gym installations.
"""

from __future__ import annotations

import abc
import importlib
from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from myriad.envs.base import EpisodeStats, FeatureSpec, StepResult, VecEnv, validate_actions
from myriad.utils.optional import MissingDependencyError


def _import(module: str, what: str, how: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(f"{what} is not installed ({module}): {how}") from exc


class _IsaacAdapter(VecEnv):
    """Shared parts: the constructor (arguments in :class:`IsaacLabVecEnv`), spaces, features,
    the policy's observations, action validation, episode statistics. Subclasses read the sizes
    their framework declares (:meth:`_sizes`).
    """

    #: The observation group that the framework feeds to the policy.
    default_obs_key: str

    def __init__(
        self,
        env: Any,
        feature_indices: Sequence[int] = (0, 1),
        feature_low: Sequence[float] | float = -10.0,
        feature_high: Sequence[float] | float = 10.0,
        feature_names: Sequence[str] | None = None,
        obs_key: str | None = None,
        validate: bool = True,
    ):
        self.env = env
        self.obs_key = self.default_obs_key if obs_key is None else obs_key
        obs_dim, action_dim = self._sizes(env)
        self.num_envs = int(env.num_envs)
        self.device = torch.device(env.device)
        self.max_episode_steps = int(env.max_episode_length)
        self.validate = validate
        self.single_observation_space = gym.spaces.Box(
            -np.inf, np.inf, (int(obs_dim),), dtype=np.float32
        )
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (int(action_dim),), dtype=np.float32)
        idx = [int(i) for i in feature_indices]
        if not idx or max(idx) >= obs_dim or min(idx) < -obs_dim:
            raise ValueError(f"feature_indices {idx} must index the {obs_dim} observation dims")
        p = len(idx)
        low = np.broadcast_to(np.asarray(feature_low, dtype=np.float64), (p,))
        high = np.broadcast_to(np.asarray(feature_high, dtype=np.float64), (p,))
        names = tuple(feature_names) if feature_names else tuple(f"obs[{i}]" for i in idx)
        self.features = FeatureSpec(names, tuple(low.tolist()), tuple(high.tolist()), (16,) * p)
        self._feature_index = torch.tensor(idx, dtype=torch.long, device=self.device)
        self._feature_low, self._feature_high = self.features.bounds(self.device)
        self._obs = torch.zeros(self.num_envs, obs_dim, device=self.device)
        self.episode = EpisodeStats(self.num_envs, self.device)

    @abc.abstractmethod
    def _sizes(self, env: Any) -> tuple[int, int]:
        """The policy's observation size (of group :attr:`obs_key`) and the action size."""

    def _policy_obs(self, obs_dict: dict[str, torch.Tensor]) -> torch.Tensor:
        return obs_dict[self.obs_key].reshape(self.num_envs, -1).float()

    def _feats(self, obs: torch.Tensor) -> torch.Tensor:
        f = obs.index_select(1, self._feature_index)
        return torch.maximum(torch.minimum(f, self._feature_high), self._feature_low)

    def current_features(self) -> torch.Tensor:
        return self._feats(self._obs)

    def _check(self, actions: torch.Tensor) -> torch.Tensor:
        if self.validate:
            return validate_actions(actions, self.num_envs, self.action_dim, self.device)
        return actions.clamp(-1.0, 1.0)

    def _finish(
        self,
        obs: torch.Tensor,
        final_obs: torch.Tensor,
        reward: torch.Tensor,
        terminated: torch.Tensor,
        truncated: torch.Tensor,
        extras: dict[str, Any],
    ) -> StepResult:
        reward = reward.reshape(self.num_envs).float()
        terminated = terminated.reshape(self.num_envs).bool()
        truncated = truncated.reshape(self.num_envs).bool() & ~terminated
        done = terminated | truncated
        self.episode.add(reward)
        info: dict[str, Any] = {
            "final_obs": final_obs,
            "features": self._feats(final_obs),
            "done": done,
            **self.episode.finish(done),
            "extras": extras,
        }
        self._obs = obs
        return obs, reward, terminated, truncated, info


class IsaacLabVecEnv(_IsaacAdapter):
    """An Isaac Lab ``ManagerBasedRLEnv`` or ``DirectRLEnv`` as a myriad VecEnv.

    Args:
        env: the Isaac Lab env (unwrapped or behind gymnasium wrappers that keep its methods).
        feature_indices: observation dims used as entropy features (default: the first two).
        feature_low, feature_high: their bounds (scalars broadcast); features are clipped.
        feature_names: names of the features (default ``obs[i]``).
        obs_key: the observation group fed to the policy (default ``"policy"``).
        validate: check actions on every step.
    """

    default_obs_key = "policy"
    # The simulation app launched by make_isaaclab_env, held as long as the env (unset for an
    # env the user built and launched).
    app: Any

    def _sizes(self, env: Any) -> tuple[int, int]:
        space = env.single_observation_space[self.obs_key]
        return int(np.prod(space.shape)), int(np.prod(env.single_action_space.shape))

    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs_dict, _ = self.env.reset(seed=seed)
        self.episode.clear()
        self._obs = self._policy_obs(obs_dict)
        return self._obs

    def step(self, actions: torch.Tensor) -> StepResult:
        actions = self._check(actions)
        obs_dict, reward, terminated, truncated, extras = self.env.step(actions)
        obs = self._policy_obs(obs_dict)
        result = self._finish(obs, obs, reward, terminated, truncated, dict(extras))
        result[4]["final_obs_is_reset_obs"] = True
        return result

    def close(self) -> None:
        self.env.close()


class IsaacGymVecEnv(_IsaacAdapter):
    """An IsaacGymEnvs ``VecTask`` as a myriad VecEnv (see the module docstring on resets).

    Args: as :class:`IsaacLabVecEnv`; ``env`` is the task, ``obs_key`` defaults to ``"obs"``.
    """

    default_obs_key = "obs"

    def _sizes(self, env: Any) -> tuple[int, int]:
        return int(env.num_obs), int(env.num_actions)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None and hasattr(self.env, "seed"):
            self.env.seed(seed)
        self.episode.clear()
        self._obs = self._policy_obs(self.env.reset())
        return self._obs

    def step(self, actions: torch.Tensor) -> StepResult:
        actions = self._check(actions)
        obs_dict, reward, reset_buf, extras = self.env.step(actions)
        obs = self._policy_obs(obs_dict)
        done = reset_buf.reshape(self.num_envs).bool()
        time_outs = extras.get("time_outs")
        if time_outs is None:
            truncated = torch.zeros_like(done)
        else:
            truncated = time_outs.reshape(self.num_envs).bool() & done
        return self._finish(obs, obs, reward, done & ~truncated, truncated, dict(extras))


def make_isaaclab_env(
    task: str, num_envs: int, device: str = "cuda:0", headless: bool = True, **adapter: Any
) -> IsaacLabVecEnv:
    """Launch Isaac Sim, build Isaac Lab task ``task`` and wrap it.

    Raises:
        MissingDependencyError: Isaac Lab is not installed.
    """
    app = _import(
        "isaaclab.app", "Isaac Lab", "install Isaac Lab (isaaclab, isaaclab_tasks) and retry"
    )
    launcher = app.AppLauncher(headless=headless, device=device)
    _import("isaaclab_tasks", "Isaac Lab tasks", "install isaaclab_tasks and retry")
    parse = _import("isaaclab_tasks.utils", "Isaac Lab tasks", "install isaaclab_tasks")
    cfg = parse.parse_env_cfg(task, device=device, num_envs=num_envs)
    env = gym.make(task, cfg=cfg).unwrapped
    wrapped = IsaacLabVecEnv(env, **adapter)
    wrapped.app = launcher.app
    return wrapped


def make_isaacgym_env(
    task: str, num_envs: int, device: str = "cuda:0", seed: int = 0, **adapter: Any
) -> IsaacGymVecEnv:
    """Build IsaacGymEnvs task ``task`` headless with ``isaacgymenvs.make`` and wrap it.

    Raises:
        MissingDependencyError: isaacgym or isaacgymenvs is not installed.
    """
    _import("isaacgym", "Isaac Gym", "install Isaac Gym Preview 4 from NVIDIA and retry")
    ige = _import("isaacgymenvs", "IsaacGymEnvs", "install IsaacGymEnvs and retry")
    task_env = ige.make(
        seed=seed,
        task=task,
        num_envs=num_envs,
        sim_device=device,
        rl_device=device,
        graphics_device_id=-1,
        headless=True,
    )
    return IsaacGymVecEnv(task_env, **adapter)
