"""Starting a finetuning population from a pretrained one (the ``--init`` rule).

The rule:

1. Every pretrained member runs ``episodes`` episodes of the finetuning task, acting as it will
   when finetuning starts (sampled actions unless ``deterministic``), in fresh envs seeded from
   the run's seed.
2. Members are ranked by success rate, then mean return, then index (lower first).
3. Finetuning member ``i`` starts from the pretrained member of rank ``i mod K`` (K pretrained
   members): the best is the leader (member 0), the next M - 1 the followers, cycling through
   the ranking when M > K.
4. The actors, log standard deviations and observation normaliser come from the pretrained
   population. The critics are pretrained on the intrinsic reward, so by default
   (``critic="fresh"``) the critics and the value normaliser keep their fresh initialisation;
   ``critic="pretrained"`` loads them too.

The architecture of the finetuning population (every ``population`` field but ``size``:
``parameterization``, ``actor_hidden``, ``critic_hidden``, ``activation``, ...) is the pretrained
one; only its size is the finetuning config's. Observation and action spaces of the two stages
must match exactly, or :class:`InitError` lists every difference.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myriad.assess.evaluation import rollout_members
from myriad.envs import make_from_config
from myriad.envs.base import VecEnv
from myriad.nn.population import (
    ARCHITECTURE_FIELDS,
    PopulationActorCritic,
    build_population,
)
from myriad.rl.saved_population import load_population
from myriad.utils.config import ConfigError
from myriad.utils.faults import fault_point

CRITIC_CHOICES = ("fresh", "pretrained")


class InitError(ConfigError):
    """A pretrained population cannot start this finetuning run; the message lists why."""


def _describe_env(env_cfg: Mapping[str, Any]) -> str:
    options = dict(env_cfg.get("options") or {})
    extra = ", ".join(f"{k}={v}" for k, v in sorted(options.items()))
    return f"{env_cfg['name']}" + (f" ({extra})" if extra else "")


def _space_diff(name: str, a: Any, b: Any) -> list[str]:
    """Differences between two Box spaces: shape, then bounds."""
    if tuple(a.shape) != tuple(b.shape):
        return [f"{name} shape: {tuple(a.shape)} (pretrained) vs {tuple(b.shape)} (finetune)"]
    out = []
    for bound in ("low", "high"):
        x, y = np.asarray(getattr(a, bound)), np.asarray(getattr(b, bound))
        if not np.array_equal(x, y):
            out.append(f"{name} {bound}: {x.tolist()} (pretrained) vs {y.tolist()} (finetune)")
    return out


def space_differences(pretrained_env: VecEnv, env: VecEnv) -> list[str]:
    """Every difference between the observation and action spaces of two envs."""
    return _space_diff(
        "observation space", pretrained_env.single_observation_space, env.single_observation_space
    ) + _space_diff("action space", pretrained_env.single_action_space, env.single_action_space)


def init_config(cfg: dict[str, Any], source: str | Path, overrides: Sequence[str] = ()) -> None:
    """Take the architecture from the pretrained run into ``cfg`` (in place) and check that
    the two stages' spaces match; records the checkpoint as ``cfg["init"]["source"]``.

    Raises:
        InitError: an override sets an architecture key, or the spaces differ (every difference
            is listed).
    """
    fixed = [
        o
        for o in overrides
        if o.split("=", 1)[0].lstrip("+~") in {f"population.{k}" for k in ARCHITECTURE_FIELDS}
    ]
    if fixed:
        raise InitError(
            f"with --init the architecture comes from the pretrained population; drop "
            f"{', '.join(fixed)} (population.size may be set)"
        )
    pre = load_population(source)
    pretrained_env = make_from_config(pre.env, 1, "cpu")
    env = make_from_config(cfg["env"], 1, "cpu")
    try:
        diff = space_differences(pretrained_env, env)
    finally:
        pretrained_env.close()
        env.close()
    # The pretrained model's own architecture, whatever the run's population section says.
    population = dict(cfg["population"])
    population.update(
        {k: v for k, v in pre.model.config.to_dict().items() if k in ARCHITECTURE_FIELDS}
    )
    target = build_population(population, env.obs_dim, env.action_dim)
    diff += [d for d in target.compatibility(pre.model) if d not in diff]
    if diff:
        raise InitError(
            f"cannot initialise from {pre.path}: the pretrained population "
            f"({_describe_env(pre.env)}) does not fit this task ({_describe_env(cfg['env'])}):\n  "
            + "\n  ".join(diff)
        )
    cfg["population"] = population
    cfg.setdefault("init", {})
    cfg["init"]["source"] = str(pre.path)


def env_differences(pretrained: Mapping[str, Any], finetune: Mapping[str, Any]) -> list[str]:
    """Env name and options (``task`` aside) that differ between two env configs."""
    out = []
    if pretrained["name"] != finetune["name"]:
        out.append(f"env: {pretrained['name']} (pretrained) vs {finetune['name']} (finetune)")
    a, b = dict(pretrained.get("options") or {}), dict(finetune.get("options") or {})
    for key in sorted((set(a) | set(b)) - {"task"}):
        if a.get(key) != b.get(key):
            out.append(f"{key}: {a.get(key)} (pretrained) vs {b.get(key)} (finetune)")
    return out


def rank_members(success: torch.Tensor, returns: torch.Tensor) -> list[int]:
    """Member indices best first: by success rate, then mean return, then lower index."""
    k = len(success)
    return sorted(range(k), key=lambda i: (-float(success[i]), -float(returns[i]), i))


def member_mapping(ranking: Sequence[int], num_members: int) -> list[int]:
    """The pretrained member each of ``num_members`` finetuning members starts from:
    ``ranking[i mod K]``."""
    if not ranking:
        raise ValueError("the ranking is empty")
    return [ranking[i % len(ranking)] for i in range(num_members)]


@dataclass
class InitReport:
    """What ``--init`` did: per pretrained member its task success and return, the ranking
    (best first), per finetuning member the pretrained member it started from, and the env
    options other than ``task`` in which the two stages differ (allowed, but worth knowing:
    the members were trained under other dynamics)."""

    source: str
    success: list[float]
    returns: list[float]
    ranking: list[int]
    mapping: list[int]
    critic: str
    env_differences: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@torch.no_grad()
def initialise(
    model: PopulationActorCritic,
    source: str | os.PathLike[str],
    make_env: Callable[[int], VecEnv],
    *,
    episodes: int = 16,
    deterministic: bool = False,
    critic: str = "fresh",
    seed: int = 0,
    env: Mapping[str, Any] | None = None,
) -> InitReport:
    """Apply the ``--init`` rule (module docstring) to ``model`` in place.

    Args:
        model: the finetuning population (architecture as the pretrained one).
        source: run folder or checkpoint.
        make_env: builds the task env with a given number of envs.
        episodes: evaluation episodes per pretrained member.
        deterministic: rank by the policy means instead of sampled actions.
        critic: ``"fresh"`` or ``"pretrained"``.
        seed: evaluation seed.
        env: the finetuning env config, to report how it differs from the pretraining one.
    """
    if critic not in CRITIC_CHOICES:
        raise InitError(f"init.critic must be one of {CRITIC_CHOICES}, got {critic!r}")
    pre = load_population(source, model.log_std.device)
    diff = model.compatibility(pre.model)
    if diff:
        raise InitError(f"cannot initialise from {pre.path}:\n  " + "\n  ".join(diff))
    size = pre.model.num_members
    batch = rollout_members(
        pre.model, make_env, list(range(size)), episodes, deterministic=deterministic, seed=seed
    )
    scores = batch.scores(size)
    fault_point("init.ranked")  # a kill here must be continued by --resume RUN
    ranking = rank_members(scores.success, scores.returns)
    mapping = member_mapping(ranking, model.num_members)
    kept = {}
    if critic == "fresh":
        kept = {
            k: v.clone()
            for k, v in model.state_dict().items()
            if k.startswith(("critic.", "value_norm."))
        }
    model.load_members(pre.model, mapping, list(range(model.num_members)))
    if kept:
        state = model.state_dict()
        for key, value in kept.items():
            state[key].copy_(value)
    return InitReport(
        str(pre.path),
        [round(float(s), 6) for s in scores.success],
        [round(float(r), 6) for r in scores.returns],
        ranking,
        mapping,
        critic,
        env_differences(pre.env, env) if env is not None else [],
    )
