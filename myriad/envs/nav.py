"""Torch navigation suite: a 2-D point mass in layouts of unit cells (empty, rooms, mazes).

K-Myriad's "Empty" and "Maze" family. Everything is batched torch code on one device; walls are
solid by a swept collision test (:func:`sweep`), so no trajectory enters or crosses a wall at any
speed.

Observation ``[4]`` (``[6]`` with a goal): position scaled to ``[-1, 1]`` by the map size,
velocity scaled by ``max_speed``, and in multi-goal mode the goal position scaled like the
position. Action ``[2]`` in ``[-1, 1]``: a velocity (``control="velocity"``) or an acceleration
(``control="force"``). Entropy features: the world position ``(x, y)``.

Tasks (``task=``): ``"none"`` (no reward; pretraining), ``"sparse"`` (+1 and termination on reaching
the goal), ``"dense"`` (minus the geodesic distance to the goal, normalised, each step, plus the
sparse bonus), ``"multigoal"`` (sparse, with a goal drawn per episode from a set spread across the
maze, shown in the observation).
"""

from __future__ import annotations

import math
from typing import Any

import gymnasium as gym
import numpy as np
import torch

from myriad.envs.base import FeatureSpec, TensorVecEnv
from myriad.envs.layout import Layout
from myriad.envs.registry import register

TASKS = ("none", "sparse", "dense", "multigoal")
CONTROLS = ("velocity", "force")
# Largest displacement per axis within one collision substep, in cells; below 1 so a substep
# crosses at most one cell boundary per axis.
_MAX_SUBSTEP = 0.9
_WALL_GAP = 1e-4


def sweep(
    pos: torch.Tensor, delta: torch.Tensor, walls: torch.Tensor, gap: float = _WALL_GAP
) -> tuple[torch.Tensor, torch.Tensor]:
    """Move points by ``delta`` through a grid of unit wall cells, stopping at walls.

    Exact swept test of the segment ``pos -> pos + delta`` against the grid for displacements
    below one cell per axis: the segment crosses at most one x boundary and one y boundary, so
    the cells it visits are known in closed form from the order of the two crossings. A blocked
    axis stops ``gap`` short of the wall face; the other axis keeps moving (sliding along the
    wall). Passing exactly through a corner is blocked if any of the three cells beyond is a wall.

    Args:
        pos: ``[E, 2]`` positions inside free cells.
        delta: ``[E, 2]`` displacements with ``|delta| < 1`` per axis.
        walls: ``[W, H]`` bool, indexed ``[ix, iy]``; the border must be walls.
        gap: distance kept from a wall face.

    Returns:
        ``(new_pos [E, 2], blocked [E, 2] bool)``.
    """
    height = walls.shape[1]
    flat = walls.reshape(-1)
    cell = pos.floor()
    cell_idx = cell.long()
    step_dir = torch.sign(delta)
    boundary = cell + (step_dir > 0).to(pos.dtype)
    target = pos + delta
    moving = step_dir != 0
    cross = moving & torch.where(step_dir > 0, target >= boundary, target < boundary)
    safe_delta = torch.where(moving, delta, torch.ones_like(delta))
    t_cross = torch.where(cross, (boundary - pos) / safe_delta, torch.full_like(pos, math.inf))
    neighbour = cell_idx + step_dir.long()

    col_n, row_n = neighbour[:, 0] * height, neighbour[:, 1]
    wall_x = torch.take(flat, col_n + cell_idx[:, 1])
    wall_y = torch.take(flat, cell_idx[:, 0] * height + row_n)
    wall_xy = torch.take(flat, col_n + row_n)
    cross_x, cross_y = cross[:, 0], cross[:, 1]
    t_x, t_y = t_cross[:, 0], t_cross[:, 1]
    both = cross_x & cross_y
    x_first, y_first = t_x < t_y, t_y < t_x
    # Crossing x second means moving along the row reached after the y crossing: that row is
    # the wall-free neighbour row unless y was blocked, in which case it is the current row.
    x_blocked_late = torch.where(wall_y, wall_x, wall_xy)
    y_blocked_late = torch.where(wall_x, wall_y, wall_xy)
    block_x = cross_x & torch.where(
        both,
        torch.where(x_first, wall_x, torch.where(y_first, x_blocked_late, wall_x | wall_xy)),
        wall_x,
    )
    block_y = cross_y & torch.where(
        both,
        torch.where(y_first, wall_y, torch.where(x_first, y_blocked_late, wall_y | wall_xy)),
        wall_y,
    )
    blocked = torch.stack((block_x, block_y), dim=1)
    stop = boundary - step_dir * gap
    return torch.where(blocked, stop, target), blocked


