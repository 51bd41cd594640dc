"""Offline multi-goal reaching in the maze from reward-free datasets of equal size.

Three datasets, each subsampled (whole episodes, drawn at random) to the same number of
transitions:

  (a) kmyriad  K-Myriad pretraining with the default config (8 members);
  (b) single   the same pretraining with ``population.size=1`` (one entropy-maximising policy);
  (c) random   uniformly random actions in the same env.

Each dataset is relabelled with the sparse reward of each of G goals spread across the maze
(``spread_goal_cells``; +1 and a terminal on reaching the goal, from the next state's position)
and the goal is appended to the observation, as ``task=multigoal`` shows it. One goal-conditioned
IQL policy (d3rlpy) is trained per dataset and seed, and evaluated (actions sampled from the
policy) in ``nav-maze`` with ``task=sparse, goal=<goal>`` for every goal: success is reaching the
goal within the time limit.
Each seed draws its own subsample and trains its own policy. The report gives the success rate
over goals per seed, its mean and a 95% t-interval over seeds, and per goal; plus each dataset's
coverage and how many of its transitions reach each goal (first seed's subsample).

    python benchmarks/offline_goal_reaching.py                   # full run (10-15 min on 2 cores)
    python benchmarks/offline_goal_reaching.py --quick           # smoke test (about 1 min)
    python benchmarks/offline_goal_reaching.py --kmyriad-run RUN --single-run RUN   # reuse runs

Writes ``benchmarks/results/offline_goal_reaching.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myriad.bench.common import write_json
from myriad.datasets import D4RLWriter, TransitionData, load, random_policy_rows, relabel
from myriad.datasets.data import goal_conditioned as conditioned
from myriad.envs import make
from myriad.envs.layout import Layout
from myriad.envs.nav import spread_goal_cells

RESULTS = Path(__file__).parent / "results"
ENV = "nav-maze"
# The maze config of `myriad pretrain` (configs/env/maze.yaml).
ENV_OPTIONS = {"max_episode_steps": 400, "max_speed": 0.85}
DATASETS = ("kmyriad", "single", "random")
T_975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--work", default="runs/offline_goal_reaching", help="datasets and runs")
    p.add_argument("--kmyriad-run", help="existing default pretraining run to reuse")
    p.add_argument("--single-run", help="existing population.size=1 run to reuse")
    p.add_argument("--size", type=int, default=150_000, help="transitions per dataset")
    p.add_argument("--goals", type=int, default=8)
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--steps", type=int, default=8000, help="IQL gradient steps")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--eval-episodes", type=int, default=20, help="per goal")
    p.add_argument("--workers", type=int, default=2, help="training processes")
    p.add_argument("--quick", action="store_true", help="tiny everything (smoke test)")
    p.add_argument("--out", default=str(RESULTS / "offline_goal_reaching"))
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.goals, args.seeds, args.steps = 20_000, 3, 2, 300
        args.eval_episodes, args.hidden = 4, 32
    return args


# -- datasets ----------------------------------------------------------------------------------
def pretrain_run(folder: Path, overrides: list[str], quick: bool) -> Path:
    from myriad.pretrain import pretrain

    if (folder / "summary.json").is_file():
        return folder
    extra = ["iterations=15"] if quick else []
    pretrain(["progress=false", *overrides, *extra], run_dir=folder, quiet=True)
    return folder


def random_dataset(path: Path, rows: int, seed: int, num_envs: int = 256) -> Path:
    """Uniformly random actions in the maze, written like a pretraining dataset."""
    if path.is_file():
        return path
    env = make(ENV, num_envs, "cpu", **ENV_OPTIONS)
    writer = D4RLWriter(
        path,
        env.obs_dim,
        env.action_dim,
        env.features.names,
        metadata={
            "env": ENV,
            "env_options": ENV_OPTIONS,
            "population_size": 1,
            "seed": seed,
            "reward": "none (uniformly random actions)",
            "feature_names": list(env.features.names),
        },
    )
    steps = math.ceil(rows / num_envs) + env.max_episode_steps
    for episodes in random_policy_rows(env, steps, seed=seed):
        writer.append(episodes)
    env.close()
    writer.close()
    return path


def subsample(data: TransitionData, size: int, seed: int) -> TransitionData:
    """Whole episodes drawn at random until ``size`` transitions; the last one is cut to fit
    (its last kept row becomes a timeout)."""
    ends = data.episode_ends()
    starts = np.r_[0, ends[:-1]]
    order = np.random.default_rng(seed).permutation(len(ends))
    lengths = (ends - starts)[order]
    count = int(np.searchsorted(np.cumsum(lengths), size)) + 1
    chosen = np.sort(order[:count])
    index = np.concatenate([np.arange(starts[e], ends[e]) for e in chosen])
    if len(index) < size:
        raise ValueError(f"the dataset has only {len(index)} transitions, {size} requested")
    sub = data.select(index[:size])
    sub.timeouts = sub.timeouts.copy()
    sub.timeouts[-1] = ~sub.terminals[-1]
    return sub


def goal_points(count: int) -> list[tuple[float, float]]:
    """``count`` goals spread over the maze (farthest-point sampling on geodesic distance),
    leaving out the start cell, where every episode begins with the goal reached."""
    layout = Layout.load("maze")
    cells = [c for c in spread_goal_cells(layout, count + 1) if c not in layout.starts]
    return [layout.cell_center(r, c) for r, c in cells[:count]]


def start_distance(goal: tuple[float, float]) -> int:
    """Geodesic distance in cells from the start cell to the goal's cell."""
    layout = Layout.load("maze")
    dist = layout.distances_from(layout.starts[0])
    return int(dist[layout.height - 1 - math.floor(goal[1]), math.floor(goal[0])])


