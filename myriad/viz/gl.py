"""Headless OpenGL for MuJoCo's renderer: EGL, else OSMesa, chosen automatically.

MuJoCo's Python bindings pick their OpenGL platform from ``MUJOCO_GL`` when ``mujoco`` is first
imported, and a platform that cannot create a context only fails when a renderer is made. So the
choice is made by trying each platform in a short-lived child process (a failed attempt can leave
a process's OpenGL state unusable), then set in this process; when ``mujoco`` was already imported
under another platform, its GL-context module is re-imported, which is safe as long as PyOpenGL
has not been loaded yet (nothing in myriad loads it before rendering).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys

from myriad.utils.optional import MissingDependencyError

#: Platforms tried in order when ``MUJOCO_GL`` is not set.
PLATFORMS: tuple[str, ...] = ("egl", "osmesa")
#: The Debian packages that provide each platform.
DEBIAN_PACKAGES: dict[str, str] = {
    "egl": "libegl1 libegl-mesa0 libgl1-mesa-dri",
    "osmesa": "libosmesa6",
}

_PROBE = (
    "import mujoco\n"
    "m = mujoco.MjModel.from_xml_string(\"<mujoco><worldbody><geom size='.1'/></worldbody>"
    '</mujoco>")\n'
    "d = mujoco.MjData(m)\n"
    "mujoco.mj_forward(m, d)\n"
    "r = mujoco.Renderer(m, 16, 16)\n"
    "r.update_scene(d)\n"
    "r.render()\n"
    "r.close()\n"
)
_chosen: str | None = None


class HeadlessGLError(MissingDependencyError):
    """No OpenGL platform can render without a display; the message names what to install."""


def _platform_env(platform: str) -> dict[str, str]:
    env = dict(os.environ, MUJOCO_GL=platform)
    if platform in ("egl", "osmesa"):
        # PyOpenGL must load the same platform as MuJoCo's context.
        env["PYOPENGL_PLATFORM"] = platform
    return env


def probe(platform: str, timeout: float = 120.0) -> str | None:
    """Render one frame with ``MUJOCO_GL=platform`` in a child process; None when it works,
    else the last line of its error."""
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=_platform_env(platform),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired:
        return f"no frame within {timeout:.0f} s"
    if done.returncode == 0:
        return None
    lines = [line for line in done.stderr.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {done.returncode}"


def _activate(platform: str) -> None:
    """Make this process render with ``platform``."""
    for key in ("MUJOCO_GL", "PYOPENGL_PLATFORM"):
        value = _platform_env(platform).get(key)
        if value is not None:
            os.environ[key] = value
    module = sys.modules.get("mujoco.rendering.classic.gl_context")
    if module is None or getattr(module, "_MUJOCO_GL", platform) == platform:
        return
    opengl = sys.modules.get("OpenGL.platform")
    if opengl is not None:
        raise HeadlessGLError(
            f"OpenGL was already loaded in this process for another platform; start Python with "
            f"MUJOCO_GL={platform} to render"
        )
    importlib.reload(module)


def ensure_headless_gl() -> str:
    """Choose and activate the OpenGL platform MuJoCo renders with; returns its name.

    ``MUJOCO_GL`` set by the user is respected (and checked); otherwise EGL, then OSMesa. The
    choice is made once per process.

    Raises:
        HeadlessGLError: no platform renders (one line naming the Debian packages to install).
    """
    global _chosen
    if _chosen is not None:
        return _chosen
    requested = os.environ.get("MUJOCO_GL", "").strip().lower()
    candidates = (requested,) if requested else PLATFORMS
    errors = []
    for platform in candidates:
        error = probe(platform)
        if error is None:
            _activate(platform)
            _chosen = platform
            return platform
        errors.append(f"{platform}: {error}")
    install = " or ".join(
        f"apt-get install {DEBIAN_PACKAGES[p]} ({p})" for p in PLATFORMS if p in DEBIAN_PACKAGES
    )
    hint = f"; or unset MUJOCO_GL={requested}" if requested else ""
    raise HeadlessGLError(
        f"MuJoCo cannot render without a display here ({'; '.join(errors)}): {install}{hint}"
    )
