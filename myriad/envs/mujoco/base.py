"""Base class of MuJoCo tasks: the task is batched torch code, the backend only steps physics.

A task subclass implements, all as batched tensor code over the backend's fields:

- ``_sample_reset() -> (qpos [E, nq], qvel [E, nv])``: the reset distribution (rows of envs that
  are not reset are ignored), drawn from ``self.generator``.
- ``_task_step(actions [E, A], ctrl [E, nu]) -> (reward [E], terminated [E])`` after physics.
- ``_task_obs() -> [E, O]`` and ``_task_features() -> [E, p]`` of the current state.
- optionally ``_on_reset(mask [E])`` to reset task state (previous positions, targets).

Unstable simulation: after every step, envs whose ``qpos``/``qvel`` are not finite, or that
the engine reset by itself (CPU MuJoCo resets diverging data and counts a warning), are
marked in ``info["unstable"]``, terminated with zero reward and reset; their ``final_obs`` and
``features`` are those of the last finite state, so NaN never reaches the policy.
``info["unstable_total"]`` counts such events since the env was built.
"""

from __future__ import annotations

import abc
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
import torch

from myriad.envs.base import FeatureSpec, TensorVecEnv
from myriad.envs.mujoco.backends import BACKENDS, PhysicsBackend, make_backend