def scaled_goal(goal: tuple[float, float]) -> np.ndarray:
    layout = Layout.load("maze")
    size = np.array([layout.width, layout.height], np.float32)
    return (np.asarray(goal, np.float32) / size * 2 - 1).astype(np.float32)


def goal_conditioned(data: TransitionData, goals: list[tuple[float, float]]) -> TransitionData:
    """One relabelled copy per goal, with the goal appended to (next) observations."""
    layout = Layout.load("maze")
    return conditioned(data, goals, (layout.width, layout.height))


def describe(data: TransitionData, goals: list[tuple[float, float]]) -> dict[str, Any]:
    env = make(ENV, 1, "cpu", **ENV_OPTIONS)
    cov = env.features.coverage(torch.as_tensor(data.features))
    env.close()
    reaching = [int(relabel(data, "sparse", g).terminals.sum()) for g in goals]
    return {
        "transitions": len(data),
        "episodes": len(data.episode_ends()),
        "coverage_union": float(cov.union),
        "transitions_reaching_goal": reaching,
    }


# -- training and evaluation -------------------------------------------------------------------
def train_and_evaluate(job: dict[str, Any]) -> dict[str, Any]:
    """One IQL policy on one goal-conditioned dataset; success per goal."""
    torch.set_num_threads(1)
    import logging

    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))

    from myriad.datasets import import_d3rlpy, to_d3rlpy

    d3rlpy = import_d3rlpy()

    t0 = time.perf_counter()
    data = goal_conditioned(job["data"], job["goals"])
    d3rlpy.seed(job["seed"])
    enc = d3rlpy.models.VectorEncoderFactory([job["hidden"], job["hidden"]])
    algo = d3rlpy.algos.IQLConfig(
        actor_encoder_factory=enc,
        critic_encoder_factory=enc,
        value_encoder_factory=enc,
        batch_size=256,
        gamma=0.99,
        expectile=0.9,
        weight_temp=10.0,
        tau=0.05,
        actor_learning_rate=3e-4,
        critic_learning_rate=3e-4,
    ).create(device="cpu")
    dataset = to_d3rlpy(data)
    algo.fit(
        dataset,
        n_steps=job["steps"],
        n_steps_per_epoch=job["steps"],
        show_progress=False,
        save_interval=10**9,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
    )
    train_s = time.perf_counter() - t0
    torch.manual_seed(1000 + job["seed"])  # the policy's action noise
    success = evaluate(algo, job["goals"], job["eval_episodes"], seed=1000 + job["seed"])
    return {
        "dataset": job["name"],
        "seed": job["seed"],
        "success_per_goal": success,
        "success": float(np.mean(success)),
        "train_s": train_s,
        "total_s": time.perf_counter() - t0,
    }


