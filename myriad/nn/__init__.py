"""Neural networks: the population actor-critic and closed-form action distributions."""

from myriad.nn.distributions import (
    categorical_entropy,
    categorical_kl,
    categorical_log_prob,
    gaussian_entropy,
    gaussian_kl,
    gaussian_log_prob,
    gaussian_sample,
    pairwise_categorical_kl,
    pairwise_gaussian_kl,
)
from myriad.nn.population import (
    PARAMETERIZATIONS,
    ActResult,
    Evaluation,
    PopulationActorCritic,
    PopulationConfig,
    PopulationLinear,
    block_members,
    is_blocked,
    member_blocks,
)

__all__ = [
    "PARAMETERIZATIONS",
    "ActResult",
    "Evaluation",
    "PopulationActorCritic",
    "PopulationConfig",
    "PopulationLinear",
    "block_members",
    "categorical_entropy",
    "categorical_kl",
    "categorical_log_prob",
    "gaussian_entropy",
    "gaussian_kl",
    "gaussian_log_prob",
    "gaussian_sample",
    "is_blocked",
    "member_blocks",
    "pairwise_categorical_kl",
    "pairwise_gaussian_kl",
]
