"""Does a K-Myriad population explore an Ant maze, and does the maze hold it?

Runs one K-Myriad pretraining on ``mujoco-antmaze-u`` (``myriad pretrain env=antmaze_u``, the
entry point users run, default population and objective), then rolls out the final population
(stochastic actions as in pretraining, ``--eval-envs`` fresh envs split over the members, one
episode of 700 steps) under each physics model (``fast``, the default, and ``gymnasium``,
Gymnasium's own solver settings) and records per model:

- ``outside_free_cells``: the fraction of states whose torso x-y lies outside the maze's free
  cells (in a wall cell or beyond the outer walls), computed here from the layout's wall grid;
- ``torso_z_max`` and ``above_walls``: the highest torso and the fraction of states with the
  torso above the walls' height;
- ``goal_episodes``: the fraction of episodes that reach the env's goal;
- ``union_coverage``: the fraction of the maze's free coverage cells the rollouts visit.

Beside them: the pretraining run's env steps, wall time and final coverage from its summary.
A maze that holds the ant has ``outside_free_cells`` 0 under both models.

    python benchmarks/antmaze_exploration.py                     # pretrain, then roll out
    python benchmarks/antmaze_exploration.py --run runs/pretrain/antmaze  # roll out a run

writes ``--out`` (JSON).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myriad.bench.common import machine_info, write_json

RESULTS = Path(__file__).parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--run", type=Path, help="roll out this pretraining run instead of training")
    p.add_argument("--iterations", type=int, default=300)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-envs", type=int, default=512)
    p.add_argument("--models", nargs="+", default=["fast", "gymnasium"])
    p.add_argument("--out", type=Path, default=RESULTS / "antmaze_exploration.json")
    return p.parse_args(argv)


@torch.no_grad()
def roll_out(run: Path, model: str, num_envs: int, seed: int) -> dict[str, Any]:
    """One episode of every env under ``model``'s physics, the final members acting."""
    from myriad.entropy.coverage import coverage
    from myriad.envs import make
    from myriad.rl.saved_population import load_population

    saved = load_population(run)
    policy = saved.model.eval()
    members = policy.num_members
    env = make(
        saved.env["name"], num_envs, "cpu", **{**saved.env.get("options", {}), "model": model}
    )
    member = torch.arange(members).repeat_interleave(num_envs // members)
    generator = torch.Generator().manual_seed(seed)
    obs = env.reset(seed=seed)
    xy, z, reached = [], [], torch.zeros(num_envs, dtype=torch.bool)
    done = torch.zeros(num_envs, dtype=torch.bool)
    start = time.perf_counter()
    for _ in range(env.max_episode_steps):
        actions = policy.act(obs, member, generator=generator, blocked=True).actions
        obs, _, term, trunc, info = env.step(actions)
        live = ~done
        # The torso is body 1; positions before any reset of an episode that ended.
        torso = env.sim.field("xpos")[:, 1]
        final = info["final_obs"]
        xy.append(final[live, :2].numpy())
        z.append(torso[live, 2].numpy())
        reached |= live & info["success"]
        done |= term | trunc
        if done.all():
            break
    seconds = time.perf_counter() - start
    env.close()
    xy_all, z_all = np.concatenate(xy), np.concatenate(z)
    layout, grid = env.layout, env.features
    inside = layout.cells_of(xy_all.astype(np.float64))[0] >= 0
    visited = coverage(
        torch.as_tensor(xy_all),
        grid.low,
        grid.high,
        grid.cells,
        reachable=torch.as_tensor(grid.reachable),
    )
    return {
        "states": len(xy_all),
        "outside_free_cells": float(1 - inside.mean()),
        "above_walls": float((z_all > layout.wall_height).mean()),
        "torso_z_max": float(z_all.max()),
        "goal_episodes": float(reached.float().mean()),
        "union_coverage": visited.union,
        "rollout_s": seconds,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    pretraining: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        run = args.run
        if run is None:
            from myriad.pretrain import pretrain

            run = Path(tmp) / "antmaze"
            overrides = [
                "env=antmaze_u",
                f"seed={args.seed}",
                f"iterations={args.iterations}",
                "progress=false",
                "plots=false",
                "tensorboard=false",
            ]
            summary = pretrain(overrides, run_dir=run, quiet=True)
            keys = (
                "env_steps",
                "wall_time_s",
                "steps_per_second",
                "coverage/cumulative_union",
                "eval_coverage_union",
                "episode/return",
            )
            pretraining = {"overrides": overrides, **{k: summary.get(k) for k in keys}}
        rollouts = {m: roll_out(run, m, args.eval_envs, args.seed) for m in args.models}
    for model, r in rollouts.items():
        print(
            f"{model:10s} outside free cells {r['outside_free_cells']:.4f}  above walls "
            f"{r['above_walls']:.4f}  torso z max {r['torso_z_max']:.2f} m  goal episodes "
            f"{r['goal_episodes']:.3f}  coverage {r['union_coverage']:.3f}",
            flush=True,
        )
    payload = {
        "benchmark": "antmaze_exploration",
        "env": "mujoco-antmaze-u",
        "run": str(args.run) if args.run else None,
        "seed": args.seed,
        "eval_envs": args.eval_envs,
        "pretraining": pretraining,
        "rollouts": rollouts,
        "machine": machine_info(),
    }
    print(f"wrote {write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
