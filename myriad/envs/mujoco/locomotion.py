"""Ant, HalfCheetah and Humanoid with Gymnasium v5 semantics, and the Ant maze.

Observation layout, reward terms, termination and reset distribution follow Gymnasium's ``Ant-v5``,
``HalfCheetah-v5`` and ``Humanoid-v5`` with their default arguments, including the quantities
Gymnasium reads after ``mj_step`` (e.g. Ant's forward velocity from the torso ``xpos`` and
Humanoid's from the mass centre of ``xipos``), so rewards compare with published numbers when
``model="gymnasium"``. Actions in ``[-1, 1]`` are mapped linearly to the actuators' control range
(Humanoid: ``[-0.4, 0.4]``); control costs are computed on the applied controls, as Gymnasium does.
"""

from __future__ import annotations

import abc
import functools
from typing import ClassVar

import numpy as np
import torch

from myriad.envs.base import FeatureSpec
from myriad.envs.mujoco.base import MujocoVecEnv
from myriad.envs.mujoco.models import MEDIUM_MAZE, U_MAZE, MazeLayout, locomotion_model


def _wrap_angle(a: torch.Tensor) -> torch.Tensor:
    return torch.atan2(torch.sin(a), torch.cos(a))


def _xy_box(bound: float) -> FeatureSpec:
    """Torso x-y features in ``[-bound, bound]^2`` on a grid of about half-metre cells."""
    b = float(bound)
    cells = max(2, round(2 * b))
    return FeatureSpec(("x", "y"), (-b, -b), (b, b), (cells, cells))


