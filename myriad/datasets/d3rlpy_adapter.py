"""Conversion to d3rlpy's dataset type, keeping every transition.

d3rlpy stores episodes as observation sequences and pairs step ``t`` with observation ``t + 1``;
an episode that ends by timeout yields one transition fewer than its length (its last next
observation is unknown), and a terminated episode pairs its last step with a zero observation
and ``terminal = 1``. Our rows store every next observation, so each episode that does not end
in a terminal gets one extra row holding its last next observation (zero action and reward,
flagged as the timeout). d3rlpy then yields exactly our ``N`` transitions, each with our ``s'``.
"""

from __future__ import annotations

import contextlib
import io
import sys
from types import ModuleType
from typing import Any

import numpy as np

from myriad.datasets.data import TransitionData
from myriad.utils.optional import require


def d3rlpy_arrays(data: TransitionData) -> dict[str, np.ndarray]:
    """The arrays handed to ``d3rlpy.dataset.MDPDataset``: ``observations [N + P, O], actions
    [N + P, A], rewards [N + P], terminals [N + P], timeouts [N + P]`` (float32 flags), where P is
    the number of episodes that do not end in a terminal. A final row that ends no episode is
    treated as a timeout."""
    terminals = np.asarray(data.terminals, bool)
    ends = terminals | np.asarray(data.timeouts, bool)
    ends[-1:] = True
    pad_after = np.flatnonzero(ends & ~terminals)  # rows after which the next obs is appended
    at = pad_after + 1
    n_act = data.actions.shape[1]
    obs = np.insert(
        np.asarray(data.observations, np.float32),
        at,
        np.asarray(data.next_observations, np.float32)[pad_after],
        axis=0,
    )
    actions = np.insert(
        np.asarray(data.actions, np.float32), at, np.zeros((len(at), n_act), np.float32), axis=0
    )
    rewards = np.insert(np.asarray(data.rewards, np.float32), at, 0.0)
    term = np.insert(terminals.astype(np.float32), at, 0.0)
    timeouts = np.insert(np.zeros(len(terminals), np.float32), at, 1.0)
    return {
        "observations": obs,
        "actions": actions,
        "rewards": rewards,
        "terminals": term,
        "timeouts": timeouts,
    }


def import_d3rlpy() -> ModuleType:
    """d3rlpy, imported without the notice that its ``gym`` dependency prints.

    d3rlpy 2.x imports the unmaintained ``gym`` package, which prints a four-line deprecation
    notice to stderr on import; myriad never calls gym, so the notice tells a user nothing they
    can act on. Everything else written to stderr during the import (warnings included) is passed
    through unchanged. Raises :class:`~myriad.utils.optional.MissingDependencyError` (one line,
    naming the ``offline`` extra) when d3rlpy is not installed.
    """
    if "d3rlpy" in sys.modules:
        return sys.modules["d3rlpy"]
    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured):
            module = require("d3rlpy", extra="offline")
    finally:
        sys.stderr.write(without_gym_notice(captured.getvalue()))
    return module


def without_gym_notice(text: str) -> str:
    """``text`` with the installed gym version's import notice (from ``gym_notices``) removed."""
    try:
        from importlib.metadata import version

        from gym_notices.notices import notices

        notice = notices.get(version("gym"))
    except Exception:  # no gym or no notice table: nothing to remove
        return text
    return text.replace(f"{notice}\n", "", 1) if notice else text


def to_d3rlpy(data: TransitionData, vectorised_sampling: bool = True) -> Any:
    """A ``d3rlpy.dataset.MDPDataset`` (a ``ReplayBuffer``) with every transition of ``data``.

    Args:
        data: NumPy transitions, e.g. from :func:`myriad.datasets.load` (optionally relabelled).
        vectorised_sampling: draw mini-batches with array indexing rather than d3rlpy's
            transition-by-transition Python loop. The distribution is the same (uniform over
            transitions, with replacement) and so are the contents of each transition; only the
            ``transitions`` list of the mini-batch is left empty.

    Returns:
        ``MDPDataset`` with continuous actions; ``dataset.transition_count == len(data)``.
    """
    if len(data) == 0:
        raise ValueError("the dataset is empty: d3rlpy needs at least one transition")
    import_d3rlpy()
    from d3rlpy import ActionSpace
    from d3rlpy.dataset import MDPDataset

    arrays = d3rlpy_arrays(data)
    kwargs = {"action_space": ActionSpace.CONTINUOUS, "action_size": int(data.actions.shape[1])}
    if not vectorised_sampling:
        return MDPDataset(**arrays, **kwargs)
    return _vectorised_dataset_class()(data, **arrays, **kwargs)


def _vectorised_dataset_class() -> type:
    from d3rlpy.dataset import MDPDataset, TransitionMiniBatch

    class VectorisedMDPDataset(MDPDataset):
        """``MDPDataset`` whose mini-batches are gathered with array indexing."""

        def __init__(self, data: TransitionData, **arrays: Any) -> None:
            super().__init__(**arrays)
            terminals = np.asarray(data.terminals, bool)
            ends = terminals | np.asarray(data.timeouts, bool)
            ends[-1:] = True
            self._obs = np.asarray(data.observations, np.float32)
            self._actions = np.asarray(data.actions, np.float32)
            self._rewards = np.asarray(data.rewards, np.float32).reshape(-1, 1)
            self._terminals = terminals.astype(np.float32).reshape(-1, 1)
            # d3rlpy's next action: the episode's next action, zero after its last step.
            nxt = np.zeros_like(self._actions)
            nxt[:-1][~ends[:-1]] = self._actions[1:][~ends[:-1]]
            self._next_actions = nxt
            # s' of a terminal step is a zero observation in d3rlpy.
            self._next_obs = np.where(
                terminals[:, None], 0.0, np.asarray(data.next_observations, np.float32)
            ).astype(np.float32)
            self._intervals = np.ones((len(terminals), 1), np.float32)

        def sample_transition_batch(self, batch_size: int) -> TransitionMiniBatch:
            # np.random, as d3rlpy's own sampler, so d3rlpy.seed() governs both.
            i = np.random.randint(len(self._obs), size=batch_size)
            return TransitionMiniBatch(
                observations=self._obs[i],
                actions=self._actions[i],
                rewards=self._rewards[i],
                next_observations=self._next_obs[i],
                next_actions=self._next_actions[i],
                terminals=self._terminals[i],
                intervals=self._intervals[i],
                transitions=[],
            )

    return VectorisedMDPDataset
