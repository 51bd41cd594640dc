"""Task rewards for reward-free datasets: one pretraining dataset serves several downstream tasks.

For the nav suite (``nav-*`` envs, any layout) and the Ant mazes (``mujoco-antmaze-*``) the task
reward of a transition depends only on the next state's position, so it can be recomputed for any
goal: ``"sparse"`` gives ``+1`` and a terminal on reaching the goal, ``"dense"`` (nav suite) adds
minus the normalised geodesic distance to the goal, computed by the env's own ``task_reward``
(the function the env steps with). Where the observation holds the goal (the Ant mazes' goal
offset), it is rewritten for the new goal by the env's ``observations_for_goal``.

The next state's position is the next row's ``infos/x, infos/y`` inside an episode, and at an
episode's last row (where the next row belongs to another episode) it is read back from
``next_observations``, whose first two entries encode the position as ``2 x / W - 1``.

Relabelling replaces ``rewards`` and ``terminals``. A row where the goal is reached becomes
terminal, so an episode of the source data that passes through the goal splits there into two
episodes; ``timeouts`` are kept.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

import numpy as np
import torch

from myriad.datasets.schema import DatasetSpec, Rows, concat_rows, take_rows

TASKS = ("sparse", "dense")


@runtime_checkable
class GoalEnv(Protocol):
    """The goal API relabelling needs (``PointNavEnv``, ``AntMazeEnv``): positions from
    observations and the reward of arriving at a position."""

    def positions(self, observations: torch.Tensor) -> torch.Tensor: ...

    def task_reward(
        self, pos: torch.Tensor, goal_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class NavGoalReward:
    """The task reward for one goal of a nav env or an Ant maze.

    Args:
        env: the dataset's env name (``metadata["env"]``).
        options: its options (``metadata["env_options"]``).
        task: ``"sparse"`` or ``"dense"``.
        goal: ``(x, y)``; default the env's goal for ``task`` (the map's ``G`` cell, or the cell
            farthest from the start).
        goal_radius: the goal is reached within this distance; default the dataset's env option
            (the env's default, 0.5, when the options do not set it).
    """

    def __init__(
        self,
        env: str,
        options: dict[str, Any] | None,
        task: str,
        goal: tuple[float, float] | None = None,
        goal_radius: float | None = None,
    ) -> None:
        from myriad.envs import make

        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; relabelling supports {TASKS}")
        opts = {k: v for k, v in dict(options or {}).items() if k not in ("task", "goal", "goals")}
        opts["task"] = task
        if goal is not None:
            opts["goal"] = tuple(float(g) for g in goal)
        if goal_radius is not None:
            opts["goal_radius"] = float(goal_radius)
        nav = make(env, 1, "cpu", **opts)
        if not isinstance(nav, GoalEnv):
            nav.close()
            raise ValueError(
                "relabelling needs an env of the nav suite (nav-*) or an Ant maze "
                f"(mujoco-antmaze-*), the dataset's env is {env!r}"
            )
        self.task = task
        self.env = nav

    @classmethod
    def for_spec(
        cls,
        spec: DatasetSpec,
        task: str,
        goal: tuple[float, float] | None = None,
        goal_radius: float | None = None,
    ) -> NavGoalReward:
        env = spec.metadata.get("env")
        if not isinstance(env, str):
            raise ValueError("the dataset's metadata names no env: cannot compute task rewards")
        return cls(env, spec.metadata.get("env_options"), task, goal, goal_radius)

    def positions(self, observations: np.ndarray) -> np.ndarray:
        """World positions ``[N, 2]`` encoded in observations ``[N, O]``."""
        return self.env.positions(torch.as_tensor(observations, dtype=torch.float32)).numpy()

    def observations(self, observations: np.ndarray) -> np.ndarray:
        """``observations [N, O]`` as the env would give them with this goal (unchanged where
        they do not hold the goal)."""
        rewrite = getattr(self.env, "observations_for_goal", None)
        if rewrite is None:
            return observations
        return rewrite(torch.as_tensor(observations)).numpy().astype(observations.dtype)

    def __call__(self, next_positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rewards [N] float32, terminals [N] bool)`` of transitions reaching
        ``next_positions [N, 2]``."""
        pos = torch.as_tensor(next_positions, dtype=torch.float32)
        goal = torch.zeros(len(pos), dtype=torch.long)  # the env's only goal
        reward, reached = self.env.task_reward(pos, goal)
        return reward.numpy(), reached.numpy()


def reward_note(task: str, goal: tuple[float, float] | None) -> str:
    """The ``metadata["reward"]`` of a dataset whose rewards were relabelled with a task."""
    where = f"goal {tuple(goal)}" if goal is not None else "the env's goal"
    return f"task reward '{task}' for {where}, relabelled from next states"


def _next_positions(rows: Rows, spec: DatasetSpec, reward: NavGoalReward) -> np.ndarray:
    """Next-state positions; the batch's last row is taken as an episode end."""
    try:
        ix, iy = spec.feature_names.index("x"), spec.feature_names.index("y")
    except ValueError:
        raise ValueError(
            f"relabelling needs the features x, y; the dataset has {spec.feature_names}"
        ) from None
    n = len(rows["rewards"])
    pos = rows["features"][:, [ix, iy]]
    nxt = np.empty((n, 2), np.float32)
    nxt[:-1] = pos[1:]
    from_obs = rows["terminals"] | rows["timeouts"]
    from_obs[-1:] = True
    if from_obs.any():
        nxt[from_obs] = reward.positions(rows["next_observations"][from_obs])
    return nxt


def relabel_rows(rows: Rows, spec: DatasetSpec, reward: NavGoalReward) -> Rows:
    """``rows`` (whole episodes, or a batch whose last row ends its episode) with the rewards
    and terminals of ``reward``."""
    if len(rows["rewards"]) == 0:
        return rows
    rewards, terminals = reward(_next_positions(rows, spec, reward))
    return {
        **rows,
        "observations": reward.observations(rows["observations"]),
        "next_observations": reward.observations(rows["next_observations"]),
        "rewards": rewards,
        "terminals": terminals,
    }


def relabel_stream(
    chunks: Iterator[Rows],
    spec: DatasetSpec,
    task: str,
    goal: tuple[float, float] | None = None,
) -> Iterator[Rows]:
    """Relabel a stream of row batches (episode-contiguous), holding back one row per batch
    when its episode continues in the next batch, so its next position comes from that row."""
    reward = NavGoalReward.for_spec(spec, task, goal)
    carry: Rows | None = None
    for rows in chunks:
        if carry is not None:
            rows = concat_rows([carry, rows], spec)
            carry = None
        n = len(rows["rewards"])
        if n == 0:
            continue
        if not (rows["terminals"][-1] or rows["timeouts"][-1]):
            carry = take_rows(rows, slice(n - 1, n))
            rows = take_rows(rows, slice(0, n - 1))
            if n == 1:
                continue
        yield relabel_rows(rows, spec, reward)
    if carry is not None:
        yield relabel_rows(carry, spec, reward)
