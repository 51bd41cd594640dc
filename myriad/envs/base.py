"""The VecEnv contract: batched environments as torch tensors on one device.

Every backend (torch navigation, MuJoCo, MuJoCo Warp, Gymnasium, Isaac, Ray) implements
:class:`VecEnv`. Environments written as batched torch code derive from :class:`TensorVecEnv`,
which implements the parts of the contract that are the same for all of them: action validation,
episode time limits, auto-reset with ``info["final_obs"]``, and episode statistics.

Shapes: ``E`` environments, observation dimension ``O``, action dimension ``A``, entropy-feature
dimension ``p``.

``step`` returns ``obs [E, O]``, ``reward [E]``, ``terminated [E]``, ``truncated [E]`` and an
``info`` dict with at least:

- ``final_obs [E, O]``: the observation reached by this step, before any reset. Equal to ``obs``
  where the episode goes on; for envs that ended it is the last observation of the episode, so a
  truncated episode can be bootstrapped with ``V(final_obs)``.
- ``features [E, p]``: the entropy features of the state reached by this step (before reset).
- ``done [E]``: ``terminated | truncated``.
- ``episode_return [E]`` and ``episode_length [E]``: the return and length of episodes that
  ended at this step (zeros elsewhere; select them with ``done``).

Besides the spaces, three attributes describe the task for evaluation, solution counting and
figures; each has a default, and the families that have one set it: ``task`` (the reward of a
family that offers several, :data:`NO_TASK` for none), ``layout`` (the map of a maze-like env,
an :class:`EnvLayout`) and ``goal_pos`` (a fixed goal position).
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, ClassVar, Protocol

import gymnasium as gym
import numpy as np
import torch

from myriad.utils.seeding import make_generator
from myriad.utils.tensors import resolve_device

StepResult = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict[str, Any]]


class EpisodeStats:
    """Return and length of each env's running episode, reported when it ends.

    Attributes:
        returns: ``[E]`` float32 return of the running episode.
        lengths: ``[E]`` int64 steps taken in the running episode.
    """

    def __init__(self, num_envs: int, device: torch.device) -> None:
        self.returns = torch.zeros(num_envs, dtype=torch.float32, device=device)
        self.lengths = torch.zeros(num_envs, dtype=torch.long, device=device)

    def clear(self, mask: torch.Tensor | None = None) -> None:
        """Restart the episodes of the envs where ``mask [E]`` is True (all by default)."""
        if mask is None:
            self.returns.zero_()
            self.lengths.zero_()
        else:
            self.returns.masked_fill_(mask, 0.0)
            self.lengths.masked_fill_(mask, 0)

    def add(self, reward: torch.Tensor) -> None:
        """Count one step that earned ``reward [E]``."""
        self.returns += reward
        self.lengths += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"returns": self.returns.cpu().clone(), "lengths": self.lengths.cpu().clone()}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.returns = state["returns"].to(self.returns.device, torch.float32).clone()
        self.lengths = state["lengths"].to(self.lengths.device, torch.long).clone()

    def finish(self, done: torch.Tensor) -> dict[str, torch.Tensor]:
        """The ``episode_return`` / ``episode_length`` info entries of a step (values where
        ``done [E]``, zeros elsewhere); the finished episodes restart."""
        entries = {
            "episode_return": torch.where(done, self.returns, 0.0),
            "episode_length": torch.where(done, self.lengths, 0),
        }
        self.clear(done)
        return entries


class ActionError(ValueError):
    """Actions passed to ``step`` have the wrong shape, device, dtype or contain NaN."""


@dataclass(frozen=True)
class FeatureSpec:
    """The state features on which entropy and coverage are measured.

    Attributes:
        names: one name per feature dimension, e.g. ``("x", "y")``.
        low, high: bounds of each feature; the features of every reachable state lie inside.
        cells: grid resolution per dimension for coverage (docs/algorithms.md §10).
        reachable: optional bool grid of shape ``cells`` (one axis per feature, in feature
            order), ``True`` for cells a state can occupy. None: every cell counts.
    """

    names: tuple[str, ...]
    low: tuple[float, ...]
    high: tuple[float, ...]
    cells: tuple[int, ...] = ()
    reachable: np.ndarray | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not (len(self.names) == len(self.low) == len(self.high)):
            raise ValueError(
                f"FeatureSpec: names, low and high need one entry per feature, got "
                f"{len(self.names)}, {len(self.low)}, {len(self.high)}"
            )
        if any(h <= lo for lo, h in zip(self.low, self.high)):
            raise ValueError(f"FeatureSpec: every high must exceed low, got {self.low} {self.high}")
        if self.cells and len(self.cells) != len(self.names):
            raise ValueError(f"FeatureSpec: cells needs one entry per feature, got {self.cells}")
        if self.reachable is not None and tuple(self.reachable.shape) != tuple(self.cells):
            raise ValueError(
                f"FeatureSpec: reachable grid has shape {self.reachable.shape}, expected "
                f"cells {self.cells} (one axis per feature, in feature order)"
            )

    @property
    def dim(self) -> int:
        return len(self.names)

    def bounds(self, device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
        """``(low [p], high [p])`` as float32 tensors on ``device``."""
        return (
            torch.tensor(self.low, dtype=torch.float32, device=device),
            torch.tensor(self.high, dtype=torch.float32, device=device),
        )

    @property
    def bounded(self) -> bool:
        """Whether every bound is finite (coverage and feature-space plots need bounds)."""
        return bool(np.isfinite([*self.low, *self.high]).all())

    def with_data_bounds(self, features: np.ndarray | torch.Tensor) -> FeatureSpec:
        """This spec with each infinite bound replaced by the range of ``features [N, p]``
        (widened where flat), for plots of features whose env declares no bounds."""
        if self.bounded:
            return self
        x = np.asarray(features.cpu() if isinstance(features, torch.Tensor) else features)
        x = x.reshape(-1, self.dim).astype(np.float64)
        lo = x.min(axis=0) if len(x) else np.zeros(self.dim)
        hi = x.max(axis=0) if len(x) else np.ones(self.dim)
        pad = np.maximum(1e-3, 0.05 * (hi - lo))
        low = [b if np.isfinite(b) else float(v) for b, v in zip(self.low, lo - pad)]
        high = [b if np.isfinite(b) else float(v) for b, v in zip(self.high, hi + pad)]
        return FeatureSpec(self.names, tuple(low), tuple(high), self.cells, self.reachable)

    def coverage(
        self,
        features: torch.Tensor,
        group: torch.Tensor | None = None,
        *,
        num_groups: int | None = None,
        reachable: torch.Tensor | None = None,
    ) -> Any:
        """Grid coverage (docs/algorithms.md §10) of ``features [N, p]`` on this spec's cells,
        counting only its reachable cells: :func:`myriad.entropy.coverage` with this spec's grid.

        Args:
            features: visited states' features ``[N, p]``.
            group: ``[N]`` member of each state, or None with ``num_groups`` (equal blocks).
            num_groups: number of members M.
            reachable: ``self.reachable`` already on ``features``' device (callers measuring
                every iteration keep one copy); None converts it.

        Returns:
            :class:`myriad.entropy.Coverage`.
        """
        from myriad.entropy.coverage import coverage

        if not self.cells:
            raise ValueError(
                f"features {self.names} have no coverage grid (cells=()); give the FeatureSpec "
                "cells to measure coverage"
            )
        if reachable is None and self.reachable is not None:
            reachable = torch.as_tensor(self.reachable, device=features.device)
        low, high = self.bounds(features.device)
        return coverage(
            features, low, high, self.cells, group, num_groups=num_groups, reachable=reachable
        )


#: The ``task`` of an env that pays no task reward (the nav envs' pretraining setting): it cannot
#: be finetuned on, and its evaluation reports no return.
NO_TASK = "none"


class EnvLayout(Protocol):
    """The map of a maze-like env, shared by the nav envs' :class:`~myriad.envs.layout.Layout`
    (unit cells from the origin) and AntMaze's :class:`~myriad.envs.mujoco.models.MazeLayout`
    (``scale``-metre cells centred on the origin). Row 0 of the text is the top of the map."""

    def walls_xy(self) -> np.ndarray:
        """Walls as a ``[W, H]`` bool grid indexed ``[ix, iy]`` (x, then y upward), one entry
        per cell: the layout drawn under a figure over the env's feature bounds."""
        ...

    def cell_center(self, row: int, col: int) -> tuple[float, float]:
        """World ``(x, y)`` of the centre of the cell at text ``(row, col)``."""
        ...


