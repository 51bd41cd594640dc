"""The schema of ``myriad finetune``: every key with its type, default, range and help, in code.

:class:`FinetuneSettings` holds the run keys and the ``ppo``, ``init``, ``eval`` and
``diagnostics`` sections; ``population`` is :class:`~myriad.nn.PopulationConfig`; ``algo`` is
``name`` plus the fields of the algorithm's settings dataclasses
(:data:`~myriad.finetune.algorithms.ALGORITHMS`). The packaged ``configs/finetune.yaml`` and
``configs/algo/<name>.yaml`` hold exactly these defaults (``tests/test_settings_schema.py``),
so ``CPO(model, PPOConfig(), SAPGConfig(), CPOConfig())`` in Python and
``myriad finetune --algo cpo`` run the same algorithm.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from myriad.assess.evaluation import PERTURBATIONS
from myriad.finetune.algorithms import ALGORITHMS, algorithm_sections, check_algorithm
from myriad.nn.population import ENV_SIZE_FIELDS, PopulationConfig
from myriad.rl.ppo import PPOConfig
from myriad.utils.run_settings import RunSettings
from myriad.utils.settings import (
    SettingRow,
    at_least,
    between,
    check_values,
    defaults,
    describe,
    one_of,
    setting,
)


@dataclass
class InitSettings:
    """The ``init`` section, used with ``--init`` (rule: docs/finetune.md)."""

    source: str | None = setting(None, help="the pretraining run or checkpoint (set by --init)")
    episodes: int = setting(
        64, help="task episodes per pretrained member for the ranking", check=at_least(1)
    )
    deterministic: bool = setting(
        False, help="rank by mean actions (false: sampled, as the members act when finetuning)"
    )
    critic: str = setting(
        "fresh",
        help="fresh | pretrained (pretrained critics predict the intrinsic return)",
        check=one_of("fresh", "pretrained"),
    )
    critic_warmup: int = setting(
        10, help="first iterations fit only the fresh critics (actors frozen)", check=at_least(0)
    )
    rank_options: Mapping[str, Any] = setting(
        factory=dict, help="env options of the ranking episodes (task=sparse ranks on task=dense)"
    )


@dataclass
class FinetuneEvalSettings:
    """The ``eval`` section: every member, deterministic actions, fresh envs, one batched
    rollout."""

    every: int = setting(
        10, help="iterations between evaluations (0: only at the end)", check=at_least(0)
    )
    episodes: int = setting(64, help="episodes per member", check=at_least(1))
    final_episodes: int = setting(128, help="episodes per member at the end", check=at_least(1))
    solution_share: float = setting(
        0.05,
        help="a solution counts with >= this share of the successful episodes",
        check=between(0, 1),
    )
    solution_bins: int = setting(
        4,
        help="grid cells per feature of the solution regions (envs without a layout)",
        check=at_least(1),
    )
    perturb: str | None = setting(
        None,
        help="block_leader_route: evaluate again with the leader's route walled off",
        check=one_of(*PERTURBATIONS),
    )
    sampled: bool = setting(
        False,
        help="also evaluate with sampled actions, as in training (eval/*_sampled)",
    )


@dataclass
class DiagnosticsSettings:
    """The ``diagnostics`` section."""

    states_per_member: int = setting(
        256, help="rollout states per member for the KL diagnostics", check=at_least(1)
    )


@dataclass
class FinetuneSettings(RunSettings):
    """Every key of ``myriad finetune`` except ``env``, ``task``, ``population``, ``algo`` and
    ``distributed`` (their own schemas)."""

    num_envs: int = setting(
        1024,
        help="parallel envs, split into population.size contiguous blocks (member 0: the leader)",
        check=at_least(1),
    )
    iterations: int = setting(80, help="iterations of the run", check=at_least(1))
    ppo: PPOConfig = setting(factory=PPOConfig, help="PPO, shared by every algorithm")
    init: InitSettings = setting(factory=InitSettings, help="--init")
    eval: FinetuneEvalSettings = setting(factory=FinetuneEvalSettings, help="evaluation")
    diagnostics: DiagnosticsSettings = setting(factory=DiagnosticsSettings, help="diagnostics")


#: Sections with a schema of their own (env and task: the env's options; distributed: Ray).
OWN_SCHEMA = ("env", "task", "population", "algo", "distributed")


def algo_defaults(name: str) -> dict[str, Any]:
    """The ``algo`` section of ``name`` with every key at its default."""
    out: dict[str, Any] = {"name": check_algorithm(name)}
    for cls in ALGORITHMS[name].settings:
        out.update(defaults(cls))
    return out


def describe_finetune(algo: str) -> list[SettingRow]:
    """Every key of ``myriad finetune --algo <algo>``: run keys and sections, ``population``,
    ``algo``."""
    presets = ALGORITHMS[check_algorithm(algo)].presets
    rows = describe(FinetuneSettings)
    rows += describe(PopulationConfig, "population.", skip=ENV_SIZE_FIELDS)
    rows = [r._replace(default=presets.get(r.key, r.default)) for r in rows]
    rows.append(
        SettingRow(
            "algo.name", "a string", algo, "one of " + " | ".join(ALGORITHMS), "the algorithm"
        )
    )
    for cls in ALGORITHMS[check_algorithm(algo)].settings:
        rows += describe(cls, "algo.")
    return rows


def check_finetune_config(cfg: Mapping[str, Any]) -> None:
    """Check a composed (or resumed) finetuning config against the schema: unknown keys,
    types and ranges.

    Raises:
        ConfigError: naming the key and what it must be.
    """
    run = {k: v for k, v in cfg.items() if k not in OWN_SCHEMA}
    check_values(FinetuneSettings, run, "")
    if isinstance(cfg.get("population"), Mapping):
        check_values(PopulationConfig, cfg["population"], "population", skip=ENV_SIZE_FIELDS)
    algo = cfg.get("algo")
    if isinstance(algo, Mapping):
        for cls, values in algorithm_sections(algo)[1]:
            check_values(cls, values, "algo")


#: The CPO keys that are the set point's initial values when a KL target is set.
INITIAL_VALUE_KEYS = ("algo.kl_preset", "algo.kl_coef", "algo.adversarial_coef")


def note_coupling_mode(algo: Mapping[str, Any], overrides: Sequence[str]) -> None:
    """One line on stderr when an override sets a coefficient that the KL set point (on by
    default) only starts from: the meaning of a key never depends on which keys were typed, so
    the user is told how to get fixed coefficients instead."""
    target = algo.get("kl_targets") or algo.get("kl_target")
    named = [o.split("=", 1)[0].lstrip("+~") for o in overrides]
    fixed = [k for k in named if k in INITIAL_VALUE_KEYS]
    if target is not None and fixed:
        print(
            f"myriad: note: {', '.join(fixed)} set the starting values of the KL set point "
            f"(algo.kl_target={target}); add algo.kl_target=null for fixed coefficients",
            file=sys.stderr,
        )
