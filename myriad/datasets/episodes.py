"""Turning ``[T, E]`` rollouts into episode-contiguous transition rows.

Rollouts cut episodes at arbitrary points and interleave environments; dataset layouts such as
D4RL's need every episode's transitions contiguous and in time order. :class:`EpisodeAssembler`
stages each environment's unfinished episode and emits whole episodes as they end.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch

from myriad.datasets.schema import Rows, row_fields


class EpisodeAssembler:
    """Stages per-env partial episodes and releases finished ones as contiguous rows.

    Args:
        num_envs: ``E``.
        max_len: longest possible episode (the env's time limit).
        fields: ``name -> (trailing shape, dtype)`` of every per-step field.

    Memory is bounded by ``E * max_len`` rows per field, whatever the run length.
    """

    def __init__(
        self, num_envs: int, max_len: int, fields: dict[str, tuple[tuple[int, ...], Any]]
    ) -> None:
        self.num_envs, self.max_len = int(num_envs), int(max_len)
        self.fields = {k: (tuple(shape), np.dtype(dt)) for k, (shape, dt) in fields.items()}
        self.staging = {
            k: np.zeros((self.num_envs, self.max_len, *shape), dtype=dt)
            for k, (shape, dt) in self.fields.items()
        }
        self.length = np.zeros(self.num_envs, dtype=np.int64)
        self._envs = np.arange(self.num_envs)

    def add(self, steps: dict[str, np.ndarray], done: np.ndarray) -> dict[str, np.ndarray]:
        """Stage ``T`` steps and return the episodes that ended, concatenated.

        Args:
            steps: ``name -> [T, E, *shape]`` for every field.
            done: ``[T, E]`` bool, the episode of env e ended at step t.

        Returns:
            ``name -> [N, *shape]``: the finished episodes, each contiguous and in time order,
            ordered by the step at which they ended, then by env index.
        """
        missing = set(self.fields) - set(steps)
        if missing:
            raise KeyError(f"EpisodeAssembler.add: missing fields {sorted(missing)}")
        out: dict[str, list[np.ndarray]] = {k: [] for k in self.fields}
        for t in range(done.shape[0]):  # loop over rollout steps; envs are vectorised
            if (self.length >= self.max_len).any():
                env = int(np.argmax(self.length >= self.max_len))
                raise RuntimeError(
                    f"env {env} ran {self.max_len} steps without ending an episode: "
                    "max_len must be at least the env's max_episode_steps"
                )
            for k in self.fields:
                self.staging[k][self._envs, self.length] = steps[k][t]
            self.length += 1
            ended = np.flatnonzero(done[t])
            if ended.size:
                for k, rows in self._release(ended).items():
                    out[k].append(rows)
        return {
            k: np.concatenate(v) if v else np.zeros((0, *shape), dtype=dt)
            for (k, v), (shape, dt) in zip(out.items(), self.fields.values())
        }

    def _release(self, envs: np.ndarray) -> dict[str, np.ndarray]:
        lengths = self.length[envs]
        mask = np.arange(self.max_len)[None, :] < lengths[:, None]  # [n, L]
        rows = {k: self.staging[k][envs][mask] for k in self.fields}
        self.length[envs] = 0
        return rows

    def flush(self) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """Release every unfinished episode (at the end of a run).

        Returns:
            ``(rows, last)``: rows as in :meth:`add`, and ``last [N]`` bool marking each cut
            episode's final row (to be flagged as a timeout).
        """
        envs = np.flatnonzero(self.length > 0)
        lengths = self.length[envs]
        rows = self._release(envs)
        last = np.zeros(int(lengths.sum()), dtype=bool)
        last[np.cumsum(lengths) - 1] = True
        return rows, last

    def state_dict(self) -> dict[str, Any]:
        """Unfinished episodes, so a resumed run continues them (only the staged rows)."""
        used = int(self.length.max(initial=0))
        return {
            "length": self.length.copy(),
            "staging": {k: v[:, :used].copy() for k, v in self.staging.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.length[:] = state["length"]
        for k, v in state["staging"].items():
            self.staging[k][:, : v.shape[1]] = v


def random_policy_rows(
    env: Any, steps: int, *, seed: int = 0, member: torch.Tensor | None = None
) -> Iterator[Rows]:
    """Transitions of uniformly random actions in ``[-1, 1]`` (a "random" offline dataset).

    Resets ``env`` with ``seed`` and runs ``steps`` vector steps, drawing actions from a
    generator seeded with ``seed``; yields, after each step, the rows of the episodes that ended
    in it (schema of :func:`~myriad.datasets.schema.row_fields`; episodes still running at the
    end are not yielded).

    Args:
        env: a myriad VecEnv.
        steps: vector steps to run.
        seed: reset and action seed.
        member: ``[E]`` member id written for each env (default: 0).
    """
    num_envs = env.num_envs
    member = torch.zeros(num_envs, dtype=torch.int32) if member is None else member
    assembler = EpisodeAssembler(
        num_envs, env.max_episode_steps, row_fields(env.obs_dim, env.action_dim, env.features.dim)
    )
    gen = torch.Generator(device=env.device).manual_seed(seed)
    obs = env.reset(seed=seed)
    for _ in range(steps):
        features = env.current_features()
        actions = torch.rand(num_envs, env.action_dim, generator=gen, device=env.device) * 2 - 1
        next_obs, reward, terminated, truncated, info = env.step(actions)
        step = {
            "observations": obs,
            "next_observations": info["final_obs"],
            "actions": actions,
            "rewards": reward,
            "terminals": terminated,
            "timeouts": truncated,
            "member": member.to(torch.int32),
            "features": features,
        }
        host = {k: v.detach().cpu().numpy()[None] for k, v in step.items()}
        yield assembler.add(host, host["terminals"] | host["timeouts"])
        obs = next_obs