def spread_goal_cells(layout: Layout, count: int) -> list[tuple[int, int]]:
    """``count`` reachable cells spread over the map by farthest-point sampling on geodesic
    distance, starting from the cell farthest from the start. Deterministic."""
    start = layout.starts[0]
    dist_start = layout.distances_from(start)
    first = np.unravel_index(int(np.argmax(dist_start)), dist_start.shape)
    chosen = [(int(first[0]), int(first[1]))]
    nearest = layout.distances_from(chosen[0]).astype(np.float64)
    nearest[~layout.reachable] = -np.inf
    while len(chosen) < min(count, int(layout.reachable.sum())):
        nxt = np.unravel_index(int(np.argmax(nearest)), nearest.shape)
        chosen.append((int(nxt[0]), int(nxt[1])))
        d = layout.distances_from(chosen[-1]).astype(np.float64)
        nearest = np.minimum(nearest, np.where(layout.reachable, d, np.inf))
    return chosen


class PointNavEnv(TensorVecEnv):
    """A point mass in a layout of unit cells; see the module docstring.

    Args:
        num_envs: number of environments.
        device: torch device.
        layout: built-in layout name, map file path, or map text.
        control: ``"velocity"`` (action sets the velocity) or ``"force"`` (action accelerates a
            damped point mass).
        max_speed: largest speed per axis, in cells per step.
        accel: acceleration per unit action, cells per step^2 (force control).
        damping: fraction of velocity lost each step (force control).
        task: ``"none" | "sparse" | "dense" | "multigoal"``.
        goal: ``(x, y)`` world position of the goal; default the centre of the map's ``G`` cell,
            or the reachable cell farthest from the start.
        goal_radius: the goal is reached within this distance.
        num_goals: size of the spread goal set in multi-goal mode.
        goals: explicit ``[(x, y), ...]`` goal set for multi-goal mode.
        max_episode_steps: time limit.
        start_noise: starts are uniform in a square of this half-width around start-cell centres.
        validate: check actions every step (see :class:`TensorVecEnv`).
    """

    # The VecEnv attributes, always set: the map, and the task (``"none"``: no reward).
    layout: Layout
    task: str

    def __init__(
        self,
        num_envs: int,
        device: torch.device | str = "cpu",
        layout: str = "maze",
        control: str = "velocity",
        max_speed: float = 0.5,
        accel: float = 0.25,
        damping: float = 0.1,
        task: str = "none",
        goal: tuple[float, float] | None = None,
        goal_radius: float = 0.5,
        num_goals: int = 8,
        goals: list[tuple[float, float]] | None = None,
        max_episode_steps: int = 200,
        start_noise: float = 0.4,
        validate: bool = True,
    ) -> None:
        super().__init__(num_envs, device, validate)
        if task not in TASKS:
            raise ValueError(f"unknown task {task!r}; choose one of {TASKS}")
        if control not in CONTROLS:
            raise ValueError(f"unknown control {control!r}; choose one of {CONTROLS}")
        if max_speed <= 0 or not 0 <= damping < 1 or goal_radius <= 0 or max_episode_steps < 1:
            raise ValueError(
                "need max_speed > 0, 0 <= damping < 1, goal_radius > 0, max_episode_steps >= 1; "
                f"got {max_speed}, {damping}, {goal_radius}, {max_episode_steps}"
            )
        if not 0 <= start_noise < 0.5:
            raise ValueError(
                f"start_noise must be in [0, 0.5) to stay in the cell, got {start_noise}"
            )
        self.layout = Layout.load(layout)
        self.task, self.control = task, control
        self.max_speed, self.accel, self.damping = float(max_speed), float(accel), float(damping)
        self.goal_radius = float(goal_radius)
        self.max_episode_steps = int(max_episode_steps)
        self.start_noise = float(start_noise)
        self.substeps = max(1, math.ceil(self.max_speed / _MAX_SUBSTEP))

        dev = self.device
        lay = self.layout
        self.size = torch.tensor([lay.width, lay.height], dtype=torch.float32, device=dev)
        self.walls = torch.as_tensor(lay.walls_xy(), device=dev)
        self.start_centers = torch.tensor(
            [lay.cell_center(r, c) for r, c in lay.starts], dtype=torch.float32, device=dev
        )
        self.goal_set = self._goal_set(goal, goals, num_goals).to(dev)  # [G, 2]
        self.goal_distance = self._geodesic_tables()  # [G, W*H]
        self.goal_in_obs = task == "multigoal"

        obs_dim = 6 if self.goal_in_obs else 4
        self.single_observation_space = gym.spaces.Box(-1.0, 1.0, (obs_dim,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
        self.features = FeatureSpec(
            names=("x", "y"),
            low=(0.0, 0.0),
            high=(float(lay.width), float(lay.height)),
            cells=(lay.width, lay.height),
            reachable=lay.reachable_xy(),
        )
        self.pos = torch.zeros(num_envs, 2, device=dev)
        self.vel = torch.zeros(num_envs, 2, device=dev)
        self.goal_index = torch.zeros(num_envs, dtype=torch.long, device=dev)
        self.reached = torch.zeros(num_envs, dtype=torch.bool, device=dev)
        self._zeros = torch.zeros(num_envs, device=dev)
        self._never = torch.zeros(num_envs, dtype=torch.bool, device=dev)

    # -- set-up ------------------------------------------------------------------------------
    def _goal_set(
        self,
        goal: tuple[float, float] | None,
        goals: list[tuple[float, float]] | None,
        num_goals: int,
    ) -> torch.Tensor:
        lay = self.layout
        if self.task == "multigoal":
            if goals is not None:
                points = [tuple(map(float, g)) for g in goals]
            else:
                points = [lay.cell_center(r, c) for r, c in spread_goal_cells(lay, num_goals)]
        elif goal is not None:
            points = [tuple(map(float, goal))]
        elif lay.goals:
            points = [lay.cell_center(*lay.goals[0])]
        else:
            dist = lay.distances_from(lay.starts[0])
            r, c = np.unravel_index(int(np.argmax(dist)), dist.shape)
            points = [lay.cell_center(int(r), int(c))]
        for x, y in points:
            ix, iy = math.floor(x), math.floor(y)
            inside = 0 <= ix < lay.width and 0 <= iy < lay.height
            if not inside or not lay.reachable_xy()[ix, iy]:
                raise ValueError(
                    f"goal ({x}, {y}) of layout {lay.name!r} is not in a reachable floor cell"
                )
        return torch.tensor(points, dtype=torch.float32)

    def _geodesic_tables(self) -> torch.Tensor:
        """Geodesic cell distance from every cell to each goal cell, flattened ``[G, W*H]``."""
        lay = self.layout
        tables = []
        for x, y in self.goal_set.tolist():
            row, col = lay.height - 1 - math.floor(y), math.floor(x)
            dist = lay.distances_from((row, col)).astype(np.float32)
            dist[dist < 0] = 0.0  # unreachable cells are never occupied
            tables.append(np.ascontiguousarray(dist[::-1].T).reshape(-1))
        table = torch.as_tensor(np.stack(tables), device=self.device)
        self.distance_scale = float(max(table.max().item(), 1.0))
        return table

    # -- TensorVecEnv hooks --------------------------------------------------------------------
    def _reset_envs(self, mask: torch.Tensor) -> None:
        # On CPU the check is free and skips three random draws on most steps; on CUDA it would
        # cost a device sync per step, so the masked writes run unconditionally there.
        if self.device.type == "cpu" and not bool(mask.any()):
            return
        n, dev, gen = self.num_envs, self.device, self.generator
        which = torch.randint(0, len(self.start_centers), (n,), device=dev, generator=gen)
        noise = (torch.rand(n, 2, device=dev, generator=gen) * 2 - 1) * self.start_noise
        start = self.start_centers[which] + noise
        goal_index = torch.randint(0, len(self.goal_set), (n,), device=dev, generator=gen)
        m = mask.unsqueeze(1)
        self.pos = torch.where(m, start, self.pos)
        self.vel = torch.where(m, torch.zeros_like(self.vel), self.vel)
        self.goal_index = torch.where(mask, goal_index, self.goal_index)

    def _advance(self, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.control == "velocity":
            vel = actions * self.max_speed
        else:
            vel = (self.vel * (1.0 - self.damping) + actions * self.accel).clamp(
                -self.max_speed, self.max_speed
            )
        sub = vel / self.substeps
        pos = self.pos
        for _ in range(self.substeps):  # static count from max_speed, not a loop over envs
            pos, blocked = sweep(pos, sub, self.walls)
            sub = torch.where(blocked, torch.zeros_like(sub), sub)
            vel = torch.where(blocked, torch.zeros_like(vel), vel)
        self.pos, self.vel = pos, vel

        if self.task == "none":
            return self._zeros, self._never
        reward, self.reached = self.task_reward(pos, self.goal_index)
        return reward, self.reached.clone()

    def task_reward(
        self, pos: torch.Tensor, goal_index: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The task reward of arriving at ``pos [N, 2]`` with goals ``goal_index [N]`` (into
        :attr:`goal_set`), and whether the goal is reached, ``[N]`` each: the env steps with it,
        and :mod:`myriad.datasets.relabel` recomputes datasets' rewards with it.

        ``"sparse"`` and ``"multigoal"``: 1 within ``goal_radius`` of the goal, else 0;
        ``"dense"`` adds minus the geodesic cell distance to the goal over its largest value.
        """
        reached = (pos - self.goal_set[goal_index]).square().sum(dim=1) <= self.goal_radius**2
        reward = reached.float()
        if self.task == "dense":
            reward = reward - self.geodesic_to_goal(pos, goal_index) / self.distance_scale
        return reward, reached

    def geodesic_to_goal(self, pos: torch.Tensor, goal_index: torch.Tensor) -> torch.Tensor:
        """Geodesic distance in cells ``[N]`` (float) from the cell of each position
        ``pos [N, 2]`` to the cell of its goal ``goal_index [N]`` (into :attr:`goal_set`):
        0 in the goal's cell, the number of cell moves (4-connected) around walls otherwise."""
        cell = pos.floor().long()
        flat = cell[:, 0] * self.layout.height + cell[:, 1]
        return self.goal_distance[goal_index, flat]

    def _observe(self) -> torch.Tensor:
        parts = [self.pos / self.size * 2 - 1, self.vel / self.max_speed]
        if self.goal_in_obs:
            parts.append(self.goal_set[self.goal_index] / self.size * 2 - 1)
        return torch.cat(parts, dim=1)

    def positions(self, observations: torch.Tensor) -> torch.Tensor:
        """World positions ``[N, 2]`` of observations ``[N, O]`` (undoes their scaling)."""
        return (observations[:, :2] + 1) / 2 * self.size

    def _features(self) -> torch.Tensor:
        return self.pos.clone()

    def _extra_info(self, done: torch.Tensor) -> dict[str, Any]:
        return {"success": self.reached & done, "goal": self.goal_set[self.goal_index]}


_LAYOUT_DEFAULTS = {
    "nav-empty": ("empty", 100, "open room, start in the centre"),
    "nav-two-rooms": ("two_rooms", 200, "two rooms joined by a door"),
    "nav-four-rooms": ("four_rooms", 200, "Sutton's four rooms"),
    "nav-u-maze": ("u_maze", 100, "a small U-shaped corridor"),
    "nav-maze": ("maze", 400, "an 8 x 8-cell maze (17 x 17 map), goal in the far corner"),
    "nav-three-routes": ("three_routes", 200, "three corridors of 24 cells from start to goal"),
    "nav-big-maze": (
        "big_maze",
        600,
        "a 12 x 12-cell maze (25 x 25 map), goal 168 cells away in the far corner, many dead ends",
    ),
}
for _name, (_layout, _steps, _desc) in _LAYOUT_DEFAULTS.items():
    register(
        _name,
        PointNavEnv,
        description=f"point mass: {_desc}",
        family="nav",
        layout=_layout,
        max_episode_steps=_steps,
    )
register(
    "nav",
    PointNavEnv,
    description="point mass in any layout (option layout=NAME|PATH|MAP_TEXT)",
    family="nav",
)
