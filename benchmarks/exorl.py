"""The ExORL protocol on myriad's data: does a diverse population's reward-free data train better
task policies offline than other exploration data of the same size?

ExORL ("Don't Change the Algorithm, Change the Data", arXiv 2201.13425): collect reward-free
data, relabel it with each downstream task's reward, train off-policy RL (TD3) and an offline RL
method on the fixed data, evaluate the task policy. Here:

- **Data sources** (equal size ``N`` transitions, one dataset per seed):
  (a) ``kmyriad``: K-Myriad pretraining (default config: 8 members, beta = 1, 512 envs,
  150 iterations), then ``N`` transitions of its *final* population
  (:func:`myriad.datasets.final_population_rows`, actions sampled as in pretraining);
  (b) ``single``: the same with ``population.size=1`` (one policy, the same k-NN objective,
  the APT-style baseline); (c) ``independent``: 8 members with ``objective.beta=0`` (each
  maximises its own entropy, no diversity term); (d) ``random``: uniformly random actions.
  Seed ``s`` pretrains with ``seed=s`` and rolls out with seed ``s``.
- **Tasks**: ``G`` goals per env at set geodesic distances from the start, near to far
  (:data:`GOAL_DISTANCES`), on ``nav-maze`` and ``nav-three-routes``;
  sparse reward (+1 and a terminal within the goal radius), relabelled from next states
  (:func:`myriad.datasets.relabel`). One goal-conditioned policy per run: the dataset is
  relabelled once per goal and the goal (scaled like the position) appended to the observation.
- **Learners**: ``td3`` (:class:`myriad.rl.td3.OfflineTD3`, plain TD3, ExORL's choice) and
  ``iql`` (d3rlpy IQL, expectile 0.7, temperature 3), both with 64x64 networks, batch 256,
  gamma 0.99; evaluated every ``--eval-every`` gradient steps.
- **Evaluation**: the policy's deterministic action, ``--eval-episodes`` episodes per goal from
  the env's start; success = reaching the goal within the time limit.

The script is resumable run by run: every finished run writes one JSON under
``<out>/runs/`` and a finished run is never repeated; pretraining runs and datasets are kept under
``--work``. Runs go in a fixed order (see :func:`plan`): both envs and all four data sources per
seed before the next seed, TD3 then IQL, the dataset-size sweep (TD3, maze) after the first two
seeds. ``--report`` aggregates the finished runs: IQM and 95% stratified bootstrap intervals
over seeds (rliable, ``benchmarks/seed_statistics.py``), success against goal distance and
against dataset size, and the dataset measures of ``myriad dataset info`` beside each source.

    nice -n 10 python benchmarks/exorl.py                # run (resumable)
    python benchmarks/exorl.py --report                  # aggregate what has finished
    python benchmarks/exorl.py --quick                   # smoke test (about 2 minutes)

Writes ``benchmarks/results/exorl/runs/*.json``, ``benchmarks/results/exorl.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = Path(__file__).parent / "results"
ENVS = {"maze": "nav-maze", "three_routes": "nav-three-routes"}
SOURCES = ("kmyriad", "single", "independent", "random")
OVERRIDES = {
    "kmyriad": [],
    "single": ["population.size=1"],
    "independent": ["objective.beta=0.0"],
}
LEARNERS = ("td3", "iql")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--work", default="runs/exorl", help="pretraining runs and datasets")
    p.add_argument("--out", default=str(RESULTS / "exorl"), help="results folder")
    p.add_argument("--size", type=int, default=100_000, help="transitions per dataset")
    p.add_argument(
        "--sizes",
        type=int,
        nargs="*",
        default=[25_000, 400_000],
        help="extra dataset sizes (TD3, maze)",
    )
    p.add_argument("--seeds", type=int, default=5)
    p.add_argument("--goals", type=int, default=6)
    p.add_argument("--td3-steps", type=int, default=40_000)
    p.add_argument("--iql-steps", type=int, default=20_000)
    p.add_argument("--eval-every", type=int, default=10_000)
    p.add_argument("--eval-episodes", type=int, default=10, help="per goal")
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--iterations", type=int, default=150, help="pretraining iterations")
    p.add_argument("--only", nargs="*", default=None, help="run ids to run (default: all)")
    p.add_argument(
        "--envs",
        nargs="*",
        choices=sorted(ENVS),
        default=sorted(ENVS),
        help="run only these envs (one process per env shares a machine without two processes "
        "pretraining the same run)",
    )
    p.add_argument("--report", action="store_true", help="only aggregate finished runs")
    p.add_argument("--quick", action="store_true", help="tiny everything (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.sizes, args.seeds, args.goals = 4000, [2000], 1, 2
        args.td3_steps = args.iql_steps = args.eval_every = 200
        args.eval_episodes, args.hidden, args.iterations = 2, 32, 4
        args.work, args.out = args.work + "-quick", args.out + "-quick"
    return args


# -- plan ----------------------------------------------------------------------------------------
def run_id(env: str, source: str, learner: str, size: int, seed: int) -> str:
    return f"{env}-{source}-{learner}-n{size}-s{seed}"


def plan(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every run, in the order they are done."""
    jobs: list[dict[str, Any]] = []

    def add(seeds: range, learners: tuple[str, ...], envs: tuple[str, ...], sizes: list[int]):
        for seed in seeds:
            for learner in learners:
                for env in envs:
                    for size in sizes:
                        for source in SOURCES:
                            jobs.append(
                                {
                                    "env": env,
                                    "source": source,
                                    "learner": learner,
                                    "size": size,
                                    "seed": seed,
                                }
                            )

    for seed in range(args.seeds):
        add(range(seed, seed + 1), ("td3",), tuple(ENVS), [args.size])
        add(range(seed, seed + 1), ("iql",), tuple(ENVS), [args.size])
        if seed == 1:
            add(range(2), ("td3",), ("maze",), list(args.sizes))
    return jobs


