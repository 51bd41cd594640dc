"""myriad: populations of policies at scale.

K-Myriad collective-entropy pretraining, Coupled Policy Optimization finetuning, diverse datasets
for offline RL, and Ray scale-out, on batched PyTorch environments.

``import myriad`` imports nothing else: each subpackage (``myriad.envs``, ``myriad.pretrain``,
``myriad.datasets``, ...) is imported on first use as an attribute, so
``import myriad; myriad.datasets.load(...)`` works and ``import myriad`` stays cheap.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from types import ModuleType

from myriad.utils.process import apply_process_settings

# Before any myriad module imports torch: the settings every way of running myriad shares.
apply_process_settings()

try:
    __version__ = version("myriad-rl")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+local"

#: Subpackages reachable as attributes of ``myriad``, imported on first access.
SUBPACKAGES: tuple[str, ...] = (
    "bench",
    "datasets",
    "distributed",
    "entropy",
    "envs",
    "finetune",
    "nn",
    "pretrain",
    "rl",
    "tools",
    "utils",
    "viz",
)

__all__ = ["SUBPACKAGES", "__version__", *SUBPACKAGES]


def __getattr__(name: str) -> ModuleType:
    if name in SUBPACKAGES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module  # later accesses skip this function
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *SUBPACKAGES})
