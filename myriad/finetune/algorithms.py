"""The finetuning algorithms by name, built from the resolved run config.

Every algorithm is a :class:`~myriad.rl.PPO` (the update loop over the shared rollout) with
its own loss terms and hooks. The runner reads three optional attributes:

- ``needs_transitions`` (default False): the collector must store each step's ``next_obs``;
- ``leader`` (default 0): the member reported and evaluated as the leader;
- ``end_iteration(returns [M], counts [M]) -> dict`` (default: none): called after each
  iteration with the per-member sums of finished episodes' returns and their counts (PBT's
  exploit/explore rounds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from myriad.finetune.cpo import CPO, CPOConfig
from myriad.finetune.pbt import PBT, PBTConfig
from myriad.finetune.sapg import SAPG, SAPGConfig
from myriad.nn.population import PopulationActorCritic
from myriad.rl.ppo import PPO, ppo_config
from myriad.utils.config import ConfigError
from myriad.utils.seeding import make_generator

ALGORITHMS = ("cpo", "sapg", "ppo", "pbt")


def check_algorithm(name: str) -> str:
    """``name`` if it is a known algorithm.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    if name not in ALGORITHMS:
        raise ConfigError(f"unknown algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    return name


def _settings(name: str, cls: type, algo: Mapping[str, Any]) -> Any:
    """The dataclass ``cls`` from the entries of ``algo`` that are its fields.

    Raises:
        ConfigError: a value the dataclass refuses (its message, prefixed with the algorithm).
    """
    fields = cls.__dataclass_fields__
    try:
        return cls(**{k: v for k, v in algo.items() if k in fields})
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"algo={name}: {exc}") from exc


_FIELDS: dict[str, tuple[str, ...]] = {
    "ppo": (),
    "sapg": tuple(SAPGConfig.__dataclass_fields__),
    "cpo": (*SAPGConfig.__dataclass_fields__, *CPOConfig.__dataclass_fields__),
    "pbt": tuple(PBTConfig.__dataclass_fields__),
}


def build_algorithm(cfg: Mapping[str, Any], model: PopulationActorCritic, seed: int) -> PPO:
    """The algorithm named by ``cfg["algo"]["name"]`` over ``model``.

    Raises:
        ConfigError: unknown algorithm, or a population size the algorithm cannot use.
    """
    algo = dict(cfg["algo"])
    name = check_algorithm(str(algo["name"]))
    known = {"name"} | set(_FIELDS[name])
    unknown = sorted(set(algo) - known)
    if unknown:
        raise ConfigError(
            f"algo={name} has no setting(s) {unknown}; its settings: {', '.join(sorted(known))}"
        )
    device = model.log_std.device
    generator = make_generator(seed + 1, device)
    ppo = ppo_config(cfg)
    m = model.num_members
    if name == "ppo":
        if m != 1:
            raise ConfigError(
                f"algo=ppo trains one policy over all envs: population.size must be 1, got {m}"
            )
        return PPO(model, ppo, generator=generator)
    if name == "pbt":
        if m < 2:
            raise ConfigError(f"algo=pbt needs population.size >= 2, got {m}")
        pbt_generator = torch.Generator().manual_seed(seed + 2)
        return PBT(
            model,
            ppo,
            _settings(name, PBTConfig, algo),
            generator=generator,
            pbt_generator=pbt_generator,
        )
    if m < 2:
        raise ConfigError(f"algo={name} needs a leader and followers: population.size >= 2")
    sapg = _settings(name, SAPGConfig, algo)
    if name == "sapg":
        return SAPG(model, ppo, sapg, generator=generator)
    return CPO(model, ppo, sapg, _settings(name, CPOConfig, algo), generator=generator)
