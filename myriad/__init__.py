"""myriad: populations of policies at scale.

K-Myriad collective-entropy pretraining, Coupled Policy Optimization finetuning, diverse datasets
for offline RL, and Ray scale-out, on batched PyTorch environments.
"""

from importlib.metadata import PackageNotFoundError, version

from myriad.utils.process import apply_process_settings

# Before any myriad module imports torch: the settings every way of running myriad shares.
apply_process_settings()

try:
    __version__ = version("myriad-rl")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+local"

__all__ = ["__version__"]
