"""Batched environments: the VecEnv contract, the registry and the built-in families."""

from myriad.envs.base import ActionError, FeatureSpec, TensorVecEnv, VecEnv, validate_actions
from myriad.envs.registry import (
    EnvConfigError,
    RemoteEnvFactory,
    UnknownEnvError,
    import_env_modules,
    make,
    make_from_config,
    names,
    register,
)

__all__ = [
    "ActionError",
    "EnvConfigError",
    "FeatureSpec",
    "RemoteEnvFactory",
    "TensorVecEnv",
    "UnknownEnvError",
    "VecEnv",
    "import_env_modules",
    "make",
    "make_from_config",
    "names",
    "register",
    "validate_actions",
]
