"""myriad: populations of policies at scale.

K-Myriad collective-entropy pretraining, Coupled Policy Optimization finetuning, diverse datasets
for offline RL, and Ray scale-out, on batched PyTorch environments.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("myriad-rl")
except PackageNotFoundError:  # running from a source tree without installation
    __version__ = "0.0.0+local"

__all__ = ["__version__"]
