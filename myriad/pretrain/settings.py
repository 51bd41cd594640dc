"""The schema of ``myriad pretrain``: every key with its type, default, range and help, in code.

:class:`PretrainSettings` holds the run keys and the ``ppo``, ``dataset`` and ``eval`` sections;
``population`` is :class:`~myriad.nn.PopulationConfig` with :data:`POPULATION_DEFAULTS`;
``objective`` is :class:`KNNRewardSettings` or :class:`MEPOLSettings` by its ``name``. The
packaged ``configs/pretrain.yaml`` and ``configs/objective/*.yaml`` hold exactly these defaults
(``tests/test_settings_schema.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from myriad.entropy.knn import BACKENDS
from myriad.nn.population import ENV_SIZE_FIELDS, PopulationConfig
from myriad.rl.ppo import PPOConfig
from myriad.utils.config import ConfigError
from myriad.utils.run_settings import RunSettings
from myriad.utils.settings import (
    SettingRow,
    at_least,
    between,
    check_values,
    describe,
    one_of,
    positive,
    setting,
)

#: Where pretraining's population defaults differ from PopulationConfig's: one return statistic
#: for the population (every member is paid the same collective reward).
POPULATION_DEFAULTS: dict[str, Any] = {"value_stats": "shared"}


def pretrain_ppo() -> PPOConfig:
    """PPO's defaults for pretraining: a longer horizon (gamma 0.995), 2 minibatches, a looser
    KL target and ceiling (fresh networks, a reward that moves every iteration)."""
    return PPOConfig(minibatches=2, gamma=0.995, desired_kl=0.02, max_lr=1e-2)


@dataclass
class DatasetSettings:
    """The ``dataset`` section: the transitions the run writes."""

    enabled: bool = setting(True, help="write every rollout's transitions")
    path: str = setting("dataset/transitions.hdf5", help="relative to the run folder")


@dataclass
class PretrainEvalSettings:
    """The ``eval`` section."""

    episodes: int = setting(
        1,
        help="full episodes per env of the final population (coverage, plots)",
        check=at_least(1),
    )


@dataclass
class PretrainSettings(RunSettings):
    """Every key of ``myriad pretrain`` except ``env``, ``population``, ``objective`` and
    ``distributed`` (their own schemas)."""

    ppo: PPOConfig = setting(factory=pretrain_ppo, help="PPO on the intrinsic reward")
    dataset: DatasetSettings = setting(factory=DatasetSettings, help="the run's dataset")
    eval: PretrainEvalSettings = setting(factory=PretrainEvalSettings, help="final evaluation")


@dataclass
class _EntropySettings:
    k: int = setting(10, help="neighbours of the k-NN entropy estimate", check=at_least(1))
    beta: float = setting(
        1.0, help="1: collective (K-Myriad), 0: independent explorers", check=between(0, 1)
    )
    backend: str = setting("auto", help="k-NN backend", check=one_of(*BACKENDS))
    min_distance: float = setting(
        1e-3,
        help="resolution of the std-scaled features (duplicate-state guard)",
        check=positive(),
    )


@dataclass
class KNNRewardSettings(_EntropySettings):
    """``objective=knn_reward`` (docs/algorithms.md §3): per-state k-NN reward optimised with
    PPO."""

    name: str = setting("knn_reward", help="the objective")
    c: float = setting(
        1.0,
        help="reward = log(c + R_k) on features scaled by their running std",
        check=positive(),
    )


@dataclass
class MEPOLSettings(_EntropySettings):
    """``objective=mepol`` (docs/algorithms.md §4): importance-weighted k-NN entropy with a KL
    trust region."""

    name: str = setting("mepol", help="the objective")
    kl_threshold: float = setting(
        0.1, help="inner steps stop when D_KL(theta_old || theta) exceeds it", check=positive()
    )
    inner_steps: int = setting(10, help="policy steps per rollout", check=at_least(1))
    lr: float = setting(1e-3, help="Adam learning rate", check=positive())


OBJECTIVES: dict[str, type] = {"knn_reward": KNNRewardSettings, "mepol": MEPOLSettings}

#: Sections with a schema of their own (env: the env's options; distributed: Ray).
OWN_SCHEMA = ("env", "population", "objective", "distributed")


def objective_settings(name: str) -> type:
    """The settings dataclass of objective ``name``.

    Raises:
        ConfigError: unknown objective.
    """
    if name not in OBJECTIVES:
        raise ConfigError(
            f"unknown objective {name!r}; choose objective=" + " or objective=".join(OBJECTIVES)
        )
    return OBJECTIVES[name]


def describe_pretrain(objective: str = "knn_reward") -> list[SettingRow]:
    """Every key of ``myriad pretrain`` with ``objective=<objective>``."""
    rows = describe(PretrainSettings)
    for row in describe(PopulationConfig, "population.", skip=ENV_SIZE_FIELDS):
        name = row.key.removeprefix("population.")
        rows.append(row._replace(default=POPULATION_DEFAULTS.get(name, row.default)))
    return rows + describe(objective_settings(objective), "objective.")


def check_pretrain_config(cfg: Mapping[str, Any]) -> None:
    """Check a composed (or resumed) pretraining config against the schema.

    Raises:
        ConfigError: naming the key and what it must be.
    """
    check_values(PretrainSettings, {k: v for k, v in cfg.items() if k not in OWN_SCHEMA}, "")
    if isinstance(cfg.get("population"), Mapping):
        check_values(PopulationConfig, cfg["population"], "population", skip=ENV_SIZE_FIELDS)
    objective = cfg.get("objective")
    if isinstance(objective, Mapping):
        cls = objective_settings(str(objective.get("name")))
        check_values(cls, objective, "objective")
