"""MuJoCo models: Gymnasium's MJCF files, their fast variants, Ant mazes and the Shadow hand.

Two physics settings are offered for every robot, because the solver settings dominate the cost
of a step in every engine (CPU MuJoCo, MuJoCo Warp, MJX alike):

- ``"gymnasium"``: the MJCF shipped with Gymnasium, unchanged (Ant: RK4, Newton with 100
  iterations, every body part collides with the floor; Humanoid: RK4, PGS with 50 iterations).
  Results compare with published Gymnasium v5 numbers.
- ``"fast"``: the same bodies, joints, actuators and time step with Brax/MJX-style solver settings:
  semi-implicit Euler, Newton with 4 iterations and 8 line-search iterations, and contacts between
  the feet and the floor only (Ant, Humanoid). Observations and rewards
  are computed by the same task code, so a policy's interface is identical; its returns are not
  comparable with Gymnasium's.

Model files come from installed packages only (Gymnasium for the locomotion robots,
Gymnasium-Robotics for the Shadow hand); nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
import warnings
from dataclasses import dataclass
from pathlib import Path

import mujoco
import numpy as np

from myriad.utils.optional import MissingDependencyError

MODELS: tuple[str, ...] = ("gymnasium", "fast")

# Gymnasium v5 file names and the geoms that keep floor contacts in the fast variant.
_LOCOMOTION_FILES = {
    "ant": "ant.xml",
    "halfcheetah": "half_cheetah.xml",
    "humanoid": "humanoid.xml",
}
_FAST_CONTACT_GEOMS = {
    "ant": ("left_ankle_geom", "right_ankle_geom", "third_ankle_geom", "fourth_ankle_geom"),
    # HalfCheetah's body parts touch the floor when it flips; keeping them costs little.
    "halfcheetah": None,
    "humanoid": ("right_foot", "left_foot"),
}

# Collision bits: the floor answers bit 0, maze walls bit 1. A geom with contype 0b01 touches the
# floor, 0b10 touches walls.
_FLOOR_BIT = 1
_WALL_BIT = 2


def check_model_name(model: str) -> None:
    if model not in MODELS:
        raise ValueError(f"model must be one of {list(MODELS)}, got {model!r}")


def gymnasium_asset(filename: str) -> Path:
    """Path of an MJCF file shipped with Gymnasium's MuJoCo environments."""
    spec = importlib.util.find_spec("gymnasium")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError("gymnasium is not installed: pip install gymnasium")
    root = Path(next(iter(spec.submodule_search_locations)))
    return root / "envs" / "mujoco" / "assets" / filename


# Arena (contacts, constraints, stack) per MjData. MuJoCo's default is 14 MB (the hand's MJCF asks
# for 8 MB); these tasks peak below 100 kB, and thousands of MjData must fit in memory.
_ARENA_BYTES = {"locomotion": 1 << 20, "hand": 2 << 20}


def _compile(spec: mujoco.MjSpec, arena: int) -> mujoco.MjModel:
    spec.memory = arena
    if hasattr(spec, "nstack"):
        spec.nstack = -1
    # HalfCheetah's MJCF uses the deprecated ``settotalmass``; the compiled model is unchanged.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return spec.compile()


def _load_spec(path: Path) -> mujoco.MjSpec:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return mujoco.MjSpec.from_file(str(path))


def _apply_fast_solver(spec: mujoco.MjSpec) -> None:
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_EULER
    spec.option.solver = mujoco.mjtSolver.mjSOL_NEWTON
    # One Newton iteration (Brax/MJX's choice) lets Ant's contacts pop it 3 m high and diverges
    # against maze walls; four behave like the converged solver at about 90% of one's speed.
    spec.option.iterations = 4
    spec.option.ls_iterations = 8


def locomotion_model(
    robot: str, model: str = "gymnasium", maze: MazeLayout | None = None
) -> mujoco.MjModel:
    """Compile Ant, HalfCheetah or Humanoid in the ``model`` variant, optionally inside a maze.

    Args:
        robot: ``"ant"``, ``"halfcheetah"`` or ``"humanoid"``.
        model: ``"gymnasium"`` or ``"fast"`` (see the module docstring).
        maze: walls to add around the robot (Ant only). Every robot geom collides with walls.
    """
    check_model_name(model)
    if robot not in _LOCOMOTION_FILES:
        raise ValueError(f"robot must be one of {sorted(_LOCOMOTION_FILES)}, got {robot!r}")
    spec = _load_spec(gymnasium_asset(_LOCOMOTION_FILES[robot]))
    floor = next(g for g in spec.geoms if g.name == "floor")
    if model == "fast":
        _apply_fast_solver(spec)
    keep = _FAST_CONTACT_GEOMS[robot] if model == "fast" else None
    if maze is not None or keep is not None:
        floor.contype, floor.conaffinity = 0, _FLOOR_BIT
        for g in spec.geoms:
            if g.name == "floor":
                continue
            touches_floor = keep is None or g.name in keep
            g.contype = (_FLOOR_BIT if touches_floor else 0) | (_WALL_BIT if maze else 0)
            g.conaffinity = 0
    if maze is not None:
        maze.add_walls(spec)
    return _compile(spec, _ARENA_BYTES["locomotion"])