class MujocoVecEnv(TensorVecEnv):
    """A batch of MuJoCo simulations of one model with a task written once in torch.

    Args:
        num_envs: ``E``.
        device: torch device of every tensor.
        model: the compiled ``MjModel``.
        frame_skip: physics steps per env step; ``dt = frame_skip * model.opt.timestep``.
        obs_dim: observation size ``O``.
        fields: the simulator fields the task reads (see :mod:`.backends`).
        backend: ``"mujoco"`` (CPU workers) or ``"warp"`` (MuJoCo Warp).
        num_workers: CPU backend worker processes (default: one per core from 64 envs).
        nconmax, njmax: Warp contact and constraint capacity per world.
        validate: check actions on every step (see :class:`TensorVecEnv`).
        max_episode_steps: the time limit.
        features: the entropy features :meth:`_task_features` returns, and their bounds.
    """

    # The physics state lives in the backend's buffers (MjData, Warp arrays), not in tensor
    # attributes: a checkpoint cannot restore it, so a resumed run resets these envs.
    state_in_tensors = False

    def __init__(
        self,
        num_envs: int,
        device: torch.device | str,
        model: mujoco.MjModel,
        frame_skip: int,
        obs_dim: int,
        fields: tuple[str, ...],
        backend: str = "mujoco",
        num_workers: int | None = None,
        nconmax: int = 64,
        njmax: int = 256,
        validate: bool = True,
        *,
        max_episode_steps: int,
        features: FeatureSpec,
    ):
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
        super().__init__(num_envs, device, validate)
        self.mj_model = model
        self.frame_skip = int(frame_skip)
        self.dt = float(model.opt.timestep) * self.frame_skip
        self.backend_name = backend
        self.sim: PhysicsBackend = make_backend(
            backend,
            model,
            self.num_envs,
            frame_skip,
            fields,
            self.device,
            num_workers,
            nconmax,
            njmax,
        )
        dtype = self.sim.dtype
        low = model.actuator_ctrlrange[:, 0].copy()
        high = model.actuator_ctrlrange[:, 1].copy()
        limited = model.actuator_ctrllimited.astype(bool)
        # Unlimited actuators take the policy's [-1, 1] as is.
        low[~limited], high[~limited] = -1.0, 1.0
        self._ctrl_low = torch.as_tensor(low, dtype=dtype, device=self.device)
        self._ctrl_scale = torch.as_tensor((high - low) / 2.0, dtype=dtype, device=self.device)
        self.qpos0 = torch.as_tensor(model.qpos0, dtype=dtype, device=self.device)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (model.nu,), dtype=np.float32)
        self.single_observation_space = gym.spaces.Box(
            -np.inf, np.inf, (obs_dim,), dtype=np.float32
        )
        self._unstable = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        self.unstable_total = torch.zeros((), dtype=torch.long, device=self.device)
        self._last_obs: torch.Tensor | None = None
        self._last_features: torch.Tensor | None = None
        self.max_episode_steps = int(max_episode_steps)
        self.features = features
        self._feature_bounds = tuple(t.to(dtype) for t in features.bounds(self.device))

    # -- task hooks ---------------------------------------------------------------------------

    @abc.abstractmethod
    def _sample_reset(self) -> tuple[torch.Tensor, torch.Tensor]: ...

    @abc.abstractmethod
    def _task_step(
        self, actions: torch.Tensor, ctrl: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    @abc.abstractmethod
    def _task_obs(self) -> torch.Tensor: ...

    @abc.abstractmethod
    def _task_features(self) -> torch.Tensor: ...

    def _on_reset(self, mask: torch.Tensor) -> None:
        """Reset task state of the masked envs after their physics state was reset."""

    # -- helpers for tasks --------------------------------------------------------------------

    def uniform(self, shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
        """Uniform noise from the env's generator, in the backend's dtype.

        Drawn in float32 on every backend, so that the same seed gives the same initial states on
        CPU MuJoCo (float64) and MuJoCo Warp (float32).
        """
        u = torch.rand(shape, generator=self.generator, device=self.device)
        return (low + (high - low) * u).to(self.sim.dtype)

    def normal(self, shape: tuple[int, ...]) -> torch.Tensor:
        """Standard normal noise from the env's generator (float32, cast to the backend's)."""
        return torch.randn(shape, generator=self.generator, device=self.device).to(self.sim.dtype)

    def set_state(
        self, qpos: torch.Tensor, qvel: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Put the masked envs (all by default) in state ``qpos [E, nq]``, ``qvel [E, nv]``, as
        a reset would; returns the observation ``[E, O]``."""
        mask = self._all if mask is None else mask.to(self.device)
        self.sim.reset_envs(mask, qpos.to(self.device), qvel.to(self.device))
        self._on_reset(mask)
        self._unstable &= ~mask
        self.episode.clear(mask)
        return self._observe()

    # -- TensorVecEnv implementation ----------------------------------------------------------

    def _reset_envs(self, mask: torch.Tensor) -> None:
        qpos, qvel = self._sample_reset()
        self.sim.reset_envs(mask, qpos, qvel)
        self._on_reset(mask)
        self._unstable &= ~mask
        if self._last_features is not None:
            # The fallback features of a reset env are those of its new episode's first state.
            fresh = self._task_features().float()
            self._last_features = torch.where(mask.view(-1, 1), fresh, self._last_features)

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ctrl = self._ctrl_low + (actions.to(self.sim.dtype) + 1.0) * self._ctrl_scale
        self.sim.step(ctrl)
        qpos, qvel = self.sim.field("qpos"), self.sim.field("qvel")
        finite = torch.isfinite(qpos).all(dim=1) & torch.isfinite(qvel).all(dim=1)
        unstable = ~finite | self.sim.diverged()
        self._unstable = unstable
        self.unstable_total += unstable.sum()
        reward, terminated = self._task_step(actions, ctrl)
        reward = torch.where(unstable, 0.0, reward.float())
        return reward, terminated | unstable

    def _observe(self) -> torch.Tensor:
        obs = self._task_obs().float()
        if self._last_obs is not None:
            obs = torch.where(self._unstable.view(-1, 1), self._last_obs, obs)
        self._last_obs = obs
        return obs

    def _features(self) -> torch.Tensor:
        feats = self._task_features().float()
        if self._last_features is not None:
            feats = torch.where(self._unstable.view(-1, 1), self._last_features, feats)
        self._last_features = feats
        return feats

    def _extra_info(self, done: torch.Tensor) -> dict[str, Any]:
        return {"unstable": self._unstable.clone(), "unstable_total": self.unstable_total.clone()}

    def clip_features(self, feats: torch.Tensor) -> torch.Tensor:
        """Clamp ``feats [E, p]`` to the declared feature bounds."""
        low, high = self._feature_bounds
        return torch.maximum(torch.minimum(feats, high), low)

    def describe(self) -> dict[str, Any]:
        info = super().describe()
        info.update(backend=self.backend_name, dt=self.dt, frame_skip=self.frame_skip)
        return info

    def close(self) -> None:
        self.sim.close()
