"""Environments on Ray workers and adaptive policy synchronisation (APS).

Ray is an optional dependency (``pip install 'myriad-rl[ray]'``): this package imports without it,
and the classes that need it say what to install when they are used.

- :class:`RemoteVecEnv`: a VecEnv whose shards run in Ray actors (central inference); its
  :meth:`~RemoteVecEnv.as_gymnasium` is a ``gymnasium.vector.VectorEnv`` over it.
- :class:`APSCollector`: worker-side inference; workers hold a policy copy and get new weights
  only when their policy drifted by more than ``delta`` nats (:class:`AdaptiveSync`).
- :func:`load_config` / :func:`init_ray`: the ``local`` and ``cluster`` presets.

:func:`make_distributed` is the :class:`~myriad.envs.registry.RemoteEnvFactory` of run configs
with a ``distributed`` entry: ``myriad pretrain`` and ``myriad finetune`` (the command layer) hand
it down to the runners' env builder (:func:`myriad.envs.registry.make_from_config`); the layers
below never import this package.
"""

from typing import Any

import torch

from myriad.distributed.aps import AdaptiveSync, WorkerSyncStats, mean_policy_kl
from myriad.distributed.config import (
    APSConfig,
    DistributedConfig,
    RayConfig,
    WorkerConfig,
    init_ray,
    load_config,
    preset_names,
)
from myriad.distributed.policy import (
    LinearPolicy,
    WorkerPolicy,
    as_dist_params,
    dist_kl,
    dist_log_prob,
    dist_sample,
)
from myriad.distributed.remote import (
    RemoteStats,
    RemoteVecEnv,
    ShardFailure,
    WorkerError,
    WorkerLostError,
    WorkerTimeoutError,
    make_remote,
)
from myriad.distributed.rollout import APSCollector, RolloutBatch, state_dict_bytes
from myriad.distributed.shards import derive_seed, shard_seed, split_envs
from myriad.distributed.worker import EnvWorker, WorkerStateLost
from myriad.envs.base import VecEnv


def make_distributed(
    name: str,
    num_envs: int,
    distributed: dict[str, Any] | str,
    device: torch.device | str,
    options: dict[str, Any],
) -> VecEnv:
    """``num_envs`` envs ``name`` with ``options`` on Ray workers, as the ``distributed``
    preset name or mapping of a run config says."""
    return RemoteVecEnv.from_config(name, num_envs, distributed, device, env_options=options)


__all__ = [
    "APSCollector",
    "APSConfig",
    "AdaptiveSync",
    "DistributedConfig",
    "EnvWorker",
    "LinearPolicy",
    "RayConfig",
    "RemoteStats",
    "RemoteVecEnv",
    "RolloutBatch",
    "ShardFailure",
    "WorkerConfig",
    "WorkerError",
    "WorkerLostError",
    "WorkerPolicy",
    "WorkerStateLost",
    "WorkerSyncStats",
    "WorkerTimeoutError",
    "as_dist_params",
    "derive_seed",
    "dist_kl",
    "dist_log_prob",
    "dist_sample",
    "init_ray",
    "load_config",
    "make_distributed",
    "make_remote",
    "mean_policy_kl",
    "preset_names",
    "shard_seed",
    "split_envs",
    "state_dict_bytes",
]
