"""Shared on-policy machinery: rollout storage, GAE, PPO loss pieces, collection, runners and
the role of this process in a run."""

from myriad.rl.collector import (
    EpisodeSums,
    EpisodeTracker,
    RolloutCollector,
    env_state_dict,
    load_env_state_dict,
)
from myriad.rl.gae import compute_gae
from myriad.rl.losses import (
    adaptive_lr,
    approx_kl,
    clip_fraction,
    clipped_surrogate,
    clipped_value_loss,
    entropy_bonus,
    exact_gaussian_kl,
    explained_variance,
    normalize_advantages,
)
from myriad.rl.on_policy import OnPolicyRunner
from myriad.rl.ppo import PPO, LossTerm, PPOConfig, RewardBonus
from myriad.rl.roles import ProcessRole, SingleProcess
from myriad.rl.runner import RunnerBase, plain_config
from myriad.rl.storage import Batch, RolloutStorage
from myriad.utils.checkpoint import ConfigMismatchError

__all__ = [
    "PPO",
    "Batch",
    "ConfigMismatchError",
    "EpisodeSums",
    "EpisodeTracker",
    "LossTerm",
    "OnPolicyRunner",
    "PPOConfig",
    "ProcessRole",
    "RewardBonus",
    "RolloutCollector",
    "RolloutStorage",
    "RunnerBase",
    "SingleProcess",
    "adaptive_lr",
    "approx_kl",
    "clip_fraction",
    "clipped_surrogate",
    "clipped_value_loss",
    "compute_gae",
    "entropy_bonus",
    "env_state_dict",
    "exact_gaussian_kl",
    "explained_variance",
    "load_env_state_dict",
    "normalize_advantages",
    "plain_config",
]