# -- data ----------------------------------------------------------------------------------------
def pretrain_run(work: Path, env: str, source: str, seed: int, iterations: int) -> Path:
    from myriad.pretrain import pretrain

    folder = work / env / f"seed{seed}" / source
    # Finished once its dataset is published: the last step of a run (a summary.json alone may
    # be the one written before the final evaluation).
    if (folder / "dataset" / "transitions.hdf5").is_file():
        return folder
    overrides = [
        f"env={env}",
        f"seed={seed}",
        f"iterations={iterations}",
        "progress=false",
        "plots=false",
        *OVERRIDES[source],
    ]
    if (folder / "checkpoints").is_dir():  # killed part-way: continue it
        pretrain(resume=folder, quiet=True)
    else:
        pretrain(overrides, run_dir=folder, quiet=True, overwrite=folder.exists())
    return folder


def dataset_path(work: Path, env: str, source: str, size: int, seed: int) -> Path:
    return work / env / f"seed{seed}" / "data" / f"{source}-n{size}.hdf5"


def build_dataset(args: argparse.Namespace, env: str, source: str, size: int, seed: int) -> Path:
    """The reward-free dataset of one source (written once, then reused)."""
    from myriad.datasets import D4RLWriter, final_population_rows, random_policy_rows
    from myriad.envs import make

    work = Path(args.work)
    path = dataset_path(work, env, source, size, seed)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if source == "random":
        options = env_options(env)
        venv = make(ENVS[env], 256, "cpu", **options)
        metadata = {
            "env": ENVS[env],
            "env_options": options,
            "population_size": 1,
            "seed": seed,
            "reward": "none (uniformly random actions)",
            "selection": {"rule": "random_actions", "transitions": size, "seed": seed},
        }
        writer = D4RLWriter(
            path, venv.obs_dim, venv.action_dim, venv.features.names, metadata=metadata
        )
        steps = math.ceil(size / venv.num_envs) + venv.max_episode_steps
        left = size
        for rows in random_policy_rows(venv, steps, seed=seed):
            n = len(rows["rewards"])
            if n and left:
                if n > left:
                    rows = {k: v[:left].copy() for k, v in rows.items()}
                    rows["timeouts"][-1] = not rows["terminals"][-1]
                writer.append(rows)
                left -= min(n, left)
            if not left:
                break
        venv.close()
        writer.close()
        return path
    run = pretrain_run(work, env, source, seed, args.iterations)
    spec, rows = final_population_rows(run, size, seed=seed)
    writer = D4RLWriter(
        path, spec.obs_dim, spec.action_dim, spec.feature_names, metadata=spec.metadata
    )
    for batch in rows:
        writer.append(batch)
    writer.close()
    return path


