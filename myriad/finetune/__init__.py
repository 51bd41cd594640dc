"""Finetuning a population on a task reward: CPO, SAPG, PPO and PBT over one shared rollout."""

from myriad.finetune.algorithms import ALGORITHMS, build_algorithm
from myriad.finetune.api import finetune
from myriad.finetune.cpo import CPO, KL_PRESETS, AWACPullTerm, CPOConfig
from myriad.finetune.discriminator import (
    AdversarialReward,
    Discriminator,
    DiscriminatorConfig,
    rollout_labels,
)
from myriad.finetune.init import InitError, InitReport, initialise, member_mapping, rank_members
from myriad.finetune.pbt import PBT, MemberScaledAdam, PBTConfig, exploit_explore
from myriad.finetune.runner import FinetuneRunner
from myriad.finetune.sapg import SAPG, LeaderOffPolicyTerm, SAPGConfig

__all__ = [
    "ALGORITHMS",
    "CPO",
    "KL_PRESETS",
    "PBT",
    "SAPG",
    "AWACPullTerm",
    "AdversarialReward",
    "CPOConfig",
    "Discriminator",
    "DiscriminatorConfig",
    "FinetuneRunner",
    "InitError",
    "InitReport",
    "LeaderOffPolicyTerm",
    "MemberScaledAdam",
    "PBTConfig",
    "SAPGConfig",
    "build_algorithm",
    "exploit_explore",
    "finetune",
    "initialise",
    "member_mapping",
    "rank_members",
    "rollout_labels",
]
