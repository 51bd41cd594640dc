"""Lazy import of MuJoCo Warp with a known kernel cache folder.

Warp compiles its kernels on first use (tens of seconds on CPU) and caches the binaries. The
cache lives in ``$MYRIAD_WARP_CACHE`` or ``~/.cache/myriad/warp`` so that CI can keep it between
runs and users can find (and delete) it.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import ModuleType

from myriad.utils.optional import require

CACHE_ENV_VAR = "MYRIAD_WARP_CACHE"

_initialised = False


def warp_cache_dir() -> Path:
    """The folder holding compiled Warp kernels (``$MYRIAD_WARP_CACHE`` overrides the default)."""
    override = os.environ.get(CACHE_ENV_VAR)
    if override:
        return Path(override).expanduser()
    return Path.home() / ".cache" / "myriad" / "warp"


def import_warp() -> tuple[ModuleType, ModuleType]:
    """``(warp, mujoco_warp)``, initialised once with the kernel cache in :func:`warp_cache_dir`.

    Raises:
        MissingDependencyError: warp-lang or mujoco-warp is not installed (one line naming the
            ``warp`` extra).
    """
    global _initialised
    wp = require("warp", "warp", package="warp-lang")
    if not _initialised:
        cache = warp_cache_dir()
        cache.mkdir(parents=True, exist_ok=True)
        wp.config.kernel_cache_dir = str(cache)
        # At its default log level Warp prints one line per loaded module: hundreds of lines.
        if hasattr(wp, "LOG_WARNING"):
            wp.config.log_level = wp.LOG_WARNING
        else:
            wp.config.quiet = True
        wp.init()
        _initialised = True
    mjw = require("mujoco_warp", "warp", package="mujoco-warp")
    return wp, mjw
