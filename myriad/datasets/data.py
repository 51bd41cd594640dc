"""Datasets in memory: :class:`TransitionData`, :func:`load` (any format, NumPy or torch, member
filter, task relabelling) and the D4RL transition view :func:`qlearning_dataset`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from myriad.datasets.relabel import NavGoalReward, relabel_rows, relabel_stream, reward_note
from myriad.datasets.schema import (
    CHUNK_ROWS,
    ROW_KEYS,
    DatasetSpec,
    Rows,
    concat_rows,
    episode_ends,
)


@dataclass
class TransitionData:
    """Transitions of a dataset, as NumPy arrays or torch tensors (all of one kind).

    Attributes:
        observations: ``[N, O]`` float32.
        actions: ``[N, A]`` float32.
        rewards: ``[N]`` float32 (the pretraining objective's intrinsic reward, or a task reward
            after :func:`myriad.datasets.relabel`).
        next_observations: ``[N, O]`` float32.
        terminals: ``[N]`` bool.
        timeouts: ``[N]`` bool.
        member: ``[N]`` int32, the policy that acted.
        features: ``[N, p]`` float32, entropy features of the observation's state.
        feature_names: the ``p`` feature names.
        metadata: env, options, config, ... of the dataset.
    """

    observations: Any
    actions: Any
    rewards: Any
    next_observations: Any
    terminals: Any
    timeouts: Any
    member: Any
    features: Any
    feature_names: tuple[str, ...] = ()
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_rows(cls, rows: Rows, spec: DatasetSpec) -> TransitionData:
        return cls(
            **{k: rows[k] for k in ROW_KEYS},
            feature_names=spec.feature_names,
            metadata=dict(spec.metadata),
        )

    @property
    def spec(self) -> DatasetSpec:
        return DatasetSpec(
            int(self.observations.shape[1]),
            int(self.actions.shape[1]),
            self.feature_names,
            self.metadata,
        )

    def rows(self) -> Rows:
        """The arrays as a row batch (see :mod:`myriad.datasets.schema`)."""
        return {k: getattr(self, k) for k in ROW_KEYS}

    def __len__(self) -> int:
        return int(self.observations.shape[0])

    def feature(self, name: str) -> Any:
        """``[N]`` values of one entropy feature (e.g. ``"x"``)."""
        return self.features[:, self.feature_names.index(name)]

    def episode_ends(self) -> np.ndarray:
        """Exclusive end row of every episode, ``[K]`` int64 (NumPy data only)."""
        return episode_ends(np.asarray(self.terminals), np.asarray(self.timeouts))

    def select(self, index: Any) -> TransitionData:
        """The rows picked by a bool mask, indices or a slice."""
        return replace(self, **{k: getattr(self, k)[index] for k in ROW_KEYS})

    def members(self, members: list[int] | tuple[int, ...]) -> TransitionData:
        """Only the rows collected by ``members`` (episodes stay whole: each has one member)."""
        return self.select(np.isin(np.asarray(self.member), np.asarray(members)))

    def to_torch(self, device: Any = "cpu") -> TransitionData:
        """The same data as torch tensors on ``device`` (zero-copy on CPU)."""
        import torch

        columns: dict[str, Any] = {
            k: torch.as_tensor(getattr(self, k)).to(device) for k in ROW_KEYS
        }
        return replace(self, **columns)


def load(
    path: str | os.PathLike[str],
    members: list[int] | tuple[int, ...] | None = None,
    framework: str = "numpy",
    device: Any = "cpu",
    task: str | None = None,
    goal: tuple[float, float] | None = None,
    chunk_rows: int = CHUNK_ROWS,
    measures: bool = False,
) -> TransitionData:
    """Load a dataset of any format into memory.

    Args:
        path: a D4RL-layout ``.hdf5`` file, a zarr store, a Minari dataset folder, or a
            pretraining run folder (its ``dataset/transitions.hdf5``).
        members: keep only the rows these members collected (read in chunks and filtered, so
            memory holds only what is kept).
        framework: ``"numpy"`` or ``"torch"``.
        device: torch device (``framework="torch"``).
        task: relabel rewards and terminals with this task of the dataset's env
            (``"sparse"`` or ``"dense"``, see :func:`relabel`).
        goal: the task's goal ``(x, y)`` (default: the env's); with ``measures``, also the goal
            whose reaching transitions are counted.
        chunk_rows: rows read at a time.
        measures: put the dataset measures of the loaded rows (per member and union: coverage,
            state-action coverage, k-NN entropy, goal-reaching transitions with ``goal``;
            :mod:`myriad.datasets.measures`) in ``metadata["measures"]``.

    Raises:
        IncompleteDatasetError: the dataset's writer did not finish.
    """
    if framework not in ("numpy", "torch"):
        raise ValueError(f"framework must be 'numpy' or 'torch', got {framework!r}")
    from myriad.datasets.formats import open_reader

    reader = open_reader(path)
    try:
        spec = reader.spec
        chunks = filter_members(reader.iter_chunks(chunk_rows), members)
        if task is not None:
            chunks = relabel_stream(chunks, spec, task, goal)
        rows = concat_rows(list(chunks), spec)
    finally:
        reader.close()
    data = TransitionData.from_rows(rows, spec)
    if task is not None:
        data.metadata = {**data.metadata, "reward": reward_note(task, goal)}
    if measures:
        from myriad.datasets.measures import measure_rows

        data.metadata = {**data.metadata, "measures": measure_rows(rows, spec, goal)}
    return data.to_torch(device) if framework == "torch" else data


def relabel(
    data: TransitionData,
    task: str,
    goal: tuple[float, float] | None = None,
    goal_radius: float | None = None,
) -> TransitionData:
    """``data`` with the rewards and terminals of ``task`` for ``goal`` (NumPy data), and its
    observations as the env gives them with that goal where they hold it (the Ant mazes).

    Args:
        data: a dataset of a nav env or an Ant maze (episode-contiguous, features ``x, y``).
        task: ``"sparse"`` or ``"dense"``.
        goal: ``(x, y)``; default the env's goal.
        goal_radius: the goal is reached within this distance; default the dataset's env's.
    """
    spec = data.spec
    reward = NavGoalReward.for_spec(spec, task, goal, goal_radius)
    rows = relabel_rows(data.rows(), spec, reward)
    return replace(
        data,
        observations=rows["observations"],
        next_observations=rows["next_observations"],
        rewards=rows["rewards"],
        terminals=rows["terminals"],
        metadata={**data.metadata, "reward": reward_note(task, goal)},
    )


def goal_conditioned(
    data: TransitionData,
    goals: list[tuple[float, float]],
    map_size: tuple[float, float],
    clip_actions: bool = False,
    goal_radius: float | None = None,
    origin: tuple[float, float] = (0.0, 0.0),
) -> TransitionData:
    """One copy of ``data`` per goal, relabelled with that goal's sparse reward, the goal appended
    to the observations and next observations (NumPy data; ``[len(goals) * N, O + 2]``).

    The goal is scaled to ``[-1, 1]`` over the map, ``2 * (goal - origin) / map_size - 1`` (a nav
    env's position scaling; an Ant maze, centred on 0, has ``origin = -extent``), so the learner
    sees it in the units of a nav observation. ``clip_actions`` clips the actions to ``[-1, 1]``,
    the actions the env executed (a Gaussian policy's samples are stored as drawn).
    ``goal_radius``: a transition reaches the goal when its next position is within this
    distance (default the dataset's env's).
    """
    size = np.asarray(map_size, np.float32)
    low = np.asarray(origin, np.float32)
    parts = []
    for goal in goals:
        r = relabel(data, "sparse", goal, goal_radius)
        scaled = ((np.asarray(goal, np.float32) - low) / size * 2 - 1).astype(np.float32)
        g = np.broadcast_to(scaled, (len(r), 2))
        parts.append(
            {
                "observations": np.concatenate([r.observations, g], 1),
                "next_observations": np.concatenate([r.next_observations, g], 1),
                "actions": np.clip(r.actions, -1.0, 1.0) if clip_actions else r.actions,
                "rewards": r.rewards,
                "terminals": r.terminals,
                "timeouts": r.timeouts,
            }
        )
    cat = {k: np.concatenate([part[k] for part in parts]) for k in parts[0]}
    n = len(cat["rewards"])
    return TransitionData(
        observations=cat["observations"],
        next_observations=cat["next_observations"],
        actions=cat["actions"],
        rewards=cat["rewards"],
        terminals=cat["terminals"],
        timeouts=cat["timeouts"],
        member=np.zeros(n, np.int32),
        features=np.zeros((n, 0), np.float32),
        metadata=data.metadata,
    )


def filter_members(chunks: Any, members: list[int] | tuple[int, ...] | None) -> Any:
    """The row batches ``chunks`` with only the rows of ``members`` (all when None)."""
    if members is None:
        yield from chunks
        return
    wanted = np.asarray(sorted(set(int(m) for m in members)), dtype=np.int32)
    for rows in chunks:
        keep = np.isin(rows["member"], wanted)
        yield {k: v[keep] for k, v in rows.items()}


def qlearning_dataset(data: TransitionData, terminate_on_end: bool = False) -> dict[str, Any]:
    """The D4RL transition view ``(s, a, r, s', done)`` of ``d4rl.qlearning_dataset``.

    The rule, row by row (``i`` in ``[0, N)``):

    - a row with ``timeouts[i]`` is dropped unless ``terminate_on_end`` (D4RL drops it because,
      without stored next observations, the next row belongs to another episode; dropping it
      here too gives exactly D4RL's transition set), and kept with ``done = terminals[i]`` when
      ``terminate_on_end``;
    - every other row is kept, with ``done = terminals[i]``;
    - ``s'`` is the stored ``next_observations[i]``. Inside an episode it equals D4RL's
      ``observations[i + 1]``; at a terminal it is the true next state, where D4RL pairs the
      first observation of the next episode (which Q-learning ignores, as ``done`` masks it).

    D4RL also always drops the very last row (it has no ``observations[N]``); here the last row
    follows the rule above, since its next observation is stored. On a dataset whose last row
    is a timeout (every dataset written by ``myriad pretrain``), the kept rows are exactly
    D4RL's.

    Returns:
        ``observations [n, O], actions [n, A], next_observations [n, O], rewards [n],
        terminals [n]`` with D4RL's dtypes (float32, bool terminals), as NumPy arrays.
    """
    timeouts = np.asarray(data.timeouts, dtype=bool)
    keep = np.ones(len(data), dtype=bool) if terminate_on_end else ~timeouts
    return {
        "observations": np.asarray(data.observations, np.float32)[keep],
        "actions": np.asarray(data.actions, np.float32)[keep],
        "next_observations": np.asarray(data.next_observations, np.float32)[keep],
        "rewards": np.asarray(data.rewards, np.float32)[keep],
        "terminals": np.asarray(data.terminals, bool)[keep],
    }
