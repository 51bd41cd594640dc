"""Batched environments: the VecEnv contract, the registry and the built-in families."""

from myriad.envs.base import ActionError, FeatureSpec, TensorVecEnv, VecEnv, validate_actions
from myriad.envs.registry import UnknownEnvError, make, make_from_config, names, register

__all__ = [
    "ActionError",
    "FeatureSpec",
    "TensorVecEnv",
    "UnknownEnvError",
    "VecEnv",
    "make",
    "make_from_config",
    "names",
    "register",
    "validate_actions",
]