def evaluate(algo: Any, goals: list[tuple[float, float]], episodes: int, seed: int) -> list[float]:
    """The policy's sampled actions, ``episodes`` per goal in ``nav-maze`` with ``task=sparse,
    goal=g``; all goals step together so one forward pass serves them.

    Sampled, not greedy: the mean action of a policy regularised towards exploratory data is
    small and deterministic, and gets stuck on wall corners of this velocity-controlled maze
    (with the mean action every dataset scores 0 on every goal)."""
    envs = [make(ENV, episodes, "cpu", task="sparse", goal=g, **ENV_OPTIONS) for g in goals]
    obs = [e.reset(seed=seed + i) for i, e in enumerate(envs)]
    tags = [np.broadcast_to(scaled_goal(g), (episodes, 2)) for g in goals]
    done = [np.zeros(episodes, bool) for _ in goals]
    hit = [np.zeros(episodes, bool) for _ in goals]
    for _ in range(envs[0].max_episode_steps):
        batch = np.concatenate([np.concatenate([o.numpy(), t], 1) for o, t in zip(obs, tags)])
        actions = np.clip(algo.sample_action(batch.astype(np.float32)), -1.0, 1.0)
        for i, env in enumerate(envs):
            a = torch.as_tensor(actions[i * episodes : (i + 1) * episodes])
            obs[i], _, term, trunc, info = env.step(a)
            first = ~done[i]
            hit[i] |= first & info["success"].numpy()
            done[i] |= (term | trunc).numpy()
        if all(d.all() for d in done):
            break
    for env in envs:
        env.close()
    return [float(h.mean()) for h in hit]


