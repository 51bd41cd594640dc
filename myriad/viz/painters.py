"""Painters: what to record of an env's state at each step, and how to turn it into frames.

A painter has two halves, so that the rollout loop stays a batched tensor loop and the slow
drawing happens afterwards:

- :meth:`Painter.capture` ``(env) -> [E, d]``: a tensor snapshot of every env's state, taken
  on the env's device after each step (nav: the point's position; MuJoCo: ``qpos``).
- :meth:`Painter.episode` ``(states [F, n, d], frames [n], member [n])``: the frames of ``n``
  recorded episodes played side by side, one ``[n, H, W, 3]`` array per time step; an episode
  that has ended holds its last frame.

:func:`make_painter` picks the painter of an env: :class:`NavPainter` draws the torch navigation
suite top-down on its layout (NumPy raster), :class:`MujocoPainter` renders MuJoCo tasks (the
myriad ones and Gymnasium's MuJoCo envs) with MuJoCo's own renderer, headless.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from myriad.envs.base import EnvLayout, VecEnv
from myriad.utils.config import ConfigError

if TYPE_CHECKING:
    from myriad.envs.nav import PointNavEnv

#: Frame size ``(height, width)`` of rendered MuJoCo frames.
MUJOCO_SIZE = (240, 320)
#: Longest side of a nav frame in pixels (cells are square, a whole number of pixels).
NAV_SIDE = 320
NAV_FPS = 30.0

_WALL = np.array([70, 70, 78], dtype=np.uint8)
_FLOOR = np.array([250, 250, 250], dtype=np.uint8)
_UNREACHABLE = np.array([215, 215, 215], dtype=np.uint8)
#: The goal: a dark ring with a centre dot (a target), in no member's colour.
_GOAL = np.array([40, 40, 40], dtype=np.uint8)
_OUTLINE = np.array([30, 30, 30], dtype=np.uint8)


def to_rgb255(colors: Sequence[Sequence[float]]) -> np.ndarray:
    """Matplotlib colours in ``[0, 1]`` as ``[n, 3]`` uint8."""
    return np.round(np.asarray([c[:3] for c in colors], dtype=np.float64) * 255).astype(np.uint8)


def _disc(radius: float) -> tuple[np.ndarray, np.ndarray]:
    """Pixel offsets ``(dy [K], dx [K])`` of a filled disc."""
    r = math.ceil(radius)
    dy, dx = np.mgrid[-r : r + 1, -r : r + 1]
    inside = dy**2 + dx**2 <= radius**2
    return dy[inside], dx[inside]


def _ring(radius: float, width: float) -> tuple[np.ndarray, np.ndarray]:
    """Pixel offsets ``(dy [K], dx [K])`` of a circle's outline ``width`` pixels wide."""
    r = math.ceil(radius)
    dy, dx = np.mgrid[-r : r + 1, -r : r + 1]
    d2 = dy**2 + dx**2
    inside = (d2 <= radius**2) & (d2 > max(0.0, radius - width) ** 2)
    return dy[inside], dx[inside]


class Painter(abc.ABC):
    """Records env states and paints them (see the module docstring).

    Attributes:
        size: ``(H, W)`` of a frame (both even).
        fps: playback rate, frames per second (one frame per env step).
    """

    size: tuple[int, int]
    fps: float

    @abc.abstractmethod
    def capture(self, env: VecEnv) -> torch.Tensor:
        """The state of every env to paint later, ``[E, d]`` on the env's device."""

    @abc.abstractmethod
    def episode(
        self, states: np.ndarray, frames: np.ndarray, member: np.ndarray
    ) -> Iterator[np.ndarray]:
        """Frames ``[n, H, W, 3]`` for ``t = 0 .. max(frames) - 1`` of ``n`` episodes.

        Args:
            states: ``[F, n, d]`` captured states, ``states[t]`` after ``t`` steps.
            frames: ``[n]`` number of valid frames of each episode (``>= 1``).
            member: ``[n]`` the member acting in each episode (for colours).
        """

    def close(self) -> None:  # noqa: B027 - painters without resources need nothing
        """Release the renderer."""