def env_options(env: str) -> dict[str, Any]:
    import yaml

    cfg = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "configs" / "env" / f"{env}.yaml").read_text()
    )
    return dict(cfg.get("options") or {})


# Goal distances from the start (geodesic, in cells), near to far: the nearest goals are where
# a short budget can succeed, the farthest where only value propagation over long horizons can.
GOAL_DISTANCES = {"maze": (5, 10, 20, 30, 45, 60), "three_routes": (3, 6, 10, 14, 18, 24)}


def goals_of(env: str, count: int) -> tuple[list[tuple[float, float]], list[int]]:
    """Up to ``count`` goals at the distances of :data:`GOAL_DISTANCES` (for each, the first
    reachable cell in row-major order at that geodesic distance from the start), and their
    distances."""
    from myriad.envs.layout import Layout

    layout = Layout.load(env)
    dist = layout.distances_from(layout.starts[0])
    goals, dists = [], []
    for d in GOAL_DISTANCES[env][:count]:
        rows, cols = np.nonzero(layout.reachable & (dist == d))
        goals.append(layout.cell_center(int(rows[0]), int(cols[0])))
        dists.append(int(d))
    return goals, dists


def scaled(goal: tuple[float, float], env: str) -> np.ndarray:
    from myriad.envs.layout import Layout

    layout = Layout.load(env)
    return (np.asarray(goal, np.float32) / np.array([layout.width, layout.height]) * 2 - 1).astype(
        np.float32
    )


def goal_conditioned(data: Any, env: str, goals: list[tuple[float, float]]) -> Any:
    """One relabelled copy of ``data`` per goal, the goal appended to (next) observations."""
    from myriad.datasets.data import goal_conditioned as conditioned
    from myriad.envs.layout import Layout

    layout = Layout.load(env)
    return conditioned(data, goals, (layout.width, layout.height), clip_actions=True)


# -- learners ------------------------------------------------------------------------------------
def evaluate(
    act: Any, env: str, goals: list[tuple[float, float]], episodes: int, seed: int
) -> list[float]:
    """Success rate per goal of the deterministic policy ``act(obs [N, O + 2]) -> [N, A]``."""
    from myriad.envs import make

    opts = env_options(env)
    envs = [make(ENVS[env], episodes, "cpu", task="sparse", goal=g, **opts) for g in goals]
    obs = [e.reset(seed=seed + i) for i, e in enumerate(envs)]
    tags = [np.broadcast_to(scaled(g, env), (episodes, 2)) for g in goals]
    done = [np.zeros(episodes, bool) for _ in goals]
    hit = [np.zeros(episodes, bool) for _ in goals]
    for _ in range(envs[0].max_episode_steps):
        batch = np.concatenate([np.concatenate([o.numpy(), t], 1) for o, t in zip(obs, tags)])
        actions = np.clip(np.asarray(act(batch.astype(np.float32))), -1.0, 1.0)
        for i, e in enumerate(envs):
            a = torch.as_tensor(actions[i * episodes : (i + 1) * episodes], dtype=torch.float32)
            obs[i], _, term, trunc, info = e.step(a)
            hit[i] |= ~done[i] & info["success"].numpy()
            done[i] |= (term | trunc).numpy()
        if all(d.all() for d in done):
            break
    for e in envs:
        e.close()
    return [float(h.mean()) for h in hit]


