"""Navigation layouts as data: ASCII maps of unit cells.

Characters: ``#`` wall, ``.`` (or space) free floor, ``S`` start cell, ``G`` goal cell. Every cell
is a unit square. World coordinates put the origin at the bottom-left corner of the map with
``y`` pointing up, so the character at text row ``r`` and column ``c`` covers
``x in [c, c + 1]`` and ``y in [H - 1 - r, H - r]``.

A map without a wall border gets one added, so nothing can leave the map. A user adds a layout by
writing a text file and passing its path (or the map text itself) as ``layout=``.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

WALL, FLOOR, START, GOAL = "#", ".", "S", "G"
_ALLOWED = {WALL, FLOOR, START, GOAL, " "}


class LayoutError(ValueError):
    """A layout map is malformed; the message names the offending cell."""


def builtin_layouts() -> list[str]:
    """Names of the layouts shipped with myriad."""
    folder = resources.files("myriad.envs") / "layouts"
    return sorted(p.name[: -len(".txt")] for p in folder.iterdir() if p.name.endswith(".txt"))


@dataclass(frozen=True)
class Layout:
    """A parsed map.

    Attributes:
        name: layout name (file stem for files).
        walls: ``[H, W]`` bool, text orientation (row 0 is the top line of the map).
        starts: ``(row, col)`` of every start cell.
        goals: ``(row, col)`` of every goal cell (may be empty).
        reachable: ``[H, W]`` bool, floor cells reachable from the start cells.
    """

    name: str
    walls: np.ndarray
    starts: tuple[tuple[int, int], ...]
    goals: tuple[tuple[int, int], ...]
    reachable: np.ndarray

    @property
    def height(self) -> int:
        return int(self.walls.shape[0])

    @property
    def width(self) -> int:
        return int(self.walls.shape[1])

    def cell_center(self, row: int, col: int) -> tuple[float, float]:
        """World ``(x, y)`` of the centre of the cell at text ``(row, col)``."""
        return col + 0.5, self.height - row - 0.5

    def walls_xy(self) -> np.ndarray:
        """Walls indexed ``[ix, iy]`` in world orientation, ``[W, H]`` bool."""
        return np.ascontiguousarray(self.walls[::-1].T)

    def reachable_xy(self) -> np.ndarray:
        """Reachable cells indexed ``[ix, iy]``, ``[W, H]`` bool (the coverage grid)."""
        return np.ascontiguousarray(self.reachable[::-1].T)

    def distances_from(self, cell: tuple[int, int]) -> np.ndarray:
        """Shortest path length in cells from ``cell`` to every cell (4-connected), ``[H, W]``.

        Unreachable cells get ``-1``.
        """
        return bfs_distances(~self.walls, [cell])

    def text(self) -> str:
        rows = []
        for r in range(self.height):
            line = ["#" if self.walls[r, c] else "." for c in range(self.width)]
            rows.append(line)
        for r, c in self.starts:
            rows[r][c] = START
        for r, c in self.goals:
            rows[r][c] = GOAL
        return "\n".join("".join(line) for line in rows)

    @classmethod
    def from_text(cls, text: str, name: str = "custom") -> Layout:
        """Parse a map; raises :class:`LayoutError` naming the offending cell."""
        lines = [line.rstrip("\n") for line in text.strip("\n").splitlines()]
        lines = [line for line in lines if line.strip()]
        if not lines:
            raise LayoutError(f"layout {name!r} is empty")
        width = max(len(line) for line in lines)
        for r, line in enumerate(lines):
            if len(line) != width:
                raise LayoutError(
                    f"layout {name!r}: row {r} has {len(line)} cells, expected {width} "
                    "(every row of a map must have the same length)"
                )
            for c, ch in enumerate(line):
                if ch not in _ALLOWED:
                    raise LayoutError(
                        f"layout {name!r}: unknown character {ch!r} at row {r}, col {c}; "
                        "use '#' wall, '.' floor, 'S' start, 'G' goal"
                    )
        grid = np.array([list(line) for line in lines])
        if not (
            (grid[0] == WALL).all()
            and (grid[-1] == WALL).all()
            and (grid[:, 0] == WALL).all()
            and (grid[:, -1] == WALL).all()
        ):
            grid = np.pad(grid, 1, constant_values=WALL)
        walls = grid == WALL
        starts = tuple((int(r), int(c)) for r, c in zip(*np.nonzero(grid == START)))
        goals = tuple((int(r), int(c)) for r, c in zip(*np.nonzero(grid == GOAL)))
        if not starts:
            raise LayoutError(f"layout {name!r} has no start cell: mark at least one with 'S'")
        reachable = bfs_distances(~walls, list(starts)) >= 0
        for r, c in goals:
            if not reachable[r, c]:
                raise LayoutError(
                    f"layout {name!r}: goal cell at row {r}, col {c} cannot be reached from the "
                    "start cells (walls enclose it)"
                )
        return cls(name, walls, starts, goals, reachable)

    @classmethod
    def load(cls, spec: str | Path) -> Layout:
        """A built-in name (``"maze"``), a path to a map file, or the map text itself."""
        spec_str = str(spec)
        if "\n" in spec_str:
            return cls.from_text(spec_str)
        if spec_str in builtin_layouts():
            folder = resources.files("myriad.envs") / "layouts"
            return cls.from_text((folder / f"{spec_str}.txt").read_text(), name=spec_str)
        path = Path(spec_str).expanduser()
        if path.is_file():
            return cls.from_text(path.read_text(), name=path.stem)
        raise LayoutError(
            f"unknown layout {spec_str!r}: give a built-in name ({', '.join(builtin_layouts())}), "
            "a path to a map file, or the map text"
        )


def bfs_distances(free: np.ndarray, sources: list[tuple[int, int]]) -> np.ndarray:
    """4-connected breadth-first distances over ``free`` cells from ``sources``; -1 unreached."""
    dist = np.full(free.shape, -1, dtype=np.int64)
    queue: deque[tuple[int, int]] = deque()
    for r, c in sources:
        if free[r, c] and dist[r, c] < 0:
            dist[r, c] = 0
            queue.append((r, c))
    height, width = free.shape
    while queue:
        r, c = queue.popleft()
        for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if 0 <= nr < height and 0 <= nc < width and free[nr, nc] and dist[nr, nc] < 0:
                dist[nr, nc] = dist[r, c] + 1
                queue.append((nr, nc))
    return dist