class NavPainter(Painter):
    """Top-down view of a :class:`~myriad.envs.nav.PointNavEnv`: walls, the goal (when the task
    has one), each episode's trail and its point, in the member's colour.

    Args:
        env: the nav env (its layout, goals and task).
        colors: one RGB colour in ``[0, 1]`` per member of the population.
        side: longest side of a frame in pixels.
    """

    def __init__(
        self, env: PointNavEnv, colors: Sequence[Sequence[float]], side: int = NAV_SIDE
    ) -> None:
        layout = env.layout
        px = max(4, side // max(layout.width, layout.height))
        self.px = px
        self.height_cells = layout.height
        walls = layout.walls.repeat(px, 0).repeat(px, 1)  # text orientation: row 0 on top
        unreachable = (~layout.walls & ~layout.reachable).repeat(px, 0).repeat(px, 1)
        image = np.empty((*walls.shape, 3), dtype=np.uint8)
        image[...] = _FLOOR
        image[unreachable] = _UNREACHABLE
        image[walls] = _WALL
        h, w = walls.shape
        image = np.pad(image, ((0, h % 2), (0, w % 2), (0, 0)), mode="edge")
        self.size = (image.shape[0], image.shape[1])
        if env.has_task_reward:
            radius = float(env.goal_radius) * px
            ring = _ring(radius, max(2.0, 0.15 * radius))
            dot = _disc(max(1.0, 0.2 * radius))
            dy, dx = np.concatenate([ring[0], dot[0]]), np.concatenate([ring[1], dot[1]])
            for gx, gy in env.goal_set.cpu().tolist():
                cy, cx = self._pixel(np.array([[gx, gy]]))
                rows = np.clip(cy + dy, 0, self.size[0] - 1)
                cols = np.clip(cx + dx, 0, self.size[1] - 1)
                keep = ~walls[np.minimum(rows, h - 1), np.minimum(cols, w - 1)]
                image[rows[keep], cols[keep]] = _GOAL
        self.background = image
        self.colors = to_rgb255(colors)
        # Trails are the member's colour faded toward white, so the point stands out.
        self.trail_colors = (0.45 * self.colors + 0.55 * 255).round().astype(np.uint8)
        self.fps = NAV_FPS
        self._point = _disc(max(2.5, 0.32 * px))
        self._outline = _disc(max(2.5, 0.32 * px) + 1.2)
        self._brush = _disc(max(1.0, 0.09 * px))

    def capture(self, env: VecEnv) -> torch.Tensor:
        from myriad.envs.nav import PointNavEnv

        assert isinstance(env, PointNavEnv)  # make_painter builds this painter for nav envs only
        return env.pos.clone()

    def _pixel(self, xy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """World ``[n, 2]`` to pixel ``(row [n], col [n])``; y points up in the world."""
        col = np.floor(xy[:, 0] * self.px).astype(np.int64)
        row = np.floor((self.height_cells - xy[:, 1]) * self.px).astype(np.int64)
        return row, col

    def _stamp(
        self,
        canvas: np.ndarray,
        row: np.ndarray,
        col: np.ndarray,
        offsets: tuple[np.ndarray, np.ndarray],
        colors: np.ndarray,
    ) -> None:
        """Paint ``offsets`` around pixel ``(row [n, S], col [n, S])`` of canvas ``n`` with
        ``colors [n, 3]``, all canvases at once."""
        dy, dx = offsets
        n = canvas.shape[0]
        rows = np.clip(row[..., None] + dy, 0, self.size[0] - 1).reshape(n, -1)
        cols = np.clip(col[..., None] + dx, 0, self.size[1] - 1).reshape(n, -1)
        which = np.broadcast_to(np.arange(n)[:, None], rows.shape)
        canvas[which, rows, cols] = colors[:, None, :]

    def episode(
        self, states: np.ndarray, frames: np.ndarray, member: np.ndarray
    ) -> Iterator[np.ndarray]:
        n = states.shape[1]
        canvas = np.broadcast_to(self.background, (n, *self.background.shape)).copy()
        trail, color = self.trail_colors[member], self.colors[member]
        last = frames - 1
        prev = states[0]
        for t in range(int(frames.max())):
            cur = states[np.minimum(t, last), np.arange(n)]
            # The segment from the previous point, sampled every pixel or so.
            steps = max(2, math.ceil(float(np.abs(cur - prev).max(initial=0.0)) * self.px) + 1)
            ts = np.linspace(0.0, 1.0, steps)[None, :, None]
            path = prev[:, None, :] + (cur - prev)[:, None, :] * ts  # [n, S, 2]
            row, col = self._pixel(path.reshape(-1, 2))
            self._stamp(canvas, row.reshape(n, -1), col.reshape(n, -1), self._brush, trail)
            frame = canvas.copy()
            row, col = self._pixel(cur)
            self._stamp(frame, row[:, None], col[:, None], self._outline, np.tile(_OUTLINE, (n, 1)))
            self._stamp(frame, row[:, None], col[:, None], self._point, color)
            prev = cur
            yield frame


def _mujoco_camera(
    model: Any, aspect: float, layout: EnvLayout | None, goal: torch.Tensor | None
) -> Any:
    """The camera of a MuJoCo task: top-down over a maze, a view of the hand's palm, or
    tracking the robot's root body from the side (locomotion, and anything else with a free
    root)."""
    import mujoco

    from myriad.envs.mujoco.models import MazeLayout

    cam = mujoco.MjvCamera()
    if isinstance(layout, MazeLayout):  # Ant maze: the whole maze
        hx, hy = layout.extent
        half_fov = math.radians(float(model.vis.global_.fovy)) / 2
        cam.type = mujoco.mjtCamera.mjCAMERA_FREE
        cam.lookat[:] = (0.0, 0.0, 0.0)
        cam.azimuth, cam.elevation = 90.0, -90.0
        cam.distance = 1.05 * max(hy, hx / aspect) / math.tan(half_fov)
        return cam
    if goal is not None:  # the hand: Gymnasium-Robotics' default view of the palm
        cam.type = mujoco.mjtCamera.mjCAMERA_FREE
        cam.lookat[:] = goal.cpu().numpy().astype(np.float64)
        cam.distance, cam.azimuth, cam.elevation = 0.5, 55.0, -25.0
        return cam
    if model.nbody > 1 and model.body_jntnum[1] > 0:
        cam.type = mujoco.mjtCamera.mjCAMERA_TRACKING
        cam.trackbodyid = 1
        cam.distance, cam.azimuth, cam.elevation = 4.0, 90.0, -20.0
        return cam
    mujoco.mjv_defaultFreeCamera(model, cam)
    return cam


class MujocoPainter(Painter):
    """Frames of MuJoCo envs from recorded ``qpos``, through ``mujoco.Renderer`` (headless GL:
    :func:`myriad.viz.gl.ensure_headless_gl`).

    Each frame sets one ``MjData``'s ``qpos``, runs ``mj_forward`` and renders. Shadows and
    reflections are off by default: with software OpenGL they cost most of the frame time.

    Args:
        model: the ``MjModel`` the env simulates.
        camera: an ``MjvCamera``.
        fps: frames per second (one frame per env step: ``1 / dt``).
        size: ``(H, W)`` of a frame.
        capture_fn: ``env -> qpos [E, nq]``.
        shadows: render shadows and reflections.
    """

    def __init__(
        self,
        model: Any,
        camera: Any,
        fps: float,
        size: tuple[int, int] = MUJOCO_SIZE,
        capture_fn: Any = None,
        shadows: bool = False,
    ) -> None:
        from myriad.viz.gl import ensure_headless_gl

        ensure_headless_gl()
        import mujoco

        self._mujoco = mujoco
        self.model = model
        self.data = mujoco.MjData(model)
        h, w = size
        self.size = (h - h % 2, w - w % 2)
        offscreen = model.vis.global_
        if self.size[0] > offscreen.offheight or self.size[1] > offscreen.offwidth:
            raise ConfigError(
                f"frame size {self.size} exceeds the model's offscreen buffer "
                f"({offscreen.offheight}, {offscreen.offwidth}); choose a smaller size"
            )
        self.renderer = mujoco.Renderer(model, self.size[0], self.size[1])
        self.camera = camera
        self.fps = float(fps)
        self.shadows = shadows
        self._capture_fn = capture_fn

    def capture(self, env: VecEnv) -> torch.Tensor:
        return self._capture_fn(env)

    def _render(self, qpos: np.ndarray, out: np.ndarray) -> None:
        mujoco, data = self._mujoco, self.data
        data.qpos[:] = qpos
        mujoco.mj_forward(self.model, data)
        self.renderer.update_scene(data, self.camera)
        if not self.shadows:
            flags = self.renderer.scene.flags
            flags[mujoco.mjtRndFlag.mjRND_SHADOW] = 0
            flags[mujoco.mjtRndFlag.mjRND_REFLECTION] = 0
        self.renderer.render(out=out)

    def episode(
        self, states: np.ndarray, frames: np.ndarray, member: np.ndarray
    ) -> Iterator[np.ndarray]:
        n = states.shape[1]
        out = np.zeros((n, *self.size, 3), dtype=np.uint8)
        for t in range(int(frames.max())):
            # Rendering is one frame at a time; episodes that ended keep their last frame.
            for i in np.flatnonzero(frames > t):
                self._render(states[t, i], out[i])
            yield out.copy()

    def close(self) -> None:
        self.renderer.close()


def _gymnasium_mujoco(env: Any) -> tuple[Any, Any] | None:
    """``(sub-envs, MjModel)`` of a Gymnasium vector env of MuJoCo envs stepped in this
    process, else None."""
    vec = getattr(env, "env", None)
    subs = getattr(vec, "envs", None)
    if not subs:
        return None
    model = getattr(subs[0].unwrapped, "model", None)
    if model is None or not hasattr(subs[0].unwrapped, "data"):
        return None
    return subs, model


def make_painter(env: VecEnv, colors: Sequence[Sequence[float]]) -> Painter:
    """The painter of ``env`` (nav: top-down raster; MuJoCo: MuJoCo's renderer).

    Raises:
        ConfigError: the env has no painter (the message says which envs can be rendered).
        HeadlessGLError: a MuJoCo env, and no headless OpenGL platform works.
    """
    from myriad.envs.nav import PointNavEnv

    if isinstance(env, PointNavEnv):
        return NavPainter(env, colors)
    from myriad.envs.mujoco.base import MujocoVecEnv

    aspect = MUJOCO_SIZE[1] / MUJOCO_SIZE[0]
    if isinstance(env, MujocoVecEnv):
        camera = _mujoco_camera(env.mj_model, aspect, env.layout, env.goal_pos)
        return MujocoPainter(
            env.mj_model,
            camera,
            1.0 / env.dt,
            capture_fn=lambda e: e.sim.field("qpos").clone(),
        )
    found = _gymnasium_mujoco(env)
    if found is not None:
        subs, model = found
        camera = _mujoco_camera(model, aspect, env.layout, env.goal_pos)
        dt = float(getattr(subs[0].unwrapped, "dt", model.opt.timestep))

        def capture(e: Any) -> torch.Tensor:
            # Gymnasium steps its sub-envs one by one in this process; reading their qpos is
            # one copy each.
            qpos = np.stack([s.unwrapped.data.qpos for s in subs])
            return torch.as_tensor(qpos).to(e.device)

        return MujocoPainter(model, camera, 1.0 / dt, capture_fn=capture)
    raise ConfigError(
        f"cannot render env {env.name or type(env).__name__}: videos are drawn for the nav "
        "envs, the mujoco-* envs and Gymnasium MuJoCo envs (env_id=Ant-v5 ..., "
        "vectorization_mode=sync)"
    )
