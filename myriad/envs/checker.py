"""Checks that an environment honours the VecEnv contract.

``check_env(env)`` runs every check and raises :class:`ContractError` listing all failures;
``myriad envs check NAME`` prints the same report. The test suite runs it on every registered env.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import gymnasium as gym
import numpy as np
import torch

from myriad.envs.base import ActionError, VecEnv


class ContractError(AssertionError):
    """An environment breaks the VecEnv contract; the message lists every failed check."""


@dataclass
class CheckReport:
    """Outcome of :func:`check_env`: one ``(check, ok, detail)`` row per check."""

    env: str
    rows: list[tuple[str, bool, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(ok for _, ok, _ in self.rows)

    def failures(self) -> list[str]:
        return [f"{name}: {detail}" for name, ok, detail in self.rows if not ok]


def _random_actions(env: VecEnv, gen: torch.Generator) -> torch.Tensor:
    return torch.rand(env.num_envs, env.action_dim, generator=gen).mul(2.2).sub(1.1).to(env.device)


def _check_spaces(env: VecEnv) -> str:
    if not isinstance(env.single_observation_space, gym.spaces.Box):
        return (
            f"single_observation_space must be a gymnasium Box, got {env.single_observation_space}"
        )
    act = env.single_action_space
    if not isinstance(act, gym.spaces.Box) or len(act.shape) != 1:
        return f"single_action_space must be a 1-D gymnasium Box, got {act}"
    if not (act.low == -1).all() or not (act.high == 1).all():
        return f"actions must live in [-1, 1], got low={act.low} high={act.high}"
    if env.features.dim < 1:
        return "env declares no entropy features"
    if env.max_episode_steps < 1:
        return f"max_episode_steps must be >= 1, got {env.max_episode_steps}"
    return ""


def _check_task_attributes(env: VecEnv) -> str:
    """``task``, ``layout`` and ``goal_pos``, which evaluation and figures read, have their
    declared types: a layout's wall grid has one entry per cell, ``goal_pos`` is a vector on the
    env's device."""
    if env.task is not None and not isinstance(env.task, str):
        return f"task must be a str or None, got {env.task!r}"
    if env.layout is not None:
        walls = np.asarray(env.layout.walls_xy())
        if walls.dtype != np.bool_ or walls.ndim != 2 or walls.all():
            return f"layout.walls_xy() must be a 2-D bool grid with free cells, got {walls!r}"
        x, y = env.layout.cell_center(0, 0)
        if not (math.isfinite(x) and math.isfinite(y)):
            return f"layout.cell_center(0, 0) must be finite, got {(x, y)}"
    goal = env.goal_pos
    if goal is not None and (
        not isinstance(goal, torch.Tensor) or goal.ndim != 1 or goal.device.type != env.device.type
    ):
        return f"goal_pos must be a 1-D tensor on {env.device} or None, got {goal!r}"
    return ""


def _check_reset(env: VecEnv, seed: int) -> str:
    obs = env.reset(seed=seed)
    expected = (env.num_envs, env.obs_dim)
    if tuple(obs.shape) != expected:
        return f"reset returned shape {tuple(obs.shape)}, expected {expected}"
    if obs.dtype != torch.float32:
        return f"observations must be float32, got {obs.dtype}"
    if obs.device != env.device:
        return f"observations on {obs.device}, env device is {env.device}"
    if not torch.isfinite(obs).all():
        return "reset returned non-finite observations"
    feats = env.current_features()
    if tuple(feats.shape) != (env.num_envs, env.features.dim):
        return f"current_features shape {tuple(feats.shape)}, expected ({env.num_envs}, p)"
    return ""


def _check_step(env: VecEnv, steps: int, seed: int) -> str:
    gen = torch.Generator().manual_seed(seed)
    env.reset(seed=seed)
    low, high = env.features.bounds(env.device)
    n, o = env.num_envs, env.obs_dim
    for t in range(steps):
        obs, rew, term, trunc, info = env.step(_random_actions(env, gen))
        shapes = {
            "obs": (obs, (n, o), torch.float32),
            "reward": (rew, (n,), torch.float32),
            "terminated": (term, (n,), torch.bool),
            "truncated": (trunc, (n,), torch.bool),
            "info['final_obs']": (info.get("final_obs"), (n, o), torch.float32),
            "info['features']": (info.get("features"), (n, env.features.dim), torch.float32),
            "info['done']": (info.get("done"), (n,), torch.bool),
        }
        for key, (value, shape, dtype) in shapes.items():
            if not isinstance(value, torch.Tensor):
                return f"step {t}: {key} missing or not a tensor"
            if tuple(value.shape) != shape or value.dtype != dtype:
                got = f"{tuple(value.shape)} {value.dtype}"
                return f"step {t}: {key} is {got}, expected {shape} {dtype}"
            if value.device != env.device:
                return f"step {t}: {key} on {value.device}, env device is {env.device}"
        if not (torch.isfinite(obs).all() and torch.isfinite(rew).all()):
            return f"step {t}: non-finite observation or reward"
        if (term & trunc).any():
            return f"step {t}: an env is both terminated and truncated"
        done = term | trunc
        if not torch.equal(info["done"], done):
            return f"step {t}: info['done'] differs from terminated | truncated"
        if not torch.equal(info["final_obs"][~done], obs[~done]):
            return f"step {t}: final_obs differs from obs for envs that did not end"
        feats = info["features"]
        if ((feats < low - 1e-4) | (feats > high + 1e-4)).any():
            bad = feats[((feats < low - 1e-4) | (feats > high + 1e-4)).any(dim=1)][0].tolist()
            bounds = f"{env.features.low}..{env.features.high}"
            return f"step {t}: features {bad} outside declared bounds {bounds}"
    return ""


