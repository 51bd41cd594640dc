"""``myriad eval``: per-member return, success and episode length of a saved population, with
95% confidence intervals, printed and written as JSON.

Every requested member plays ``episodes`` full episodes in fresh envs, all in one batched
rollout (:func:`myriad.assess.evaluation.rollout_members`: each env's first episode counts).
Intervals: Student's t for the mean return and length (``mean +- t_{0.975, n-1} s / sqrt(n)``),
Wilson's score interval for the success rate (it stays inside [0, 1] and is not empty at 0 or
100% success, where the normal approximation collapses).
"""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from myriad.utils.commandline import add_run_subcommand, device_name

#: Two-sided confidence level of every interval.
CONFIDENCE = 0.95


def mean_interval(values: Sequence[float], confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Mean of ``values`` with its Student-t interval: ``{"mean", "low", "high", "n"}``; the
    bounds are None for fewer than two values (no spread to measure)."""
    from scipy.special import stdtrit

    n = len(values)
    mean = math.fsum(values) / n if n else float("nan")
    if n < 2:
        return {"mean": mean, "low": None, "high": None, "n": n}
    var = math.fsum((v - mean) ** 2 for v in values) / (n - 1)
    half = float(stdtrit(n - 1, 0.5 + confidence / 2)) * math.sqrt(var / n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "n": n}


def wilson_interval(successes: int, n: int, confidence: float = CONFIDENCE) -> dict[str, Any]:
    """Success rate ``successes / n`` with Wilson's score interval: ``{"mean", "low", "high",
    "n"}`` (bounds None when ``n`` is 0)."""
    from scipy.special import ndtri

    if n == 0:
        return {"mean": float("nan"), "low": None, "high": None, "n": 0}
    p = successes / n
    z = float(ndtri(0.5 + confidence / 2))
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return {"mean": p, "low": max(0.0, centre - half), "high": min(1.0, centre + half), "n": n}


def apply_env_overrides(env_cfg: Mapping[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """The run's env config with ``env.KEY=VALUE`` overrides, e.g. ``env.options.task=sparse``
    (an env option the run did not set is added; ``~env.options.KEY`` removes one).

    Raises:
        ConfigError: an override that does not start with ``env.`` or is not ``key=value``.
    """
    from omegaconf import OmegaConf

    from myriad.utils.config import ConfigError

    cfg: Any = OmegaConf.create({"env": dict(env_cfg)})
    for text in overrides:
        key, eq, value = text.partition("=")
        name = key.lstrip("+~")
        if not name.startswith("env.") or (not eq and not key.startswith("~")):
            raise ConfigError(
                f"unrecognised argument {text!r}: eval takes env overrides such as "
                "env.options.task=sparse, +env.options.KEY=VALUE or ~env.options.KEY"
            )
        if key.startswith("~"):
            parent, _, leaf = name.rpartition(".")
            node = OmegaConf.select(cfg, parent)
            if node is None or leaf not in node:
                raise ConfigError(f"{text}: the run's env config has no {name}")
            del node[leaf]
            continue
        if not name.startswith("env.options.") and OmegaConf.select(cfg, name) is None:
            raise ConfigError(
                f"{text}: the run's env config has no {name}; env options go under "
                "env.options (env.options.task=sparse)"
            )
        parsed = OmegaConf.from_dotlist([f"{name}={value}"])
        cfg = OmegaConf.merge(cfg, parsed)
    container: Any = OmegaConf.to_container(cfg, resolve=True)
    return dict(container["env"])


def saved_leader(config: Mapping[str, Any], state: Mapping[str, Any]) -> int | None:
    """The leader of a finetuning checkpoint (member 0; PBT's best member by its last round's
    objective); None for a pretraining checkpoint."""
    algo = (config.get("algo") or {}).get("name")
    if algo is None:
        return None
    objective = (state.get("algorithm") or {}).get("objective")
    if algo == "pbt" and objective is not None and len(objective):
        return int(objective.argmax())
    return 0


def member_indices(members: Sequence[int | str], size: int, flag: str, hint: str) -> list[int]:
    """``members`` as member indices of a population of ``size``.

    Raises:
        ConfigError: an index out of range (the message names ``flag`` and ends with ``hint``).
    """
    from myriad.utils.config import ConfigError

    chosen = [int(m) for m in members]
    bad = [m for m in chosen if not 0 <= m < size]
    if bad:
        raise ConfigError(
            f"{flag} {bad} out of range: the population has {size} members (0..{size - 1}); {hint}"
        )
    return chosen


def evaluate_run(
    source: str | os.PathLike[str],
    *,
    members: Sequence[int] | str | None = None,
    episodes: int = 32,
    deterministic: bool = True,
    seed: int | None = None,
    env_overrides: Sequence[str] = (),
    device: str = "cpu",
) -> dict[str, Any]:
    """Evaluate the members of a run's (or checkpoint's) population.

    Args:
        source: a run folder of ``myriad pretrain`` or ``myriad finetune``, its
            ``checkpoints/`` folder or a checkpoint file (the newest checkpoint of a folder).
        members: member indices, ``"all"`` (default) or ``"leader"`` (finetuning runs).
        episodes: episodes per member (each in its own env).
        deterministic: act with the policy means (default) rather than sampling.
        seed: env reset and action seed (default: derived from the run's seed).
        env_overrides: ``env.KEY=VALUE`` changes to the run's env (:func:`apply_env_overrides`).
        device: where to run.

    Returns:
        A JSON-ready dict: the checkpoint, env, settings and per member ``return``,
        ``success`` (None where the env reports no success) and ``length``, each
        ``{"mean", "low", "high", "n"}``.

    Raises:
        ConfigError: bad members, episodes or overrides.
    """
    import torch

    from myriad.assess.evaluation import rollout_members
    from myriad.envs import make_from_config
    from myriad.rl.saved_population import load_population
    from myriad.utils.checkpoint import load_checkpoint
    from myriad.utils.config import ConfigError
    from myriad.utils.seeding import stream_seed

    if episodes < 1:
        raise ConfigError(f"--episodes must be >= 1, got {episodes}")
    saved = load_population(source, device)
    model = saved.model
    state = load_checkpoint(saved.path).get("state") or {}
    leader = saved_leader(saved.config, state)
    size = model.num_members
    if members is None or members == "all":
        chosen = list(range(size))
    elif members == "leader":
        if leader is None:
            raise ConfigError(
                f"{saved.path} is a pretraining checkpoint: it has no leader; pass member "
                "indices or all"
            )
        chosen = [leader]
    else:
        chosen = member_indices(
            members, size, "--members", "pass indices in that range, all or leader"
        )
    env_cfg = apply_env_overrides(saved.env, env_overrides)
    if seed is None:
        seed = stream_seed(int(saved.config.get("seed", 0)), "evaluation") + 1
    task_rewards: list[bool] = []  # whether the env pays a task reward

    def make_env(n: int) -> Any:
        env = make_from_config(env_cfg, n, device)
        task_rewards.append(env.has_task_reward)
        return env

    with torch.inference_mode():
        batch = rollout_members(
            model,
            make_env,
            chosen,
            episodes,
            deterministic=deterministic,
            seed=int(seed),
        )
    assert batch.length is not None
    task_reward = task_rewards[0]
    # A nav env without a task still reports "success" (always False): no task, no success.
    has_success = batch.has_success and task_reward
    rows = []
    for k, m in enumerate(chosen):
        block = slice(k * episodes, (k + 1) * episodes)
        success = batch.success[block]
        rows.append(
            {
                "member": m,
                "leader": m == leader,
                "return": mean_interval(batch.returns[block].double().tolist()),
                "success": (wilson_interval(int(success.sum()), episodes) if has_success else None),
                "length": mean_interval(batch.length[block].double().tolist()),
            }
        )
    return {
        "checkpoint": str(saved.path),
        "kind": "finetune" if leader is not None else "pretrain",
        "env": env_cfg,
        "env_overrides": list(env_overrides),
        "task_reward": task_reward,
        "episodes": episodes,
        "deterministic": deterministic,
        "seed": int(seed),
        "confidence": CONFIDENCE,
        "members": rows,
    }


# ------------------------------------------------------------------------------ command


#: ``myriad eval`` in the list of subcommands.
HELP = (
    "per-member return, success and episode length with 95%% CIs (prints, writes JSON); extra "
    "arguments are env overrides (env.options.task=sparse ...)"
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``eval`` to the ``myriad`` subcommands."""
    p = add_run_subcommand(sub, "eval", HELP)
    p.add_argument(
        "--members", nargs="+", metavar="M", help="0 3, 0,3, all (default) or leader (finetuning)"
    )
    p.add_argument("--episodes", default="32", help="episodes per member (default 32)")
    actions = p.add_mutually_exclusive_group()
    actions.add_argument(
        "--deterministic", action="store_true", help="act with the policy means (default)"
    )
    actions.add_argument("--sample", action="store_true", help="sample actions, as in training")
    p.add_argument("--seed", help="env and action seed (default: derived from the run's seed)")
    p.add_argument("--out", help="JSON file (default RUN/eval.json)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out file")
    p.add_argument("--device", default="cpu", type=device_name)
    return p


def _int(text: str, flag: str, minimum: int) -> int:
    from myriad.utils.config import ConfigError

    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"{flag} takes an integer, got {text!r}") from None
    if value < minimum:
        raise ConfigError(f"{flag} must be >= {minimum}, got {value}")
    return value


