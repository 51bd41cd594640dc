"""The environment worker: one shard of environments, run inside a Ray actor.

:class:`EnvWorker` is a plain class; :mod:`myriad.distributed.remote` turns it into a Ray actor
with ``ray.remote(...)(EnvWorker)``. It builds any registered VecEnv by name with
:func:`myriad.envs.make`, so torch navigation, MuJoCo and Gymnasium-wrapped environments all run
the same way. Arrays cross the process boundary as NumPy arrays (Ray moves those without
pickling their contents).

Shapes: ``n`` envs in this shard, ``O`` observation, ``A`` action, ``p`` feature dimension, ``T``
rollout horizon.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import torch
from torch import nn

from myriad.distributed.policy import (
    CATEGORICAL,
    ParamsPolicy,
    as_dist_params,
    dist_kind,
    dist_log_prob,
    dist_sample,
)
from myriad.distributed.shards import POLICY_STREAM, derive_seed
from myriad.envs.registry import make
from myriad.rl.collector import env_state_dict, load_env_state_dict
from myriad.utils.seeding import make_generator
from myriad.utils.tensors import resolve_device


class WorkerStateLost(RuntimeError):
    """Ray restarted this worker's process, which has not been reset since: the call that reached
    it belongs to the previous process. The learner recovers the shard instead of failing."""


def _reconstructed() -> bool:
    try:
        import ray
    except ImportError:
        return False
    if not ray.is_initialized():
        return False
    return bool(ray.get_runtime_context().was_current_actor_reconstructed)


def to_numpy(value: torch.Tensor) -> np.ndarray:
    return value.detach().cpu().numpy()


def _per_env(value: Any, num_envs: int) -> bool:
    return isinstance(value, torch.Tensor) and value.dim() >= 1 and value.shape[0] == num_envs


def split_info(info: dict[str, Any], num_envs: int) -> tuple[dict[str, np.ndarray], dict]:
    """Split a step's ``info`` into per-env arrays (leading dim ``n``) and everything else."""
    arrays: dict[str, np.ndarray] = {}
    other: dict[str, Any] = {}
    for key, value in info.items():
        if _per_env(value, num_envs):
            arrays[key] = to_numpy(value)
        else:
            other[key] = value.cpu() if isinstance(value, torch.Tensor) else value
    return arrays, other