def _check_time_limit(env: VecEnv) -> str:
    """Zero actions until the time limit: every env must have ended exactly once by then."""
    env.reset(seed=0)
    zeros = torch.zeros(env.num_envs, env.action_dim, device=env.device)
    ended = torch.zeros(env.num_envs, dtype=torch.bool, device=env.device)
    for _ in range(env.max_episode_steps):
        _, _, term, trunc, _ = env.step(zeros)
        ended |= term | trunc
    if not ended.all():
        limit = env.max_episode_steps
        return f"{int((~ended).sum())} envs did not end within max_episode_steps={limit}"
    return ""


def _check_autoreset(env: VecEnv) -> str:
    """After an episode ends, obs must be a fresh start, not the final observation.

    Random actions move the state away from the start. An env whose start does not depend on
    the seed (a deterministic start, e.g. a fixed initial pose) must return exactly that start;
    otherwise the new observation must differ from the final one.
    """
    gen = torch.Generator().manual_seed(1)
    start = env.reset(seed=2).clone()
    deterministic = bool(
        torch.equal(start, env.reset(seed=1)) and torch.equal(start, start[:1].expand_as(start))
    )
    for _ in range(env.max_episode_steps + 1):
        obs, _, term, trunc, info = env.step(_random_actions(env, gen))
        done = term | trunc
        if done.any():
            if deterministic:
                if not torch.equal(obs[done], start[done]):
                    return (
                        "the start does not depend on the seed, but envs that ended did not "
                        "return to it: auto-reset did not happen"
                    )
                return ""
            moved = (info["final_obs"][done] - obs[done]).abs().amax(dim=1) > 0
            if not moved.any():
                return "envs that ended return obs equal to final_obs: auto-reset did not happen"
            return ""
    return "no episode ended while checking auto-reset"


def _check_seeding(env: VecEnv, steps: int, seed: int) -> str:
    def rollout() -> list[torch.Tensor]:
        gen = torch.Generator().manual_seed(seed)
        out = [env.reset(seed=seed).clone()]
        for _ in range(steps):
            obs, rew, *_ = env.step(_random_actions(env, gen))
            out += [obs.clone(), rew.clone()]
        return out

    first, second = rollout(), rollout()
    for a, b in zip(first, second):
        if not torch.equal(a, b):
            return "same seed and actions gave different trajectories"
    return ""


def _check_bad_actions(env: VecEnv) -> str:
    env.reset(seed=0)
    n, a = env.num_envs, env.action_dim
    bad_inputs = {
        "wrong shape": torch.zeros(n, a + 1, device=env.device),
        "NaN": torch.full((n, a), float("nan"), device=env.device),
    }
    for what, actions in bad_inputs.items():
        try:
            env.step(actions)
        except (ActionError, ValueError):
            continue
        return f"actions with {what} were accepted; expected an ActionError"
    return ""


CHECKS: dict[str, Callable[..., str]] = {
    "spaces": _check_spaces,
    "reset": _check_reset,
    "step": _check_step,
    "task attributes": _check_task_attributes,
    "time limit": _check_time_limit,
    "auto-reset": _check_autoreset,
    "seeding": _check_seeding,
    "bad actions": _check_bad_actions,
}


def run_checks(env: VecEnv, steps: int = 64, seed: int = 0) -> CheckReport:
    """Run every contract check on ``env`` and collect the results (never raises on failure)."""
    report = CheckReport(env.name or type(env).__name__)
    args: dict[str, tuple] = {"reset": (seed,), "step": (steps, seed), "seeding": (16, seed)}
    for name, check in CHECKS.items():
        try:
            detail = check(env, *args.get(name, ()))
        except Exception as exc:  # a crash is a failed check, reported with its cause
            detail = f"raised {type(exc).__name__}: {exc}"
        report.rows.append((name, not detail, detail or "ok"))
    return report


def check_env(env: VecEnv, steps: int = 64, seed: int = 0) -> CheckReport:
    """Run every check; raise :class:`ContractError` listing the failures, if any."""
    report = run_checks(env, steps, seed)
    if not report.ok:
        raise ContractError(
            f"{report.env} breaks the VecEnv contract:\n  " + "\n  ".join(report.failures())
        )
    return report
