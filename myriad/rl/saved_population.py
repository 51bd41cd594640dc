"""The population a run saved: the model in a checkpoint of ``myriad pretrain`` or
``myriad finetune``, rebuilt from the checkpoint's own config (finetuning's ``--init``,
``myriad render``, ``myriad report``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from myriad.envs import make_from_config
from myriad.nn.population import PopulationActorCritic, build_population
from myriad.utils.checkpoint import load_checkpoint, resolve_checkpoint
from myriad.utils.config import ConfigError


class PopulationLoadError(ConfigError):
    """A checkpoint holds no population, or weights that do not fit its own config."""


@dataclass
class SavedPopulation:
    """A population loaded from a run or checkpoint.

    Attributes:
        path: the checkpoint file.
        config: its run config.
        env: its env config (``name``, ``options``).
        model: the population with the checkpoint's weights.
    """

    path: Path
    config: dict[str, Any]
    env: dict[str, Any]
    model: PopulationActorCritic


def load_population(
    source: str | os.PathLike[str], device: torch.device | str = "cpu"
) -> SavedPopulation:
    """Load the population of a run folder, ``checkpoints/`` folder or checkpoint file.

    Raises:
        FileNotFoundError: nothing loadable at ``source``.
        PopulationLoadError: the checkpoint holds no population, or its weights do not fit its
            config.
    """
    path = resolve_checkpoint(source)
    payload = load_checkpoint(path)
    config = payload.get("config") or {}
    state = (payload.get("state") or {}).get("model")
    if state is None or "population" not in config or "env" not in config:
        raise PopulationLoadError(
            f"{path} holds no population to start from: expected a checkpoint of "
            f"`myriad pretrain` (or `myriad finetune`) with state.model and a config with "
            f"env and population"
        )
    env_cfg = dict(config["env"])
    env = make_from_config(env_cfg, 1, "cpu")
    try:
        model = build_population(config["population"], env.obs_dim, env.action_dim)
    finally:
        env.close()
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:
        raise PopulationLoadError(
            f"the weights in {path} do not match its own population config: {exc}"
        ) from exc
    return SavedPopulation(path, config, env_cfg, model.to(device))