def parse_members(values: Sequence[str] | None) -> list[int] | str | None:
    """``--members`` as indices, ``"all"``, ``"leader"`` or None."""
    from myriad.utils.config import ConfigError

    if not values:
        return None
    items = [v.strip() for item in values for v in item.split(",") if v.strip()]
    if items in (["all"], ["leader"]):
        return items[0]
    try:
        return [int(v) for v in items]
    except ValueError:
        raise ConfigError(
            f"--members takes member indices (0 3 or 0,3), all or leader, got {' '.join(values)}"
        ) from None


def default_output(source: str | os.PathLike[str]) -> Path:
    """``RUN/eval.json`` for a run folder or a checkpoint inside one; else beside the file."""
    path = Path(source)
    if path.is_file():
        if path.parent.name == "checkpoints":
            return path.parent.parent / "eval.json"
        return path.with_suffix(".eval.json")
    if path.name == "checkpoints":
        return path.parent / "eval.json"
    return path / "eval.json"


def _cell(stat: Mapping[str, Any] | None, fmt: str) -> str:
    if stat is None:
        return "-"
    if stat["low"] is None:
        return fmt.format(stat["mean"])
    return f"{fmt.format(stat['mean'])} [{fmt.format(stat['low'])}, {fmt.format(stat['high'])}]"


