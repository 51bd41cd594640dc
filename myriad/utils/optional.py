"""Lazy imports of optional dependencies with a one-line message naming the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType


class MissingDependencyError(ImportError):
    """An optional dependency is not installed; the message says which extra provides it."""


def require(module: str, extra: str, package: str | None = None) -> ModuleType:
    """Import ``module`` or raise a one-line error naming the extra that installs it.

    Args:
        module: importable module name, e.g. ``"ray"``.
        extra: myriad extra that provides it, e.g. ``"ray"`` -> ``pip install 'myriad-rl[ray]'``.
        package: PyPI distribution name when it differs from the module name.
    """
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        dist = package or module
        raise MissingDependencyError(
            f"{dist} is not installed: pip install 'myriad-rl[{extra}]' (or: pip install {dist})"
        ) from exc


def available(module: str) -> bool:
    """Whether ``module`` can be imported (without importing it twice on success)."""
    try:
        importlib.import_module(module)
    except ImportError:
        return False
    return True
