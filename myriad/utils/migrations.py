"""Every layout change of checkpoints and run configs, in one place: older files are brought up
to the current layout when they are read, so the code that loads them knows one layout only.

A checkpoint records its ``format`` (:data:`myriad.utils.checkpoint.FORMAT_VERSION`);
:func:`migrate_checkpoint` applies, in order, each step of :data:`CHECKPOINT_STEPS` whose version
is above it. A run folder's ``config.yaml`` has no version: :func:`migrate_config` applies the
config steps, each of which only rewrites keys that current configs never hold.

The changes, and the version that first wrote the new layout:

1. ``population`` keys renamed to the fields of ``PopulationConfig`` (``kind`` ->
   ``parameterization``, ``hidden`` -> ``actor_hidden`` and ``critic_hidden``, ``obs_norm`` ->
   ``normalize_obs``); config step.
2. ``population.value_stats`` added: configs without it had one return statistic for the
   population (``shared``); config step.
3. Env episode statistics moved from the env's tensors (``episode_return``,
   ``episode_length``) to an ``episode`` entry; format 2.
4. The episode tracker's sums gained a success row (``[return, length, count]`` ->
   ``[return, length, success, count]``) and a ``has_success`` flag; format 2.
5. Finetuning envs were wrapped in a task-statistics env keeping the success sums
   (``env = {"state_dict": {"env", "sums": [return, success, count], "has_success"}}``); the
   collector's tracker keeps them now; format 2.
6. The KL set point gained a repulsion and a damping term (``repulsion``, ``last_error``,
   ``error_change``; none yet: zeros and NaN); format 2.
7. The dataset recorder records ``base_rows``, the rows of the published file that the run's
   first checkpointed rows follow; older checkpoints get ``None``, which the recorder reads as
   "a finished published file belongs to the run" (what those versions did); format 2.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import torch

#: ``population`` keys of older configs and the fields each stands for.
LEGACY_POPULATION_KEYS: dict[str, tuple[str, ...]] = {
    "kind": ("parameterization",),
    "hidden": ("actor_hidden", "critic_hidden"),
    "obs_norm": ("normalize_obs",),
}


def migrate_population(population: Mapping[str, Any]) -> dict[str, Any]:
    """Changes 1 and 2 on one ``population`` section (a field given under its own name wins
    over a legacy key)."""
    out = {k: v for k, v in population.items() if k not in LEGACY_POPULATION_KEYS}
    for key, names in LEGACY_POPULATION_KEYS.items():
        if key in population:
            for name in names:
                out.setdefault(name, population[key])
    out.setdefault("value_stats", "shared")
    return out


def migrate_config(config: dict[str, Any]) -> dict[str, Any]:
    """A run config (``config.yaml`` or a checkpoint's) in the current layout; ``config`` is
    changed in place and returned."""
    if isinstance(config.get("population"), Mapping):
        config["population"] = migrate_population(config["population"])
    return config


def _collector_states(state: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """The collector entries of a checkpoint's state: the run's, or one per rank of a
    ``torchrun`` launch."""
    collector = state.get("collector")
    if not isinstance(collector, dict):
        return
    if "ranks" in collector:
        for rank in collector["ranks"]:
            if isinstance(rank, dict) and isinstance(rank.get("collector"), dict):
                yield rank["collector"]
    elif "env" in collector:
        yield collector


def _unwrap_task_statistics(collector: dict[str, Any]) -> None:
    """Change 5."""
    env = collector.get("env")
    wrapped = env.get("state_dict") if isinstance(env, dict) else None
    if not (isinstance(wrapped, dict) and {"env", "sums", "has_success"} <= set(wrapped)):
        return
    sums = collector["episodes"]["sums"]  # [return, length, count]
    success = wrapped["sums"][1].to(sums)
    collector["env"] = wrapped["env"]
    collector["episodes"] = {
        "sums": torch.stack([sums[0], sums[1], success, sums[2]]),
        "has_success": bool(wrapped["has_success"]),
    }


def _episode_entry(env: dict[str, Any]) -> None:
    """Change 3."""
    tensors = env.get("tensors")
    if "episode" in env or not isinstance(tensors, dict):
        return
    if "episode_return" in tensors and "episode_length" in tensors:
        env["episode"] = {
            "returns": tensors.pop("episode_return"),
            "lengths": tensors.pop("episode_length"),
        }


def _success_row(episodes: dict[str, Any]) -> None:
    """Change 4."""
    sums = episodes["sums"]
    if sums.shape[0] == 3:
        episodes["sums"] = torch.stack([sums[0], sums[1], torch.zeros_like(sums[0]), sums[2]])
    episodes.setdefault("has_success", False)


def _setpoint_terms(setpoint: dict[str, Any]) -> None:
    """Change 6."""
    log_kl = setpoint["log_kl_coef"]
    setpoint.setdefault("repulsion", torch.zeros_like(log_kl))
    setpoint.setdefault("last_error", torch.full_like(log_kl, math.nan))
    setpoint.setdefault("error_change", torch.zeros_like(log_kl))


def _to_format_2(payload: dict[str, Any]) -> None:
    if isinstance(payload.get("config"), dict):
        migrate_config(payload["config"])
    state = payload["state"]
    for collector in _collector_states(state):
        _unwrap_task_statistics(collector)
        if isinstance(collector.get("env"), dict):
            _episode_entry(collector["env"])
        if isinstance(collector.get("episodes"), dict):
            _success_row(collector["episodes"])
    algorithm = state.get("algorithm")
    if isinstance(algorithm, dict) and isinstance(algorithm.get("kl_setpoint"), dict):
        _setpoint_terms(algorithm["kl_setpoint"])
    dataset = state.get("dataset")
    if isinstance(dataset, dict):
        dataset.setdefault("base_rows", None)


#: ``(version, step)``: the step brings a checkpoint of an older format to ``version``.
CHECKPOINT_STEPS: tuple[tuple[int, Callable[[dict[str, Any]], None]], ...] = ((2, _to_format_2),)


def migrate_checkpoint(payload: dict[str, Any]) -> dict[str, Any]:
    """A loaded checkpoint in the current layout (changed in place and returned): the steps
    above its ``format`` (the config steps on its config among them)."""
    fmt = int(payload.get("format", 0))
    for version, step in CHECKPOINT_STEPS:
        if fmt < version:
            step(payload)
    if CHECKPOINT_STEPS:
        payload["format"] = max(fmt, CHECKPOINT_STEPS[-1][0])
    return payload