class EnvWorker:
    """A shard of ``num_envs`` environments, optionally with a policy copy that acts on them.

    Args:
        env: registered environment name.
        num_envs: envs in this shard (``n``).
        env_options: options passed to :func:`myriad.envs.make`.
        device: torch device the env (and the policy copy) runs on inside the worker.
        shard: index of this shard, for messages and counters.
        num_threads: torch intra-op threads; one per reserved CPU keeps workers from competing.
    """

    def __init__(
        self,
        env: str,
        num_envs: int,
        env_options: dict[str, Any] | None = None,
        device: str = "cpu",
        shard: int = 0,
        num_threads: int = 1,
    ) -> None:
        torch.set_num_threads(max(1, int(num_threads)))
        self.shard = shard
        self.device = resolve_device(device)
        self.env = make(env, num_envs, self.device, **(env_options or {}))
        self.num_envs = self.env.num_envs
        self.steps = 0
        self.rollouts = 0
        self._obs: torch.Tensor | None = None
        self.policy: nn.Module | None = None
        self.version = -1
        self.member: torch.Tensor | None = None
        self.action_table: torch.Tensor | None = None
        self.generator = make_generator(0, self.device)

    # -- introspection ----------------------------------------------------------------------
    def ready(self) -> dict[str, Any]:
        """Identity of this actor process: shard, pid, and whether Ray restarted it."""
        return {"shard": self.shard, "pid": os.getpid(), "reconstructed": _reconstructed()}

    def spec(self) -> dict[str, Any]:
        """Spaces, features and time limit of the env, for the learner-side facade."""
        return {
            "single_observation_space": self.env.single_observation_space,
            "single_action_space": self.env.single_action_space,
            "features": self.env.features,
            "max_episode_steps": self.env.max_episode_steps,
        }

    def counters(self) -> dict[str, int]:
        """Work done by this process since it started (a restart starts from zero).

        ``steps``: vector steps (each covers the shard's ``n`` envs), including rollout steps;
        ``rollouts``: rollout batches returned; ``version``: policy version held (-1: none).
        """
        return {
            "shard": self.shard,
            "steps": self.steps,
            "rollouts": self.rollouts,
            "version": self.version,
            "num_envs": self.num_envs,
        }

    # -- central inference ------------------------------------------------------------------
    def reset(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Reset with ``seed``; returns ``(obs [n, O], features [n, p])`` of the new states."""
        self._obs = self.env.reset(seed=int(seed))
        self.generator = make_generator(derive_seed(seed, POLICY_STREAM), self.device)
        return to_numpy(self._obs), to_numpy(self.env.current_features())

    def step(self, actions: np.ndarray) -> dict[str, Any]:
        """One step with ``actions [n, A]``.

        Returns:
            ``{"obs", "reward", "terminated", "truncated", "info", "info_other",
            "current_features"}``: arrays ``[n, ...]``, ``info`` the per-env info arrays,
            ``info_other`` the remaining info entries, ``current_features [n, p]`` those of the
            states after any reset (kept by the learner to close episodes cut by a failure).
        """
        self._require_reset()
        act = torch.as_tensor(actions, device=self.device)
        obs, reward, terminated, truncated, info = self.env.step(act)
        self._obs = obs
        self.steps += 1
        arrays, other = split_info(info, self.num_envs)
        return {
            "obs": to_numpy(obs),
            "reward": to_numpy(reward),
            "terminated": to_numpy(terminated),
            "truncated": to_numpy(truncated),
            "info": arrays,
            "info_other": other,
            "current_features": to_numpy(self.env.current_features()),
        }

    def current_features(self) -> np.ndarray:
        return to_numpy(self.env.current_features())

    # -- checkpoints ----------------------------------------------------------------------------
    def get_state(self) -> dict[str, Any]:
        """This shard's resumable state: ``env`` (:func:`~myriad.rl.collector.env_state_dict`,
        whose ``exact`` says whether it restores the env exactly), ``obs [n, O]`` of the current
        states and the policy-stream ``generator``; tensors only, as checkpoints load them."""
        self._require_reset()
        assert self._obs is not None  # _require_reset raised otherwise
        return {
            "env": env_state_dict(self.env),
            "obs": self._obs.detach().cpu().clone(),
            "generator": self.generator.get_state(),
        }

    def set_state(self, state: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """Restore a :meth:`get_state` of a shard of the same size; returns ``(obs [n, O],
        features [n, p])`` of the restored states."""
        reason = load_env_state_dict(self.env, state["env"])
        if reason is not None:
            raise RuntimeError(f"shard {self.shard}: {reason}; reset it instead")
        self._obs = state["obs"].to(self.device)
        self.generator.set_state(state["generator"])
        return to_numpy(self._obs), to_numpy(self.env.current_features())

    # -- worker-side inference ----------------------------------------------------------------
    def set_policy(
        self,
        policy: nn.Module,
        version: int,
        member: np.ndarray,
        action_table: np.ndarray | None = None,
    ) -> int:
        """Install a policy copy (with its weights) acting as ``member [n]`` on this shard.

        ``action_table [K, A]`` maps a categorical policy's action index to the env's action;
        Gaussian policies act directly. Returns ``version``.
        """
        self.policy = policy.to(self.device).eval()
        self.version = int(version)
        self.member = torch.as_tensor(member, dtype=torch.long, device=self.device)
        self.action_table = (
            None
            if action_table is None
            else torch.as_tensor(action_table, dtype=torch.float32, device=self.device)
        )
        return self.version

    def set_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> int:
        """Load the learner's weights of ``version``; returns ``version``."""
        if self.policy is None:
            raise RuntimeError(f"shard {self.shard}: set_weights before set_policy")
        self.policy.load_state_dict(state_dict)
        self.version = int(version)
        return self.version

    @torch.no_grad()
    def rollout(self, horizon: int) -> dict[str, Any]:
        """Act with the held policy for ``horizon`` steps from the current states.

        Returns:
            A dict of arrays ``[T, n, ...]``: ``obs``, ``actions`` (``[T, n, A]`` float or
            ``[T, n]`` long), ``log_prob`` (behaviour log-probabilities), ``params`` (the
            behaviour distribution, ``{"mean", "log_std"}`` or ``{"logits"}``), ``reward``,
            ``terminated``, ``truncated``, ``info`` (per-env info arrays); plus ``next_obs [n, O]``
            and ``next_features [n, p]`` of the states after the last step, ``version`` of the
            policy that acted, and ``counters``.
        """
        obs = self._require_reset()
        policy, member = self.policy, self.member
        if policy is None or member is None:
            if _reconstructed():
                raise WorkerStateLost(f"shard {self.shard}: restarted, policy not installed yet")
            raise RuntimeError(f"shard {self.shard}: rollout before set_policy")
        if not isinstance(policy, ParamsPolicy):
            raise TypeError(
                f"shard {self.shard}: {type(policy).__name__} has no action_params(obs, member) "
                "(see myriad.distributed.policy)"
            )
        obs_l, act_l, logp_l, rew_l, term_l, trunc_l = [], [], [], [], [], []
        params_l: dict[str, list[torch.Tensor]] = {}
        info_l: dict[str, list[torch.Tensor]] = {}
        for _ in range(int(horizon)):
            params = as_dist_params(policy.action_params(obs, member))
            actions = dist_sample(params, self.generator)
            log_prob = dist_log_prob(params, actions)
            env_actions = self._env_actions(params, actions)
            next_obs, reward, terminated, truncated, info = self.env.step(env_actions)
            self.steps += 1
            obs_l.append(obs)
            act_l.append(actions)
            logp_l.append(log_prob)
            for key, value in params.items():
                params_l.setdefault(key, []).append(value)
            rew_l.append(reward)
            term_l.append(terminated)
            trunc_l.append(truncated)
            # Kept on the env's device (a copy: envs may reuse their info buffers) and brought
            # to the host once, with the other arrays, after the last step.
            for key, value in info.items():
                if _per_env(value, self.num_envs):
                    info_l.setdefault(key, []).append(value.clone())
            self._obs = obs = next_obs
        self.rollouts += 1

        def stack(xs: list[torch.Tensor]) -> np.ndarray:
            return to_numpy(torch.stack(xs))

        return {
            "obs": stack(obs_l),
            "actions": stack(act_l),
            "log_prob": stack(logp_l),
            "params": {k: stack(v) for k, v in params_l.items()},
            "reward": stack(rew_l),
            "terminated": stack(term_l),
            "truncated": stack(trunc_l),
            "info": {k: stack(v) for k, v in info_l.items()},
            "next_obs": to_numpy(obs),
            "next_features": to_numpy(self.env.current_features()),
            "version": self.version,
            "counters": self.counters(),
        }

    def _env_actions(self, params: dict[str, torch.Tensor], actions: torch.Tensor) -> torch.Tensor:
        if dist_kind(params) != CATEGORICAL:
            return actions
        if self.action_table is None:
            raise RuntimeError(
                f"shard {self.shard}: a categorical policy needs an action_table [K, A] mapping "
                "action indices to env actions"
            )
        return self.action_table[actions]

    def _require_reset(self) -> torch.Tensor:
        """The observations ``[n, O]`` of the current states; raises before the first reset."""
        if self._obs is None:
            if _reconstructed():
                raise WorkerStateLost(f"shard {self.shard}: restarted, not reset yet")
            raise RuntimeError(f"shard {self.shard}: call reset(seed) before stepping")
        return self._obs

    def close(self) -> None:
        self.env.close()
