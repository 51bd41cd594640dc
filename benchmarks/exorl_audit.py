"""Audit of the ExORL benchmark's first protocol (``benchmarks/exorl.py`` before 2026-11-27):
what its evaluation measured, why IQL's policy did not move on the population's data, and what
a gradient step costs.

Three small experiments on the seed-0 datasets of ``benchmarks/exorl.py`` (``--work``):

1. **Evaluation on ``nav-three-routes``.** TD3 on the ``independent`` and ``kmyriad`` data
   (``--td3-steps``, 6 goals), each policy evaluated with the first protocol (goal radius 0.5,
   10 episodes, the start seed ``10000 + seed + goal``) and the current one
   (:func:`exorl.evaluate`: radius :data:`exorl.GOAL_RADIUS`, 50 episodes). Recorded per goal:
   which episodes succeed (the same episodes for both policies means the start decides), the
   smallest Euclidean distance to the goal in each episode (on the goal disc's edge, 0.5, for a
   policy that slides along the wall past the goal), and the fraction of saturated actions.
2. **IQL on ``nav-maze``, one goal** (5 cells from the start), ``--iql-steps`` steps on the
   ``kmyriad`` and ``independent`` data: the first protocol's settings (reward +1, expectile
   0.7, temperature 3), temperature 10 alone, and the current settings
   (:data:`exorl.IQL_SETTINGS`); success over 20 episodes and the mean magnitude of the
   deterministic action.
3. **Cost**: CPU seconds per 10,000 gradient steps of TD3 and IQL on a 6-goal dataset of
   100,000 transitions (600,000 rows), one thread.

    nice -n 10 python benchmarks/exorl_audit.py --work /work/bench-exorl/runs/exorl

Writes ``benchmarks/results/exorl_audit.json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import exorl

RESULTS = Path(__file__).parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--work", default="runs/exorl", help="exorl.py's pretraining runs and datasets")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--td3-steps", type=int, default=20_000)
    p.add_argument("--iql-steps", type=int, default=5_000)
    p.add_argument("--timing-steps", type=int, default=2_000)
    p.add_argument("--out", default=str(RESULTS / "exorl_audit.json"))
    return p.parse_args(argv)


def dataset(args: argparse.Namespace, env: str, source: str) -> Any:
    from myriad.datasets import load

    path = exorl.dataset_path(Path(args.work), env, source, 100_000, args.seed)
    if not path.is_file():
        raise SystemExit(
            f"{path} does not exist: run benchmarks/exorl.py first, or pass its --work folder"
        )
    return load(path)


def tensors(data: Any) -> dict[str, torch.Tensor]:
    keys = ("observations", "actions", "rewards", "next_observations", "terminals")
    return {k: torch.as_tensor(getattr(data, k), dtype=torch.float32) for k in keys}


def episodes(
    act: Any, env: str, goal: tuple[float, float], n: int, reset_seed: int, radius: float
) -> dict[str, Any]:
    """``n`` episodes of the deterministic policy on one goal: per episode, success and the
    smallest Euclidean distance to the goal; the fraction of saturated action entries."""
    from myriad.envs import make

    e = make(exorl.ENVS[env], n, "cpu", task="sparse", goal=goal, goal_radius=radius,
             **exorl.env_options(env))  # fmt: skip
    obs = e.reset(seed=reset_seed)
    tag = np.broadcast_to(exorl.scaled(goal, env), (n, 2))
    hit, done = np.zeros(n, bool), np.zeros(n, bool)
    closest = np.full(n, np.inf)
    saturated, count = 0, 0
    for _ in range(e.max_episode_steps):
        a = np.clip(np.asarray(act(np.concatenate([obs.numpy(), tag], 1).astype(np.float32))),
                    -1.0, 1.0)  # fmt: skip
        saturated += int((np.abs(a[~done]) > 0.99).sum())
        count += int(a[~done].size)
        obs, _, term, trunc, info = e.step(torch.as_tensor(a, dtype=torch.float32))
        reached = e.positions(info["final_obs"]).numpy()
        dist = np.linalg.norm(reached - np.asarray(goal), axis=1)
        closest = np.where(done, closest, np.minimum(closest, dist))
        hit |= ~done & info["success"].numpy()
        done |= (term | trunc).numpy()
        if done.all():
            break
    e.close()
    return {
        "success": hit.astype(int).tolist(),
        "closest_euclidean": closest.round(4).tolist(),
        "saturated_action_fraction": saturated / max(count, 1),
    }


def evaluation_audit(args: argparse.Namespace) -> dict[str, Any]:
    from myriad.rl.td3 import OfflineTD3, TD3Config

    env = "three_routes"
    goals, dist = exorl.goals_of(env, 6)
    out: dict[str, Any] = {"env": env, "goals": goals, "goal_distances": dist}
    for source in ("independent", "kmyriad"):
        gc = exorl.goal_conditioned(dataset(args, env, source), env, goals, radius=0.5)
        td3 = OfflineTD3(gc.observations.shape[1], 2, TD3Config(hidden=(64, 64)), seed=args.seed)
        data = tensors(gc)
        for _ in range(args.td3_steps):
            td3.update(td3.sample(data))
        act = td3.act
        first = [
            episodes(act, env, g, 10, 10_000 + args.seed + i, 0.5) for i, g in enumerate(goals)
        ]
        out[source] = {
            "td3_steps": args.td3_steps,
            "first_protocol": {
                "success_per_goal": [float(np.mean(r["success"])) for r in first],
                "episodes": first,
            },
            "current_protocol": exorl.evaluate(act, env, goals, 50, args.seed),
        }
    a, b = out["independent"]["first_protocol"], out["kmyriad"]["first_protocol"]
    out["same_successful_episodes_per_goal"] = [
        x["success"] == y["success"] for x, y in zip(a["episodes"], b["episodes"])
    ]
    return out


def iql_audit(args: argparse.Namespace) -> dict[str, Any]:
    import structlog

    from myriad.datasets import import_d3rlpy, to_d3rlpy

    d3rlpy = import_d3rlpy()

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    env, gi = "maze", 0
    goals, dist = exorl.goals_of(env, 6)
    goal = goals[gi]
    variants = {
        "first (reward +1, expectile 0.7, temperature 3)": (0.0, 0.7, 3.0),
        "temperature 10 alone": (0.0, 0.7, 10.0),
        "current (reward - 1, expectile 0.9, temperature 10)": (
            exorl.IQL_SETTINGS["reward_offset"],
            exorl.IQL_SETTINGS["expectile"],
            exorl.IQL_SETTINGS["weight_temp"],
        ),
    }
    out: dict[str, Any] = {"env": env, "goal": goal, "goal_distance": dist[gi]}
    for source in ("kmyriad", "independent"):
        gc = exorl.goal_conditioned(dataset(args, env, source), env, [goal], radius=0.5)
        row: dict[str, Any] = {"goal_reaching_transitions": int(gc.terminals.sum())}
        for name, (offset, expectile, temp) in variants.items():
            d3rlpy.seed(args.seed)
            algo = exorl.iql(64, expectile, temp)
            shifted = replace(gc, rewards=gc.rewards + np.float32(offset))
            algo.fit(
                to_d3rlpy(shifted),
                n_steps=args.iql_steps,
                n_steps_per_epoch=args.iql_steps,
                show_progress=False,
                save_interval=10**9,
                logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
            )
            magnitude: list[float] = []

            def act(obs: np.ndarray, algo: Any = algo, magnitude: list = magnitude) -> np.ndarray:
                a = algo.predict(obs)
                magnitude.append(float(np.abs(a).mean()))
                return a

            r = episodes(act, env, goal, 20, exorl.eval_seed(args.seed, gi), 0.5)
            row[name] = {
                "success": float(np.mean(r["success"])),
                "mean_abs_action": float(np.mean(magnitude)),
                "closest_euclidean_median": float(np.median(r["closest_euclidean"])),
            }
        out[source] = row
    return out


def cost(args: argparse.Namespace) -> dict[str, Any]:
    from myriad.datasets import import_d3rlpy, to_d3rlpy
    from myriad.rl.td3 import OfflineTD3, TD3Config

    d3rlpy = import_d3rlpy()

    env = "maze"
    goals, _ = exorl.goals_of(env, 6)
    gc = exorl.goal_conditioned(dataset(args, env, "kmyriad"), env, goals)
    n = args.timing_steps
    td3 = OfflineTD3(gc.observations.shape[1], 2, TD3Config(hidden=(64, 64)), seed=0)
    data = tensors(gc)
    c0, w0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        td3.update(td3.sample(data))
    td3_cpu, td3_wall = time.process_time() - c0, time.perf_counter() - w0
    algo = exorl.iql(64, exorl.IQL_SETTINGS["expectile"], exorl.IQL_SETTINGS["weight_temp"])
    ds = to_d3rlpy(gc)
    c0, w0 = time.process_time(), time.perf_counter()
    algo.fit(ds, n_steps=n, n_steps_per_epoch=n, show_progress=False, save_interval=10**9,
             logger_adapter=d3rlpy.logging.NoopAdapterFactory())  # fmt: skip
    iql_cpu, iql_wall = time.process_time() - c0, time.perf_counter() - w0
    c0 = time.process_time()
    exorl.evaluate(td3.act, env, goals, 50, 0)
    eval_cpu = time.process_time() - c0
    scale = 10_000 / n
    return {
        "rows": len(gc),
        "steps_timed": n,
        "td3_cpu_s_per_10k": td3_cpu * scale,
        "td3_wall_s_per_10k": td3_wall * scale,
        "iql_cpu_s_per_10k": iql_cpu * scale,
        "iql_wall_s_per_10k": iql_wall * scale,
        "evaluation_cpu_s_50_episodes_6_goals": eval_cpu,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    result = {
        "benchmark": "exorl_audit",
        "protocol": "benchmarks/exorl_audit.py docstring",
        "seed": args.seed,
        "evaluation": evaluation_audit(args),
        "iql": iql_audit(args),
        "cost": cost(args),
        "wall_s": 0.0,
    }
    result["wall_s"] = time.perf_counter() - t0
    Path(args.out).write_text(json.dumps(result, indent=1))
    ev, iql = result["evaluation"], result["iql"]
    for source in ("independent", "kmyriad"):
        first = ev[source]["first_protocol"]["success_per_goal"]
        current = np.round(ev[source]["current_protocol"]["success_per_goal"], 2).tolist()
        print(f"three_routes TD3 {source}: first protocol {first} current {current}")
    print("same successful episodes per goal:", ev["same_successful_episodes_per_goal"])
    for source in ("kmyriad", "independent"):
        for name, r in iql[source].items():
            print(f"maze IQL {source} {name}: {r}")
    print("cost:", result["cost"])
    print(f"wrote {args.out} ({result['wall_s'] / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