@dataclass(frozen=True)
class MazeLayout:
    """A maze of square cells: ``1`` wall, ``0`` free, ``r`` the reset cell, ``g`` the goal.

    The layout follows Gymnasium-Robotics' AntMaze (except the wall height and the ceiling): row
    0 is the top (largest y), cells are ``scale`` metres wide, and the maze is centred on the
    origin.
    """

    rows: tuple[str, ...]
    scale: float = 4.0
    # Gymnasium-Robotics uses 0.5 m; a thrashing ant climbs those (its torso rides at up to
    # 1.2 m), which would make wall cells reachable.
    wall_height: float = 2.0
    # An invisible ceiling on the walls closes the maze. Ant's 150-gear motors can throw it far
    # higher than any wall: a K-Myriad population trained on the U-maze without it left the maze
    # in 11% of its states under Gymnasium's own solver (torso up to 8.8 m), 15% under the fast
    # one, because leaving is what maximises the entropy of its x-y (docs/mujoco.md).
    ceiling: bool = True
    ceiling_thickness: float = 1.0

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.rows), len(self.rows[0])

    def cell_center(self, row: int, col: int) -> tuple[float, float]:
        n_rows, n_cols = self.shape
        x = (col + 0.5) * self.scale - n_cols * self.scale / 2
        y = n_rows * self.scale / 2 - (row + 0.5) * self.scale
        return x, y

    def cells_with(self, mark: str) -> list[tuple[int, int]]:
        return [(r, c) for r, row in enumerate(self.rows) for c, ch in enumerate(row) if ch == mark]

    @property
    def extent(self) -> tuple[float, float]:
        """Half width and half height of the maze in metres."""
        n_rows, n_cols = self.shape
        return n_cols * self.scale / 2, n_rows * self.scale / 2

    @property
    def free(self) -> np.ndarray:
        """``[n_rows, n_cols]`` bool, row 0 at the top: True where the cell is not a wall."""
        return np.array([[ch != "1" for ch in row] for row in self.rows], dtype=bool)

    def free_cells(self) -> list[tuple[int, int]]:
        """``(row, col)`` of every cell that is not a wall."""
        rows, cols = np.nonzero(self.free)
        return [(int(r), int(c)) for r, c in zip(rows, cols)]

    def cells_of(self, xy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(row, col)`` index arrays ``[N]`` of the cells holding positions ``xy [N, 2]`` in
        metres; ``(-1, -1)`` where a position is outside the free cells."""
        hx, hy = self.extent
        n_rows, n_cols = self.shape
        col = np.floor((xy[:, 0] + hx) / self.scale).astype(int)
        row = np.floor((hy - xy[:, 1]) / self.scale).astype(int)
        inside = (col >= 0) & (col < n_cols) & (row >= 0) & (row < n_rows)
        inside[inside] = self.free[row[inside], col[inside]]
        return np.where(inside, row, -1), np.where(inside, col, -1)

    def cell_of(self, x: float, y: float) -> tuple[int, int] | None:
        """The free cell ``(row, col)`` holding ``(x, y)``, or None."""
        rows, cols = self.cells_of(np.array([[x, y]], dtype=np.float64))
        return None if rows[0] < 0 else (int(rows[0]), int(cols[0]))

    def distances_from(self, cell: tuple[int, int]) -> np.ndarray:
        """Geodesic distance in cells ``[n_rows, n_cols]`` from ``cell`` to every cell
        (4-connected moves between free cells; ``inf`` for walls and unreachable cells)."""
        from myriad.envs.layout import bfs_distances

        dist = bfs_distances(self.free, [cell]).astype(np.float64)
        dist[dist < 0] = np.inf
        return dist

    def walls_xy(self) -> np.ndarray:
        """Walls indexed ``[ix, iy]`` (x, then y upward), ``[n_cols, n_rows]`` bool (the
        :class:`~myriad.envs.base.EnvLayout` of the VecEnv contract)."""
        return ~self.free_grid(1)

    def free_grid(self, sub: int) -> np.ndarray:
        """Bool grid ``[n_cols * sub, n_rows * sub]`` indexed ``[ix, iy]`` (x then y, y upward):
        True where the cell is not a wall."""
        # rows run from top (max y) to bottom; feature axis y runs upward.
        grid_xy = self.free[::-1].T
        return np.kron(grid_xy, np.ones((sub, sub), dtype=bool))

    def add_walls(self, spec: mujoco.MjSpec) -> None:
        half = self.scale / 2
        for r, row in enumerate(self.rows):
            for c, ch in enumerate(row):
                if ch != "1":
                    continue
                x, y = self.cell_center(r, c)
                spec.worldbody.add_geom(
                    name=f"wall_{r}_{c}",
                    type=mujoco.mjtGeom.mjGEOM_BOX,
                    size=[half, half, self.wall_height / 2],
                    pos=[x, y, self.wall_height / 2],
                    contype=0,
                    conaffinity=_WALL_BIT,
                    rgba=[0.7, 0.5, 0.3, 1.0],
                )
        if self.ceiling:
            hx, hy = self.extent
            thickness = self.ceiling_thickness
            spec.worldbody.add_geom(
                name="ceiling",
                type=mujoco.mjtGeom.mjGEOM_BOX,
                size=[hx, hy, thickness / 2],
                pos=[0.0, 0.0, self.wall_height + thickness / 2],
                contype=0,
                conaffinity=_WALL_BIT,
                rgba=[0.0, 0.0, 0.0, 0.0],  # not drawn: renders view the maze from above
            )


# Gymnasium-Robotics' U_MAZE and MEDIUM_MAZE (the ant starts at "r", the goal is "g").
U_MAZE = MazeLayout(rows=("11111", "1r001", "11101", "1g001", "11111"))
MEDIUM_MAZE = MazeLayout(
    rows=(
        "11111111",
        "1r011001",
        "10010001",
        "11000111",
        "10010001",
        "10100101",
        "1000100g",
        "11111111",
    )
)


def _robotics_assets() -> Path:
    spec = importlib.util.find_spec("gymnasium_robotics")
    if spec is None or not spec.submodule_search_locations:
        raise MissingDependencyError(
            "gymnasium-robotics is not installed (it ships the Shadow hand model): "
            "pip install 'myriad-rl[hand]' (or: pip install gymnasium-robotics)"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "envs" / "assets"


# Physics of the hand variants: (time step, substeps per control step, solver iterations).
# Both give a 0.04 s control step (25 Hz), as in Gymnasium-Robotics' HandManipulateBlock.
_HAND_PHYSICS = {"gymnasium": (0.002, 20, 20), "fast": (0.005, 8, 4)}
CUBE_HALF_SIZE = 0.025


def shadow_hand_model(model: str = "gymnasium") -> tuple[mujoco.MjModel, int]:
    """The Shadow Dexterous Hand (OpenAI's MJCF from Gymnasium-Robotics) holding a 5 cm cube.

    Returns:
        ``(model, frame_skip)``. The cube is the last body, with a free joint (the last 7 qpos and
        6 qvel). The target orientation is not part of the physics.
    """
    check_model_name(model)
    timestep, frame_skip, iterations = _HAND_PHYSICS[model]
    root = _robotics_assets()
    hand = root / "hand"
    xml = f"""
<mujoco model="shadow_hand_cube">
  <compiler angle="radian" coordinate="local" meshdir="{root / "stls" / "hand"}"
            texturedir="{root / "textures"}"/>
  <option timestep="{timestep}" iterations="{iterations}" ls_iterations="{2 * iterations}"/>
  <include file="{hand / "shared.xml"}"/>
  <asset><include file="{hand / "shared_asset.xml"}"/></asset>
  <worldbody>
    <include file="{hand / "robot.xml"}"/>
    <body name="object" pos="1 0.87 0.2">
      <geom name="object" type="box" size="{CUBE_HALF_SIZE} {CUBE_HALF_SIZE} {CUBE_HALF_SIZE}"
            condim="4" density="567"/>
      <joint name="object:joint" type="free" damping="0.01"/>
    </body>
  </worldbody>
</mujoco>"""
    spec = mujoco.MjSpec.from_string(xml)
    return _compile(spec, _ARENA_BYTES["hand"]), frame_skip