def _uniform_qpos_normal_qvel(env: MujocoVecEnv, noise: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Gymnasium's Ant / HalfCheetah reset: ``qpos0 + U(-noise, noise)``, ``noise * N(0, 1)``
    velocities, ``[E, nq]`` and ``[E, nv]``."""
    nq, nv = env.mj_model.nq, env.mj_model.nv
    qpos = env.qpos0 + env.uniform((env.num_envs, nq), -noise, noise)
    return qpos, noise * env.normal((env.num_envs, nv))


class _ForwardVelocityEnv(MujocoVecEnv):
    """A task rewarded for moving forward, with Gymnasium v5's velocity: the change of a tracked
    position (torso, root or mass centre, :meth:`_tracked_position`) over one control step
    divided by ``dt``, from the positions after ``mj_step``. Subclasses call
    :meth:`_init_velocity` once before their first reset."""

    @abc.abstractmethod
    def _tracked_position(self) -> torch.Tensor:
        """The position whose velocity is rewarded, ``[E, d]``."""

    def _init_velocity(self) -> None:
        self._position_before = torch.zeros_like(self._tracked_position())

    def _on_reset(self, mask: torch.Tensor) -> None:
        self._position_before = torch.where(
            mask.view(-1, 1), self._tracked_position(), self._position_before
        )

    def _velocity(self) -> torch.Tensor:
        """``[E, d]`` since the previous call (or reset)."""
        # A copy: the backend's fields are views that the next step overwrites.
        position = self._tracked_position().clone()
        velocity = (position - self._position_before) / self.dt
        self._position_before = position
        return velocity


class AntEnv(_ForwardVelocityEnv):
    """Gymnasium ``Ant-v5``: 105-dim observation ``[qpos[2:] (13), qvel (14), clip(cfrc_ext[1:],
    -1, 1) (78)]``; reward ``x_velocity + 1 * healthy - 0.5 |a|^2 - 5e-4 |clip(cfrc_ext)|^2``;
    terminated when the torso height leaves ``[0.2, 1.0]``.

    Entropy features: torso ``(x, y)`` clipped to ``[-xy_bound, xy_bound]``.

    Args:
        model: ``"gymnasium"`` (Gymnasium's MJCF) or ``"fast"`` (see :mod:`.models`).
        backend: ``"mujoco"`` or ``"warp"``.
        max_episode_steps: time limit (Gymnasium: 1000).
        xy_bound: half width of the feature box in metres.
        num_workers: CPU backend worker processes (default: one per core from 64 envs).
    """

    forward_weight = 1.0
    ctrl_cost_weight = 0.5
    contact_cost_weight = 5e-4
    healthy_reward = 1.0
    healthy_z = (0.2, 1.0)
    reset_noise = 0.1
    # Simulator fields read by the task (cfrc_ext costs an mj_rnePostConstraint per step).
    _fields: tuple[str, ...] = ("xpos", "cfrc_ext")

    def __init__(
        self,
        num_envs: int = 1,
        device: torch.device | str = "cpu",
        model: str = "gymnasium",
        backend: str = "mujoco",
        max_episode_steps: int = 1000,
        xy_bound: float = 20.0,
        num_workers: int | None = None,
        validate: bool = True,
        healthy_reward: float = 1.0,
    ):
        self.model_name = model
        # Gymnasium's Ant-v5 argument of the same name: the per-step reward for staying upright.
        self.healthy_reward = float(healthy_reward)
        mj_model = locomotion_model("ant", model, maze=self._maze())
        super().__init__(
            num_envs,
            device,
            mj_model,
            5,
            self._obs_dim(mj_model),
            self._fields,
            backend,
            num_workers,
            nconmax=32,
            njmax=192,
            validate=validate,
            max_episode_steps=max_episode_steps,
            features=self._feature_spec(xy_bound),
        )
        self._init_velocity()
        self.reset(0)

    # Maze subclasses override these three.
    def _maze(self) -> MazeLayout | None:
        return None

    def _obs_dim(self, mj_model) -> int:
        return (mj_model.nq - 2) + mj_model.nv + (mj_model.nbody - 1) * 6

    def _feature_spec(self, xy_bound: float) -> FeatureSpec:
        return _xy_box(xy_bound)

    def _tracked_position(self) -> torch.Tensor:
        return self.sim.field("xpos")[:, 1, :2]  # the torso's x-y

    def _sample_reset(self) -> tuple[torch.Tensor, torch.Tensor]:
        return _uniform_qpos_normal_qvel(self, self.reset_noise)

    def _contact_forces(self) -> torch.Tensor:
        return self.sim.field("cfrc_ext").clamp(-1.0, 1.0)

    def _healthy(self) -> torch.Tensor:
        # Gymnasium's "state is finite" term: the step's instability flag already holds it.
        z = self.sim.field("qpos")[:, 2]
        return ~self._unstable & (z >= self.healthy_z[0]) & (z <= self.healthy_z[1])

    def _task_step(
        self, actions: torch.Tensor, ctrl: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        velocity = self._velocity()
        healthy = self._healthy()
        ctrl_cost = self.ctrl_cost_weight * ctrl.square().sum(dim=1)
        contact_cost = self.contact_cost_weight * self._contact_forces().square().sum(dim=(1, 2))
        reward = (
            self.forward_weight * velocity[:, 0]
            + self.healthy_reward * healthy
            - ctrl_cost
            - contact_cost
        )
        return reward, ~healthy

    def _task_obs(self) -> torch.Tensor:
        qpos, qvel = self.sim.field("qpos"), self.sim.field("qvel")
        forces = self._contact_forces()[:, 1:].flatten(1)
        return torch.cat([qpos[:, 2:], qvel, forces], dim=1)

    def _task_features(self) -> torch.Tensor:
        return self.clip_features(self.sim.field("qpos")[:, :2])


class HalfCheetahEnv(_ForwardVelocityEnv):
    """Gymnasium ``HalfCheetah-v5``: 17-dim observation ``[qpos[1:] (8), qvel (9)]``; reward
    ``x_velocity - 0.1 |a|^2``; never terminates (1000-step time limit).

    Entropy features: ``(x, pitch)``: the root's x position clipped to ``[-x_bound, x_bound]``
    and the torso pitch wrapped to ``[-pi, pi]`` (flips and handstands are distinct states).
    """

    forward_weight = 1.0
    ctrl_cost_weight = 0.1
    reset_noise = 0.1

    def __init__(
        self,
        num_envs: int = 1,
        device: torch.device | str = "cpu",
        model: str = "gymnasium",
        backend: str = "mujoco",
        max_episode_steps: int = 1000,
        x_bound: float = 30.0,
        num_workers: int | None = None,
        validate: bool = True,
    ):
        self.model_name = model
        mj_model = locomotion_model("halfcheetah", model)
        b = float(x_bound)
        features = FeatureSpec(
            ("x", "pitch"), (-b, -torch.pi), (b, torch.pi), (max(2, round(2 * b)), 16)
        )
        super().__init__(
            num_envs,
            device,
            mj_model,
            5,
            mj_model.nq - 1 + mj_model.nv,
            (),
            backend,
            num_workers,
            nconmax=32,
            njmax=160,
            validate=validate,
            max_episode_steps=max_episode_steps,
            features=features,
        )
        self._init_velocity()
        self.reset(0)

    def _sample_reset(self) -> tuple[torch.Tensor, torch.Tensor]:
        return _uniform_qpos_normal_qvel(self, self.reset_noise)

    def _tracked_position(self) -> torch.Tensor:
        return self.sim.field("qpos")[:, :1]  # the root's x

    def _task_step(
        self, actions: torch.Tensor, ctrl: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        velocity = self._velocity()[:, 0]
        reward = self.forward_weight * velocity - self.ctrl_cost_weight * ctrl.square().sum(dim=1)
        return reward, torch.zeros_like(reward, dtype=torch.bool)

    def _task_obs(self) -> torch.Tensor:
        return torch.cat([self.sim.field("qpos")[:, 1:], self.sim.field("qvel")], dim=1)

    def _task_features(self) -> torch.Tensor:
        qpos = self.sim.field("qpos")
        feats = torch.stack([qpos[:, 0], _wrap_angle(qpos[:, 2])], dim=1)
        return self.clip_features(feats)


class HumanoidEnv(_ForwardVelocityEnv):
    """Gymnasium ``Humanoid-v5``: 348-dim observation ``[qpos[2:] (22), qvel (23), cinert[1:]
    (130), cvel[1:] (78), qfrc_actuator[6:] (17), cfrc_ext[1:] (78)]``; reward ``1.25 *
    x_velocity(mass centre) + 5 * healthy - 0.1 |ctrl|^2 - min(5e-7 |cfrc_ext|^2, 10)``;
    terminated when the torso height leaves ``(1.0, 2.0)``.

    Entropy features: torso ``(x, y)`` clipped to ``[-xy_bound, xy_bound]``.

    MuJoCo Warp has no PGS solver: with ``backend="warp"`` the ``"gymnasium"`` model runs with
    Newton (same iteration count), the only setting that differs from Gymnasium's MJCF.
    """

    forward_weight = 1.25
    ctrl_cost_weight = 0.1
    contact_cost_weight = 5e-7
    contact_cost_max = 10.0
    healthy_reward = 5.0
    healthy_z = (1.0, 2.0)
    reset_noise = 1e-2

    def __init__(
        self,
        num_envs: int = 1,
        device: torch.device | str = "cpu",
        model: str = "gymnasium",
        backend: str = "mujoco",
        max_episode_steps: int = 1000,
        xy_bound: float = 15.0,
        num_workers: int | None = None,
        validate: bool = True,
    ):
        self.model_name = model
        mj_model = locomotion_model("humanoid", model)
        if backend == "warp":
            import mujoco

            mj_model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
        nb = mj_model.nbody - 1
        obs_dim = (mj_model.nq - 2) + mj_model.nv + nb * 10 + nb * 6 + (mj_model.nv - 6) + nb * 6
        super().__init__(
            num_envs,
            device,
            mj_model,
            5,
            obs_dim,
            ("xipos", "cinert", "cvel", "qfrc_actuator", "cfrc_ext"),
            backend,
            num_workers,
            nconmax=64,
            njmax=384,
            validate=validate,
            max_episode_steps=max_episode_steps,
            features=_xy_box(xy_bound),
        )
        mass = torch.as_tensor(mj_model.body_mass, dtype=self.sim.dtype, device=self.device)
        self._mass = mass / mass.sum()
        self._init_velocity()
        self.reset(0)

    def _tracked_position(self) -> torch.Tensor:
        # The mass centre's x-y.
        return torch.einsum("b,ebj->ej", self._mass, self.sim.field("xipos"))[:, :2]

    def _sample_reset(self) -> tuple[torch.Tensor, torch.Tensor]:
        nq, nv, s = self.mj_model.nq, self.mj_model.nv, self.reset_noise
        qpos = self.qpos0 + self.uniform((self.num_envs, nq), -s, s)
        qvel = self.uniform((self.num_envs, nv), -s, s)
        return qpos, qvel

    def _task_step(
        self, actions: torch.Tensor, ctrl: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        velocity = self._velocity()
        z = self.sim.field("qpos")[:, 2]
        healthy = (z > self.healthy_z[0]) & (z < self.healthy_z[1])
        ctrl_cost = self.ctrl_cost_weight * ctrl.square().sum(dim=1)
        contact = self.contact_cost_weight * self.sim.field("cfrc_ext").square().sum(dim=(1, 2))
        reward = (
            self.forward_weight * velocity[:, 0]
            + self.healthy_reward * healthy
            - ctrl_cost
            - contact.clamp(max=self.contact_cost_max)
        )
        return reward, ~healthy

    def _task_obs(self) -> torch.Tensor:
        f = self.sim.field
        return torch.cat(
            [
                f("qpos")[:, 2:],
                f("qvel"),
                f("cinert")[:, 1:].flatten(1),
                f("cvel")[:, 1:].flatten(1),
                f("qfrc_actuator")[:, 6:],
                f("cfrc_ext")[:, 1:].flatten(1),
            ],
            dim=1,
        )

    def _task_features(self) -> torch.Tensor:
        return self.clip_features(self.sim.field("qpos")[:, :2])


class AntMazeEnv(AntEnv):
    """Ant in a walled maze (Gymnasium-Robotics layouts, 4 m cells), for exploration and a
    sparse-reward goal.

    Observation (31): ``[x, y, qpos[2:] (13), qvel (14), goal_x - x, goal_y - y]``. The torso
    position is observed, unlike Gymnasium-Robotics' AntMaze, because the exploration objective
    is defined on it. Reward: ``1`` when the torso is within ``goal_radius`` of the goal cell's
    centre (the episode then terminates), else ``0``. The ant never terminates for falling over.
    Reset: the start cell's centre with uniform noise of ``0.25 * scale`` per axis, Ant's joint
    noise.

    Entropy features: torso ``(x, y)`` in the maze's extent; the coverage grid has
    ``sub x sub`` cells per maze cell and ``features.reachable`` marks the free ones.

    The goal API of the nav suite (:class:`myriad.envs.nav.PointNavEnv`) is shared, so that
    :mod:`myriad.datasets.relabel` recomputes a dataset's rewards for any goal: :attr:`pos`,
    :meth:`positions`, :meth:`task_reward`, :meth:`geodesic_to_goal` (in maze cells) and
    :meth:`observations_for_goal`.

    Args:
        maze: ``"u"`` (5 x 5 U-maze) or ``"medium"`` (8 x 8).
        max_episode_steps: time limit (Gymnasium-Robotics: 700 in the U-maze, 1000 in the
            medium maze, as registered).
        goal_radius: success distance in metres (Gymnasium-Robotics: 0.45).
        cells_per_maze_cell: coverage grid resolution per maze cell.
        goal: ``(x, y)`` of the goal in metres, in a free cell (default: the centre of the
            layout's ``g`` cell).
        task: ``"sparse"``, the only reward (the option exists so that relabelling passes the
            same options to every goal env; the ``task`` attribute stays None, as for any env
            with one reward).
    """

    _MAZES: ClassVar[dict[str, MazeLayout]] = {"u": U_MAZE, "medium": MEDIUM_MAZE}
    layout: MazeLayout  # the VecEnv attribute: the maze's walls and cells
    _fields = ("xpos",)

    def __init__(
        self,
        num_envs: int = 1,
        device: torch.device | str = "cpu",
        maze: str = "u",
        model: str = "fast",
        backend: str = "mujoco",
        max_episode_steps: int = 700,
        goal_radius: float = 0.45,
        cells_per_maze_cell: int = 4,
        num_workers: int | None = None,
        validate: bool = True,
        goal: tuple[float, float] | None = None,
        task: str = "sparse",
    ):
        if maze not in self._MAZES:
            raise ValueError(f"maze must be one of {sorted(self._MAZES)}, got {maze!r}")
        if task != "sparse":
            raise ValueError(f"the Ant mazes have one task, 'sparse'; got {task!r}")
        self.layout = self._MAZES[maze]
        self.goal_radius = float(goal_radius)
        self.sub = int(cells_per_maze_cell)
        (start,) = self.layout.cells_with("r")
        self._start_xy = self.layout.cell_center(*start)
        if goal is None:
            (cell,) = self.layout.cells_with("g")
            self._goal_xy_host = self.layout.cell_center(*cell)
        else:
            self._goal_xy_host = (float(goal[0]), float(goal[1]))
            found = self.layout.cell_of(*self._goal_xy_host)
            if found is None:
                raise ValueError(
                    f"goal {tuple(goal)} is not in a free cell of the maze; pick (x, y) in "
                    f"metres inside a free cell (free cell centres: "
                    f"{[self.layout.cell_center(*c) for c in self.layout.free_cells()]})"
                )
            cell = found
        self._goal_cell = cell
        super().__init__(
            num_envs, device, model, backend, max_episode_steps, 1.0, num_workers, validate
        )

    def _maze(self) -> MazeLayout | None:
        return self.layout

    def _obs_dim(self, mj_model) -> int:
        return 2 + (mj_model.nq - 2) + mj_model.nv + 2

    def _feature_spec(self, xy_bound: float) -> FeatureSpec:
        hx, hy = self.layout.extent
        n_rows, n_cols = self.layout.shape
        return FeatureSpec(
            ("x", "y"),
            (-hx, -hy),
            (hx, hy),
            (n_cols * self.sub, n_rows * self.sub),
            reachable=self.layout.free_grid(self.sub),
        )

    @functools.cached_property
    def goal_xy(self) -> torch.Tensor:
        """Goal position ``[2]`` (built once: it is read several times per step)."""
        return torch.as_tensor(self._goal_xy_host, dtype=self.sim.dtype, device=self.device)

    @functools.cached_property
    def _start(self) -> torch.Tensor:
        return torch.as_tensor(self._start_xy, dtype=self.sim.dtype, device=self.device)

    def _sample_reset(self) -> tuple[torch.Tensor, torch.Tensor]:
        qpos, qvel = super()._sample_reset()
        noise = 0.25 * self.layout.scale
        qpos[:, :2] = self._start + self.uniform((self.num_envs, 2), -noise, noise)
        return qpos, qvel

    def _task_step(
        self, actions: torch.Tensor, ctrl: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        reward, self._reached = self.task_reward(self.sim.field("qpos")[:, :2])
        return reward, self._reached

    def _task_obs(self) -> torch.Tensor:
        qpos, qvel = self.sim.field("qpos"), self.sim.field("qvel")
        xy = qpos[:, :2]
        return torch.cat([xy, qpos[:, 2:], qvel, self.goal_xy - xy], dim=1)

    # -- the goal API shared with the nav suite (relabelling, goal-reaching evaluation) ----------
    @property
    def pos(self) -> torch.Tensor:
        """Torso positions ``[E, 2]`` in metres."""
        return self.sim.field("qpos")[:, :2]

    def positions(self, observations: torch.Tensor) -> torch.Tensor:
        """Torso positions ``[N, 2]`` of observations ``[N, 31]``."""
        return observations[:, :2]

    def task_reward(
        self, pos: torch.Tensor, goal_index: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The reward of arriving at ``pos [N, 2]`` and whether the goal is reached, ``[N]``
        each: 1 within :attr:`goal_radius` of the goal, else 0 (``goal_index``: the nav suite's
        signature; an Ant maze has one goal)."""
        goal = self.goal_xy.to(device=pos.device, dtype=pos.dtype)
        reached = (pos - goal).norm(dim=1) <= self.goal_radius
        return reached.to(pos.dtype), reached

    def geodesic_to_goal(
        self, pos: torch.Tensor, goal_index: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Geodesic distance in maze cells ``[N]`` (float) from the cell of each position
        ``pos [N, 2]`` to the goal's cell (4-connected moves around walls; ``inf`` for a
        position outside the free cells)."""
        table = torch.as_tensor(self._goal_distance, dtype=torch.float32)
        rows, cols = self.layout.cells_of(pos.detach().cpu().double().numpy())
        inside = torch.as_tensor(rows >= 0)
        out = torch.full((len(pos),), float("inf"))
        out[inside] = table[torch.as_tensor(rows[rows >= 0]), torch.as_tensor(cols[rows >= 0])]
        return out.to(pos.device)

    @functools.cached_property
    def _goal_distance(self) -> np.ndarray:
        """Geodesic distance ``[n_rows, n_cols]`` from the goal's cell to every cell."""
        return self.layout.distances_from(self._goal_cell)

    def observations_for_goal(self, observations: torch.Tensor) -> torch.Tensor:
        """``observations [N, 31]`` as this env's goal would give them (the goal offset, the
        last two entries, recomputed from the torso position)."""
        goal = self.goal_xy.to(device=observations.device, dtype=observations.dtype)
        return torch.cat([observations[:, :-2], goal - observations[:, :2]], dim=1)

    def _extra_info(self, done: torch.Tensor) -> dict:
        info = super()._extra_info(done)
        info["success"] = self._reached.clone()  # this step's goal test, before any reset
        return info
