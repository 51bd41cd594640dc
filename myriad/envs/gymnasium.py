"""Adapters both ways between myriad VecEnvs and Gymnasium (>= 1.0) vector environments.

- :class:`GymnasiumVecEnv` wraps any ``gymnasium.vector.VectorEnv`` (for example ``Ant-v5``
  vectorised with ``gymnasium.make_vec``) as a myriad VecEnv: torch tensors on a device, actions
  in ``[-1, 1]`` rescaled to the env's box, ``info["final_obs"]`` as a dense tensor.
- :class:`VecEnvToGymnasium` exposes any myriad VecEnv as a ``gymnasium.vector.VectorEnv`` with
  same-step auto-reset, so existing Gymnasium training code runs on it unchanged.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space

from myriad.envs.base import EpisodeStats, FeatureSpec, StepResult, VecEnv, validate_actions
from myriad.envs.registry import register
from myriad.utils.tensors import resolve_device


class GymnasiumVecEnv(VecEnv):
    """A ``gymnasium.vector.VectorEnv`` seen as a myriad VecEnv.

    The wrapped env must use ``AutoresetMode.SAME_STEP`` (what :func:`make_gymnasium` builds), so
    the final observation of an ended episode arrives in the same step as the reset observation.

    Args:
        env: the Gymnasium vector env (continuous ``Box`` actions).
        device: torch device for all returned tensors.
        feature_indices: observation entries used as entropy features (default: all).
        feature_low, feature_high: their bounds (default: the observation space's bounds).
        max_episode_steps: the env's time limit (default: read from its spec).
    """

    def __init__(
        self,
        env: gym.vector.VectorEnv,
        device: torch.device | str = "cpu",
        feature_indices: Sequence[int] | None = None,
        feature_low: Sequence[float] | None = None,
        feature_high: Sequence[float] | None = None,
        max_episode_steps: int | None = None,
    ) -> None:
        mode = env.metadata.get("autoreset_mode")
        if mode != AutoresetMode.SAME_STEP:
            raise ValueError(
                f"GymnasiumVecEnv needs a vector env with autoreset_mode=SAME_STEP, got {mode}; "
                "build it with gymnasium.make_vec(..., vector_kwargs={'autoreset_mode': "
                "gymnasium.vector.AutoresetMode.SAME_STEP}) or use myriad.envs.gymnasium."
                "make_gymnasium"
            )
        obs_space, act_space = env.single_observation_space, env.single_action_space
        if not isinstance(obs_space, gym.spaces.Box) or len(obs_space.shape) != 1:
            raise ValueError(f"GymnasiumVecEnv needs a flat Box observation space, got {obs_space}")
        if not isinstance(act_space, gym.spaces.Box) or len(act_space.shape) != 1:
            raise ValueError(f"GymnasiumVecEnv needs a flat Box action space, got {act_space}")
        self.env = env
        self.num_envs = env.num_envs
        self.device = resolve_device(device)
        self.single_observation_space = gym.spaces.Box(
            obs_space.low.astype(np.float32), obs_space.high.astype(np.float32), dtype=np.float32
        )
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, act_space.shape, np.float32)
        self._act_low = torch.as_tensor(act_space.low, dtype=torch.float32)
        self._act_scale = torch.as_tensor(act_space.high - act_space.low, dtype=torch.float32) / 2

        idx = list(range(obs_space.shape[0])) if feature_indices is None else list(feature_indices)
        low = obs_space.low[idx] if feature_low is None else np.asarray(feature_low)
        high = obs_space.high[idx] if feature_high is None else np.asarray(feature_high)
        self._feature_idx = torch.as_tensor(idx, dtype=torch.long, device=self.device)
        self.features = FeatureSpec(
            names=tuple(f"obs[{i}]" for i in idx),
            low=tuple(float(v) for v in low),
            high=tuple(float(v) for v in high),
        )
        if max_episode_steps is None:
            spec = getattr(env, "spec", None)
            max_episode_steps = getattr(spec, "max_episode_steps", None)
        if max_episode_steps is None:
            raise ValueError("the env has no time limit in its spec: pass max_episode_steps")
        self.max_episode_steps = int(max_episode_steps)
        self._obs = torch.zeros(self.num_envs, self.obs_dim, device=self.device)
        self.episode = EpisodeStats(self.num_envs, self.device)

    def _to_torch(self, array: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(np.asarray(array), dtype=dtype).to(self.device)

    def reset(self, seed: int | None = None) -> torch.Tensor:
        obs, _ = self.env.reset(seed=seed)
        self._obs = self._to_torch(obs)
        self.episode.clear()
        return self._obs

    def current_features(self) -> torch.Tensor:
        return self._obs.index_select(1, self._feature_idx)

    def step(self, actions: torch.Tensor) -> StepResult:
        actions = validate_actions(actions, self.num_envs, self.action_dim, self.device)
        scaled = (actions.cpu() + 1.0) * self._act_scale + self._act_low
        obs, reward, terminated, truncated, env_info = self.env.step(scaled.numpy())
        obs_t = self._to_torch(obs)
        reward_t = self._to_torch(reward)
        term_t = self._to_torch(terminated, torch.bool)
        trunc_t = self._to_torch(truncated, torch.bool) & ~term_t
        done = term_t | trunc_t
        final_obs = obs_t.clone()
        if "_final_obs" in env_info:
            mask = np.asarray(env_info["_final_obs"], dtype=bool)
            if mask.any():
                rows = np.stack(
                    [np.asarray(o, dtype=np.float32) for o in env_info["final_obs"][mask]]
                )
                final_obs[torch.as_tensor(mask, device=self.device)] = self._to_torch(rows)
        self.episode.add(reward_t)
        info: dict[str, Any] = {
            "final_obs": final_obs,
            "features": final_obs.index_select(1, self._feature_idx),
            "done": done,
            **self.episode.finish(done),
        }
        self._obs = obs_t
        return obs_t, reward_t, term_t, trunc_t, info

    def close(self) -> None:
        self.env.close()


def make_gymnasium(
    num_envs: int,
    device: torch.device | str = "cpu",
    env_id: str = "Pendulum-v1",
    vectorization_mode: str = "sync",
    feature_indices: Sequence[int] | None = None,
    feature_low: Sequence[float] | None = None,
    feature_high: Sequence[float] | None = None,
    max_episode_steps: int | None = None,
    **env_kwargs: Any,
) -> GymnasiumVecEnv:
    """Build ``gymnasium.make_vec(env_id, num_envs, ...)`` with same-step auto-reset, wrapped.

    Args:
        env_id: any registered Gymnasium id with Box spaces, e.g. ``"Ant-v5"``.
        vectorization_mode: ``"sync"`` (one process) or ``"async"`` (one process per env).
        **env_kwargs: passed to the Gymnasium env constructor.
    """
    kwargs: dict[str, Any] = dict(env_kwargs)
    if max_episode_steps is not None:
        kwargs["max_episode_steps"] = max_episode_steps
    env = gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode=vectorization_mode,
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
        **kwargs,
    )
    return GymnasiumVecEnv(
        env, device, feature_indices, feature_low, feature_high, max_episode_steps
    )


class VecEnvToGymnasium(gym.vector.VectorEnv):
    """A myriad VecEnv exposed as a ``gymnasium.vector.VectorEnv`` (same-step auto-reset).

    Steps return NumPy arrays by default (``as_numpy=False`` keeps torch tensors on the env's
    device). Ended episodes report ``info["final_obs"]`` as an object array with the mask
    ``info["_final_obs"]``, the Gymnasium 1.x convention.
    """

    metadata: dict[str, Any] = {"autoreset_mode": AutoresetMode.SAME_STEP}  # noqa: RUF012

    def __init__(self, env: VecEnv, as_numpy: bool = True) -> None:
        self.venv = env
        self.as_numpy = as_numpy
        self.num_envs = env.num_envs
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self.observation_space = batch_space(env.single_observation_space, env.num_envs)
        self.action_space = batch_space(env.single_action_space, env.num_envs)
        self.metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def _out(self, value: torch.Tensor) -> Any:
        return value.cpu().numpy() if self.as_numpy else value

    def reset(
        self, *, seed: int | list[int] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        if isinstance(seed, list):
            seed = seed[0]
        return self._out(self.venv.reset(seed=seed)), {}

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        act = torch.as_tensor(actions, dtype=torch.float32, device=self.venv.device)
        obs, reward, terminated, truncated, info = self.venv.step(act)
        done = info["done"]
        out_info: dict[str, Any] = {}
        done_np = done.cpu().numpy()
        if done_np.any():
            final = np.empty(self.num_envs, dtype=object)
            final_obs = info["final_obs"].cpu().numpy()
            for i in np.flatnonzero(done_np):  # only the envs that ended, as Gymnasium does
                final[i] = final_obs[i]
            out_info["final_obs"] = final
            out_info["_final_obs"] = done_np
        return (
            self._out(obs),
            self._out(reward),
            self._out(terminated),
            self._out(truncated),
            out_info,
        )

    def close_extras(self, **kwargs: Any) -> None:
        self.venv.close()


register(
    "gymnasium",
    make_gymnasium,
    description="any Gymnasium env via gymnasium.make_vec (option env_id=..., default Pendulum-v1)",
    family="gymnasium",
    feature_indices=(0, 1),
)