def interval(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% t-interval."""
    x = np.asarray(values, float)
    if len(x) < 2:
        return float(x.mean()), float("nan")
    return float(x.mean()), float(T_975.get(len(x) - 1, 1.96) * x.std(ddof=1) / math.sqrt(len(x)))


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bx) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 2]})
    names = list(result["summary"])
    means = [result["summary"][n]["success_mean"] for n in names]
    half = [result["summary"][n]["success_ci95"] for n in names]
    ax.bar(names, means, yerr=half, capsize=6, color=["C0", "C1", "C2"][: len(names)])
    for i, n in enumerate(names):
        seeds = [r["success"] for r in result["runs"] if r["dataset"] == n]
        ax.scatter([i] * len(seeds), seeds, color="k", s=12, zorder=3)
    ax.set_ylabel("success rate over goals")
    ax.set_ylim(0, 1)
    ax.set_title("IQL, goal-conditioned (mean, 95% CI, seeds)")
    goals = result["goals"]
    width = 0.8 / len(names)
    for i, n in enumerate(names):
        per = np.array([r["success_per_goal"] for r in result["runs"] if r["dataset"] == n])
        bx.bar(np.arange(len(goals)) + i * width, per.mean(0), width, label=n)
    bx.set_xticks(np.arange(len(goals)) + width * (len(names) - 1) / 2)
    dist = result["goal_distances_from_start"]
    bx.set_xticklabels(
        [f"({x:g},{y:g})\n{d} cells" for (x, y), d in zip(goals, dist)], rotation=30, fontsize=8
    )
    bx.set_ylabel("success rate (mean over seeds)")
    bx.set_ylim(0, 1)
    bx.legend()
    bx.set_title("per goal (x, y), geodesic distance from the start")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t0 = time.perf_counter()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    runs = {
        "kmyriad": Path(args.kmyriad_run) if args.kmyriad_run else None,
        "single": Path(args.single_run) if args.single_run else None,
    }
    timing: dict[str, float] = {}
    t = time.perf_counter()
    todo = {
        name: (work / name, overrides)
        for name, overrides in (("kmyriad", []), ("single", ["population.size=1"]))
        if runs[name] is None
    }
    with ProcessPoolExecutor(max_workers=max(1, min(args.workers, len(todo)))) as pool:
        futures = {
            name: pool.submit(pretrain_run, folder, overrides, args.quick)
            for name, (folder, overrides) in todo.items()
        }
        for name, future in futures.items():
            runs[name] = future.result()
    timing["pretraining_s"] = time.perf_counter() - t
    t = time.perf_counter()
    random_path = random_dataset(work / "random" / "transitions.hdf5", args.size, seed=0)
    timing["random_dataset_s"] = time.perf_counter() - t

    goals = goal_points(args.goals)
    t = time.perf_counter()
    full = {
        "kmyriad": load(runs["kmyriad"]),
        "single": load(runs["single"]),
        "random": load(random_path),
    }
    # Each seed draws its own subsample, so the interval covers the choice of data too.
    samples = {
        (name, seed): subsample(full[name], args.size, seed=seed)
        for name in DATASETS
        for seed in range(args.seeds)
    }
    del full
    stats = {name: describe(samples[name, 0], goals) for name in DATASETS}
    timing["datasets_s"] = time.perf_counter() - t
    for name, s in stats.items():
        print(
            f"{name:8s} {s['transitions']:,} transitions, {s['episodes']:,} episodes, coverage "
            f"{100 * s['coverage_union']:.1f}%, transitions reaching each goal "
            f"{s['transitions_reaching_goal']}",
            flush=True,
        )

    jobs = [
        {
            "name": name,
            "seed": seed,
            "data": samples[name, seed],
            "goals": goals,
            "steps": args.steps,
            "hidden": args.hidden,
            "eval_episodes": args.eval_episodes,
        }
        for seed in range(args.seeds)
        for name in DATASETS
    ]
    t = time.perf_counter()
    results = []
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        for r in pool.map(train_and_evaluate, jobs):
            print(
                f"  {r['dataset']:8s} seed {r['seed']}: success {r['success']:.2f} "
                f"({r['train_s']:.0f} s training)",
                flush=True,
            )
            results.append(r)
    timing["training_and_eval_s"] = time.perf_counter() - t
    timing["total_s"] = time.perf_counter() - t0

    summary = {}
    for name in DATASETS:
        vals = [r["success"] for r in results if r["dataset"] == name]
        mean, half = interval(vals)
        per_goal = np.array([r["success_per_goal"] for r in results if r["dataset"] == name])
        summary[name] = {
            "success_mean": mean,
            "success_ci95": half,
            "success_per_seed": vals,
            "success_per_goal_mean": per_goal.mean(0).tolist(),
            **stats[name],
        }
    result = {
        "benchmark": "offline_goal_reaching",
        "env": ENV,
        "env_options": ENV_OPTIONS,
        "goals": [list(g) for g in goals],
        "goal_distances_from_start": [start_distance(g) for g in goals],
        "settings": {
            k: getattr(args, k)
            for k in ("size", "goals", "seeds", "steps", "hidden", "eval_episodes", "quick")
        },
        "algorithm": "d3rlpy IQL (expectile 0.9, temperature 10, gamma 0.99, batch 256, "
        "tau 0.05), goal appended to the observation, actions sampled from the policy",
        "runs_used": {k: str(v) for k, v in runs.items()},
        "summary": summary,
        "runs": results,
        "timing": timing,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json(out.with_suffix(".json"), result)
    plot(result, out.with_suffix(".png"))
    print(f"\n{'dataset':8s}  success (mean, 95% CI over {args.seeds} seeds)  coverage")
    for name, s in summary.items():
        print(
            f"{name:8s}  {s['success_mean']:.3f} +- {s['success_ci95']:.3f}"
            f"{'':24s}{100 * s['coverage_union']:.1f}%"
        )
    print(f"total {timing['total_s'] / 60:.1f} min; wrote {out.with_suffix('.json')} and .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