class VecEnv(abc.ABC):
    """A batch of ``num_envs`` environments stepped together on one torch device.

    Attributes:
        num_envs: number of environments ``E``.
        device: the device of every tensor going in and out.
        single_observation_space: ``gymnasium.spaces.Box`` of one observation ``[O]``.
        single_action_space: ``gymnasium.spaces.Box`` of one action ``[A]`` in ``[-1, 1]``.
        features: the entropy features and their bounds.
        max_episode_steps: episodes are truncated after this many steps.
        name: registry name of the environment (set by :func:`myriad.envs.make`).
        task: the reward of a family that offers several (nav: ``"sparse"``, ``"dense"``,
            ``"multigoal"``, or :data:`NO_TASK`); None where the env has one reward.
        layout: the map of a maze-like env (nav, AntMaze); None elsewhere.
        goal_pos: ``[d]`` a fixed goal position in world coordinates (the Shadow hand's
            target, which the renderer's camera looks at); None where there is none.
    """

    num_envs: int
    device: torch.device
    single_observation_space: gym.spaces.Box
    single_action_space: gym.spaces.Box
    features: FeatureSpec
    max_episode_steps: int
    name: str = ""
    task: str | None = None
    layout: EnvLayout | None = None
    goal_pos: torch.Tensor | None = None

    @property
    def has_task_reward(self) -> bool:
        """Whether the env pays a task reward (all but those whose ``task`` is :data:`NO_TASK`)."""
        return self.task != NO_TASK

    @abc.abstractmethod
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset every environment; returns ``obs [E, O]``. Same seed, same observations."""

    @abc.abstractmethod
    def step(self, actions: torch.Tensor) -> StepResult:
        """Advance every environment by one step with ``actions [E, A]`` in ``[-1, 1]``.

        Environments whose episode ends are reset inside ``step``; see the module docstring for
        the ``info`` keys.
        """

    @abc.abstractmethod
    def current_features(self) -> torch.Tensor:
        """Entropy features of the current states, ``[E, p]`` (after any reset)."""

    def close(self) -> None:  # noqa: B027 - optional hook, most envs hold no resources
        """Release resources (threads, simulators, remote workers)."""

    @property
    def obs_dim(self) -> int:
        return int(self.single_observation_space.shape[0])

    @property
    def action_dim(self) -> int:
        return int(self.single_action_space.shape[0])

    def describe(self) -> dict[str, Any]:
        """A plain summary of the spaces and features (used by ``myriad envs``)."""
        return {
            "name": self.name,
            "num_envs": self.num_envs,
            "device": str(self.device),
            "obs_dim": self.obs_dim,
            "action_dim": self.action_dim,
            "features": list(self.features.names),
            "feature_low": list(self.features.low),
            "feature_high": list(self.features.high),
            "max_episode_steps": self.max_episode_steps,
        }

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, num_envs={self.num_envs}, "
            f"obs_dim={self.obs_dim}, action_dim={self.action_dim}, device={self.device})"
        )


def validate_actions(
    actions: torch.Tensor, num_envs: int, action_dim: int, device: torch.device
) -> torch.Tensor:
    """Check ``actions [E, A]`` and clip them to ``[-1, 1]``.

    Out-of-range finite actions are clipped (Gaussian policies sample outside the box); wrong
    shapes, devices, dtypes and NaN are errors, because clipping those would hide a bug.
    """
    if not isinstance(actions, torch.Tensor):
        raise ActionError(
            f"actions must be a torch.Tensor of shape [{num_envs}, {action_dim}] on {device}, "
            f"got {type(actions).__name__}"
        )
    if tuple(actions.shape) != (num_envs, action_dim):
        raise ActionError(
            f"actions must have shape [{num_envs}, {action_dim}] (num_envs, action_dim), "
            f"got {list(actions.shape)}"
        )
    if actions.device != device:
        raise ActionError(f"actions are on {actions.device}, the env runs on {device}: use .to()")
    if not actions.is_floating_point():
        raise ActionError(f"actions must be floating point in [-1, 1], got dtype {actions.dtype}")
    if torch.isnan(actions).any():
        bad = torch.isnan(actions).any(dim=1).nonzero().flatten()[:8].tolist()
        raise ActionError(f"actions contain NaN (first env indices: {bad}); check the policy")
    return actions.clamp(-1.0, 1.0)


class TensorVecEnv(VecEnv):
    """Base for environments written as batched torch code.

    Subclasses set the spaces, ``features`` and ``max_episode_steps`` and implement:

    - ``_reset_envs(mask [E] bool)``: re-initialise the state of the masked envs, drawing
      randomness from ``self.generator``.
    - ``_advance(actions [E, A]) -> (reward [E], terminated [E])``: apply clipped actions.
    - ``_observe() -> obs [E, O]`` and ``_features() -> [E, p]`` of the current state.

    The base class owns time limits, auto-reset, ``final_obs`` and episode statistics.

    Args:
        num_envs: number of environments.
        device: torch device of all state.
        validate: check actions (shape, device, NaN) on every step. Costs one device sync per
            step on CUDA; disable in tuned GPU loops once the policy is known to be sane.

    Attributes:
        state_in_tensors: every piece of simulator state is a tensor attribute (or the
            ``generator``), so a checkpoint of those tensors restores the env exactly
            (:func:`myriad.rl.collector.env_state_dict`). Subclasses that keep state elsewhere
            (a physics engine's buffers) set it to False: a resumed run then resets them.
    """

    state_in_tensors: ClassVar[bool] = True

    def __init__(self, num_envs: int, device: torch.device | str = "cpu", validate: bool = True):
        if int(num_envs) < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        self.num_envs = int(num_envs)
        self.device = resolve_device(device)
        self.validate = validate
        self.generator = make_generator(0, self.device)
        self.episode = EpisodeStats(self.num_envs, self.device)
        self._all = torch.ones(self.num_envs, dtype=torch.bool, device=self.device)

    @abc.abstractmethod
    def _reset_envs(self, mask: torch.Tensor) -> None: ...

    @abc.abstractmethod
    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    @abc.abstractmethod
    def _observe(self) -> torch.Tensor: ...

    @abc.abstractmethod
    def _features(self) -> torch.Tensor: ...

    def reset(self, seed: int | None = None) -> torch.Tensor:
        if seed is not None:
            self.generator = make_generator(seed, self.device)
        self.episode.clear()
        self._reset_envs(self._all)
        return self._observe()

    def current_features(self) -> torch.Tensor:
        return self._features()

    def randomize_episode_progress(self) -> None:
        """Start each env's current episode at a random step in ``[0, max_episode_steps)``.

        Envs reset together end together; after this, the first episodes end at different
        times and the batch holds every phase of an episode (as Isaac Gym tasks do with a
        random initial ``progress_buf``). Call once after :meth:`reset`.
        """
        self.episode.lengths = torch.randint(
            0,
            self.max_episode_steps,
            (self.num_envs,),
            device=self.device,
            generator=self.generator,
        )

    def step(self, actions: torch.Tensor) -> StepResult:
        if self.validate:
            actions = validate_actions(actions, self.num_envs, self.action_dim, self.device)
        else:
            actions = actions.clamp(-1.0, 1.0)
        reward, terminated = self._advance(actions)
        self.episode.add(reward)
        truncated = (self.episode.lengths >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        final_obs = self._observe()
        features = self._features()
        info: dict[str, Any] = {
            "final_obs": final_obs,
            "features": features,
            "done": done,
            **self.episode.finish(done),
        }
        info.update(self._extra_info(done))
        # Resetting every step with a mask keeps the loop free of host syncs; envs that are not
        # done are untouched by the masked writes.
        self._reset_envs(done)
        obs = self._observe()
        return obs, reward, terminated, truncated, info

    def _extra_info(self, done: torch.Tensor) -> dict[str, Any]:
        """Env-specific info entries computed before the reset (e.g. success flags)."""
        return {}
