"""The finetuning algorithms by name, built from the resolved run config.

:data:`ALGORITHMS` maps each name to its builder and to the settings dataclasses whose fields are
its ``algo.*`` keys. Every algorithm is a :class:`~myriad.finetune.base.FinetuneAlgorithm`: a
:class:`~myriad.rl.PPO` (the update loop over the shared rollout) with its own loss terms and
hooks, and the attributes the runner reads (``needs_transitions``, ``leader``,
``end_iteration``) with PPO's defaults.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from myriad.finetune.base import FinetuneAlgorithm
from myriad.finetune.cpo import CPO, CPOConfig
from myriad.finetune.pbt import PBT, PBTConfig
from myriad.finetune.sapg import SAPG, SAPGConfig
from myriad.nn.population import PopulationActorCritic
from myriad.rl.ppo import PPOConfig, ppo_config
from myriad.utils.config import ConfigError, config_dir
from myriad.utils.seeding import make_generator, stream_seed
from myriad.utils.settings import field_names, from_config


@dataclass(frozen=True)
class Inputs:
    """What every builder gets: the population, PPO's settings, the ``algo`` block's settings
    (one dataclass per entry of :attr:`AlgorithmEntry.settings`), the minibatch generator and
    the run's seed."""

    model: PopulationActorCritic
    ppo: PPOConfig
    settings: tuple[Any, ...]
    generator: torch.Generator
    seed: int


@dataclass(frozen=True)
class AlgorithmEntry:
    """One algorithm of the registry.

    Attributes:
        build: makes the algorithm from :class:`Inputs`.
        settings: dataclasses whose fields are the algorithm's ``algo.*`` keys.
        members: the population sizes it accepts, as ``(check, message)``: ``check(M)`` is True
            for a usable size, else ``message`` (formatted with ``m``) is the error.
        presets: the keys outside ``algo`` that the algorithm sets (dotted, e.g.
            ``population.size``); its file ``configs/algo/<name>.yaml`` holds exactly these and
            the ``algo`` defaults.
    """

    build: Callable[[Inputs], FinetuneAlgorithm]
    settings: tuple[type, ...]
    members: tuple[Callable[[int], bool], str]
    presets: Mapping[str, Any]


def _ppo(x: Inputs) -> FinetuneAlgorithm:
    return FinetuneAlgorithm(x.model, x.ppo, generator=x.generator)


def _sapg(x: Inputs) -> FinetuneAlgorithm:
    return SAPG(x.model, x.ppo, *x.settings, generator=x.generator)


def _cpo(x: Inputs) -> FinetuneAlgorithm:
    return CPO(x.model, x.ppo, *x.settings, generator=x.generator)


def _pbt(x: Inputs) -> FinetuneAlgorithm:
    pbt_generator = torch.Generator().manual_seed(stream_seed(x.seed, "pbt"))
    return PBT(x.model, x.ppo, *x.settings, generator=x.generator, pbt_generator=pbt_generator)


_LEADER_AND_FOLLOWERS = (
    lambda m: m >= 2,
    "algo={name} needs a leader and followers: population.size >= 2",
)

ALGORITHMS: dict[str, AlgorithmEntry] = {
    "cpo": AlgorithmEntry(
        _cpo, (SAPGConfig, CPOConfig), _LEADER_AND_FOLLOWERS, {"population.size": 4}
    ),
    "sapg": AlgorithmEntry(_sapg, (SAPGConfig,), _LEADER_AND_FOLLOWERS, {"population.size": 4}),
    "ppo": AlgorithmEntry(
        _ppo,
        (),
        (
            lambda m: m == 1,
            "algo=ppo trains one policy over all envs: population.size must be 1, got {m}",
        ),
        {"population.size": 1},
    ),
    "pbt": AlgorithmEntry(
        _pbt,
        (PBTConfig,),
        (lambda m: m >= 2, "algo=pbt needs population.size >= 2, got {m}"),
        # Independent members (each mutates its own hyperparameters) on a fixed base rate that
        # each member's lr_scale multiplies.
        {
            "population.size": 8,
            "population.parameterization": "independent",
            "ppo.desired_kl": None,
            "ppo.schedule": "fixed",
        },
    ),
}


def check_algorithm(name: str) -> str:
    """``name`` if it is a known algorithm.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    if name not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return name


def check_algorithm_config(name: str) -> str:
    """``name`` if it is an algorithm or one of the presets of ``configs/algo`` (a file whose
    ``algo.name`` is the algorithm, e.g. ``cpo_paper_shadowhand``).

    Raises:
        ConfigError: no such file (the message lists them).
    """
    options = sorted(p.stem for p in (config_dir() / "algo").glob("*.yaml"))
    if name not in options:
        presets = [o for o in options if o not in ALGORITHMS]
        raise ConfigError(
            f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)} "
            f"(presets: {', '.join(presets)})"
        )
    return name


def algorithm_sections(algo: Mapping[str, Any]) -> tuple[str, list[tuple[type, dict[str, Any]]]]:
    """An ``algo`` config section split into its algorithm's name and, per settings dataclass
    of :attr:`AlgorithmEntry.settings`, the keys that are its fields.

    Raises:
        ConfigError: unknown algorithm, or a key that no settings dataclass has (the message
            lists the algorithm's settings).
    """
    values = {k: v for k, v in algo.items() if k != "name"}
    name = check_algorithm(str(algo.get("name")))
    entry = ALGORITHMS[name]
    known = {field for cls in entry.settings for field in field_names(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"algo={name} has no setting(s) {unknown}; its settings: "
            f"{', '.join(sorted(known | {'name'}))}"
        )
    return name, [
        (cls, {k: v for k, v in values.items() if k in field_names(cls)}) for cls in entry.settings
    ]


def build_algorithm(
    cfg: Mapping[str, Any], model: PopulationActorCritic, seed: int
) -> FinetuneAlgorithm:
    """The algorithm named by ``cfg["algo"]["name"]`` over ``model``.

    Raises:
        ConfigError: unknown algorithm or setting, a bad setting, or a population size the
            algorithm cannot use.
    """
    name, sections = algorithm_sections(cfg["algo"])
    entry = ALGORITHMS[name]
    usable, message = entry.members
    if not usable(model.num_members):
        raise ConfigError(message.format(name=name, m=model.num_members))
    settings: tuple[Any, ...] = tuple(from_config(cls, values, "algo") for cls, values in sections)
    generator = make_generator(stream_seed(seed, "minibatches"), model.log_std.device)
    return entry.build(Inputs(model, ppo_config(cfg), settings, generator, seed))