def train(
    args: argparse.Namespace, job: dict[str, Any], data: Any, goals: list[tuple[float, float]]
) -> list[dict[str, Any]]:
    """Train one learner, evaluating every ``eval_every`` steps; the learning curve."""
    steps = args.td3_steps if job["learner"] == "td3" else args.iql_steps
    curve = []
    eval_seed = 10_000 + job["seed"]
    if job["learner"] == "td3":
        from myriad.rl.td3 import OfflineTD3, TD3Config

        td3 = OfflineTD3(
            data.observations.shape[1],
            data.actions.shape[1],
            TD3Config(hidden=(args.hidden, args.hidden)),
            seed=job["seed"],
        )
        tensors = {
            k: torch.as_tensor(getattr(data, k), dtype=torch.float32)
            for k in ("observations", "actions", "rewards", "next_observations", "terminals")
        }
        done = 0
        while done < steps:
            chunk = min(args.eval_every, steps - done)
            for _ in range(chunk):
                stats = td3.update(td3.sample(tensors))
            done += chunk
            curve.append(
                {
                    "step": done,
                    "success_per_goal": evaluate(
                        td3.act, job["env"], goals, args.eval_episodes, eval_seed
                    ),
                    **stats,
                }
            )
        return curve
    import logging

    import d3rlpy
    import structlog

    from myriad.datasets import to_d3rlpy

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    d3rlpy.seed(job["seed"])
    enc = d3rlpy.models.VectorEncoderFactory([args.hidden, args.hidden])
    algo = d3rlpy.algos.IQLConfig(
        actor_encoder_factory=enc,
        critic_encoder_factory=enc,
        value_encoder_factory=enc,
        batch_size=256,
        gamma=0.99,
        expectile=0.7,
        weight_temp=3.0,
        tau=0.005,
    ).create(device="cpu")
    dataset = to_d3rlpy(data)
    for _ in algo.fitter(
        dataset,
        n_steps=steps,
        n_steps_per_epoch=args.eval_every,
        show_progress=False,
        save_interval=10**9,
        logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
    ):
        curve.append(
            {
                "step": len(curve) * args.eval_every + args.eval_every,
                "success_per_goal": evaluate(
                    algo.predict, job["env"], goals, args.eval_episodes, eval_seed
                ),
            }
        )
    return curve


def run_job(args: argparse.Namespace, job: dict[str, Any]) -> dict[str, Any]:
    from myriad.datasets import load

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    path = build_dataset(args, job["env"], job["source"], job["size"], job["seed"])
    t_data = time.perf_counter() - t0
    goals, dist = goals_of(job["env"], args.goals)
    data = load(path)
    gc = goal_conditioned(data, job["env"], goals)
    reaching = [
        int(gc.terminals[i * len(data) : (i + 1) * len(data)].sum()) for i in range(len(goals))
    ]
    t1 = time.perf_counter()
    curve = train(args, job, gc, goals)
    final = curve[-1]["success_per_goal"]
    return {
        **job,
        "run": run_id(**job),
        "dataset": str(path),
        "transitions": len(data),
        "goals": [list(g) for g in goals],
        "goal_distances_from_start": dist,
        "goal_reaching_transitions": reaching,
        "curve": curve,
        "success_per_goal": final,
        "success": float(np.mean(final)),
        "steps": curve[-1]["step"],
        "settings": {
            k: getattr(args, k)
            for k in (
                "size",
                "goals",
                "td3_steps",
                "iql_steps",
                "eval_every",
                "eval_episodes",
                "hidden",
                "iterations",
                "quick",
            )
        },
        "data_s": t_data,
        "train_s": time.perf_counter() - t1,
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0]},
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runs_dir = Path(args.out) / "runs"
    if args.report:
        from exorl_report import report

        report(args)
        return 0
    runs_dir.mkdir(parents=True, exist_ok=True)
    for job in plan(args):
        rid = run_id(**job)
        target = runs_dir / f"{rid}.json"
        if target.is_file() or (args.only is not None and rid not in args.only):
            continue
        if job["env"] not in args.envs:
            continue
        result = run_job(args, job)
        tmp = target.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(result, indent=1))
        tmp.replace(target)  # a run's JSON appears whole or not at all
        print(
            f"{rid}: success {result['success']:.3f} ({result['train_s'] / 60:.1f} min)", flush=True
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