def format_table(result: Mapping[str, Any]) -> str:
    """The per-member table of :func:`evaluate_run`'s result, as plain text."""
    header = ["member", "return (95% CI)", "success (95% CI)", "length (95% CI)"]
    rows = [
        [
            f"{r['member']}{' (leader)' if r['leader'] else ''}",
            _cell(r["return"], "{:.3f}"),
            _cell(r["success"], "{:.1%}"),
            _cell(r["length"], "{:.1f}"),
        ]
        for r in result["members"]
    ]
    widths = [max(len(str(x)) for x in col) for col in zip(header, *rows)]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(line, widths)) for line in [header, *rows]]
    mode = "deterministic" if result["deterministic"] else "sampled"
    title = (
        f"{result['checkpoint']}: {result['episodes']} episodes per member, {mode} actions, "
        f"env {result['env']['name']}, seed {result['seed']}"
    )
    return "\n".join([title, *lines])


def run(args: argparse.Namespace, rest: list[str]) -> int:
    """``myriad eval``: evaluate, print the table, write the JSON."""
    from myriad.utils.checkpoint import atomic_write_text
    from myriad.utils.runlock import lock_if_inside_a_run

    members = parse_members(args.members)
    episodes = _int(args.episodes, "--episodes", 1)
    seed = None if args.seed is None else _int(args.seed, "--seed", 0)
    apply_env_overrides({"name": "-", "options": {}}, [o for o in rest if "=" not in o])
    out = Path(args.out) if args.out else default_output(args.run)
    if out.exists() and not args.overwrite:
        raise FileExistsError(
            f"{out} exists: pass --overwrite to replace it, or --out for another file"
        )
    # eval.json goes into the run: never while another process trains it (refused up front,
    # before the evaluation's minutes are spent).
    with lock_if_inside_a_run(out, "eval"):
        result = evaluate_run(
            args.run,
            members=members,
            episodes=episodes,
            deterministic=not args.sample,
            seed=seed,
            env_overrides=rest,
            device=args.device,
        )
        print(format_table(result))
        if not result["task_reward"]:
            print(
                "note: the run's env has no task reward (task none): its returns are 0; pass "
                "env.options.task=sparse or dense to score a task"
            )
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, json.dumps(result, indent=2) + "\n")
    print(f"eval  {out}")
    return 0
