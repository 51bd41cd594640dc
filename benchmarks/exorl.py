"""The ExORL protocol on myriad's data: does a diverse population's reward-free data train better
task policies offline than other exploration data of the same size?

ExORL ("Don't Change the Algorithm, Change the Data", arXiv 2201.13425): collect reward-free
data, relabel it with each downstream task's reward, train off-policy RL (TD3) and an offline RL
method on the fixed data, evaluate the task policy. Here:

- **Data sources** (equal size ``N`` transitions, one dataset per seed):
  (a) ``kmyriad``: K-Myriad pretraining (default config: 8 members, beta = 1, 512 envs,
  :data:`PRETRAIN_ITERATIONS` iterations), then ``N`` transitions of its *final* population
  (:func:`myriad.datasets.final_population_rows`, actions sampled as in pretraining);
  (b) ``single``: the same with ``population.size=1`` (one policy, the same k-NN objective,
  the APT-style baseline); (c) ``independent``: 8 members with ``objective.beta=0`` (each
  maximises its own entropy, no diversity term); (d) ``random``: uniformly random actions.
  Seed ``s`` pretrains with ``seed=s`` and rolls out with seed ``s``. Beside them, outside the
  default plan (``--sources``), the remedies tried where the population's data lost
  (``benchmarks/exorl_why.py``): ``kmyriad_m16`` (``population.size=16``),
  ``kmyriad_beta0.5`` and ``kmyriad_beta0.75`` (``objective.beta``), and ``kmyriad_all``
  (``N`` transitions of whole episodes drawn uniformly from everything the ``kmyriad`` run
  recorded, :func:`whole_run_rows`).
- **Tasks**: ``G`` goals per env at set geodesic distances from the start, near to far
  (:data:`GOAL_DISTANCES`), on ``nav-maze``, ``nav-three-routes`` and the Ant U-maze
  (``mujoco-antmaze-u``, goals in maze cells of 4 m); sparse reward (+1 and a terminal within
  ``--goal-radius``, :data:`GOAL_RADII`), relabelled from next states
  (:func:`myriad.datasets.relabel`, which also rewrites the Ant maze's goal offset in the
  observations). One goal-conditioned policy per run: the dataset is relabelled once per goal
  and the goal (scaled to ``[-1, 1]`` over the map) appended to the observation.
- **Learners**: ``td3`` (:class:`myriad.rl.td3.OfflineTD3`, plain TD3, ExORL's choice,
  :data:`TD3_STEPS` gradient steps) and ``iql`` (d3rlpy IQL with its AntMaze setting,
  :data:`IQL_SETTINGS`, :data:`IQL_STEPS` steps), both with 64x64 networks, batch 256,
  gamma 0.99; evaluated ``--curve-points`` times at equal intervals (the learning curve).
- **Evaluation** (:func:`evaluate`): the policy's deterministic action, ``--eval-episodes``
  episodes per goal from starts drawn over the start square (:func:`eval_seed`: the same for
  every source, distinct per seed and goal); success = reaching the goal within the time limit;
  beside it the closest geodesic distance to the goal and the progress towards it.

The script is resumable run by run: every finished run writes one JSON under
``<out>/runs/`` and a finished run is never repeated; pretraining runs and datasets are kept under
``--work``. Runs go in a fixed order (see :func:`plan`): both envs and all four data sources per
seed before the next seed, TD3 then IQL; the dataset-size sweep (TD3, maze) of the first two seeds
after seed 1, of each later seed after that seed. ``--report`` aggregates the finished runs: IQM
and 95% stratified bootstrap intervals over seeds (rliable, ``benchmarks/seed_statistics.py``),
success against goal distance and against dataset size, and the dataset measures of
``myriad dataset info`` beside each source.

    nice -n 10 python benchmarks/exorl.py                # run (resumable)
    python benchmarks/exorl.py --report                  # aggregate what has finished
    python benchmarks/exorl.py --quick                   # smoke test (about 2 minutes)

``benchmarks/exorl_audit.py`` holds the experiments behind the goal radius, the evaluation and
IQL's setting (docs/datasets.md, "Audit of the first protocol").

Writes ``benchmarks/results/exorl/runs/*.json``, ``benchmarks/results/exorl.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = Path(__file__).parent / "results"
ENVS = {"maze": "nav-maze", "three_routes": "nav-three-routes", "antmaze_u": "mujoco-antmaze-u"}
# Pretraining iterations per env (512 envs x 32 steps each): the nav envs' 2.5M env steps; the
# Ant U-maze's 4.9M, where a K-Myriad population covers its corridors and reaches its far end
# (benchmarks/results/antmaze_exploration.json).
PRETRAIN_ITERATIONS = {"maze": 150, "three_routes": 150, "antmaze_u": 300}
SOURCES = ("kmyriad", "single", "independent", "random")
OVERRIDES = {
    "kmyriad": [],
    "single": ["population.size=1"],
    "independent": ["objective.beta=0.0"],
    # Remedies tried where the population's data lost (docs/datasets.md, "Why the population's
    # data lost on nav-three-routes (seed 0)"): not in the default plan, run with --sources.
    "kmyriad_m16": ["population.size=16"],
    "kmyriad_beta0.5": ["objective.beta=0.5"],
    "kmyriad_beta0.75": ["objective.beta=0.75"],
}
# Sources whose N transitions are whole episodes drawn uniformly from everything another
# source's pretraining run recorded (all 150 iterations) instead of its final population.
WHOLE_RUN = {"kmyriad_all": "kmyriad"}
REMEDIES = ("kmyriad_m16", "kmyriad_beta0.5", "kmyriad_beta0.75", "kmyriad_all")
LEARNERS = ("td3", "iql")
# Gradient steps per run: where the learning curves of maze, K-Myriad, seed 0 have flattened
# (docs/datasets.md), and what 5 seeds of every run afford on a 2-core CPU in about 10 CPU-hours.
TD3_STEPS, IQL_STEPS = 200_000, 100_000
# The goal disc's radius, in cells. The env's default (0.5) is the disc inscribed in the goal's
# cell: a policy sliding along a wall of that cell stays 0.5 - 1e-4 from the centre only within
# 0.01 cells of it, and at 0.85 cells per step steps over that strip, so whether it "reaches" the
# goal is decided by the phase of its start, not by where it goes. 0.75 holds the whole goal
# cell (> sqrt(2) / 2) and a chord of 1.1 cells along its walls (> 0.85).
GOAL_RADIUS = 0.75
# Per env: the nav envs' 0.75 cells; the Ant maze's own success distance, 0.45 m
# (Gymnasium-Robotics'), in cells of 4 m.
GOAL_RADII = {
    "maze": GOAL_RADIUS,
    "three_routes": GOAL_RADIUS,
    "antmaze_u": 0.45,
}  # IQL with its published setting for sparse goal reaching (AntMaze, Kostrikov et al. 2021):
# reward - 1 (0 at the goal, -1 per step), expectile 0.9, temperature 10. With the +1 reward and
# temperature 3 the advantages are ~0.01 and the weights ~1: the policy clones the data's mean
# action, ~0 on the population's data (members heading different ways), and stalls.
IQL_SETTINGS = {"expectile": 0.9, "weight_temp": 10.0, "reward_offset": -1.0}


def iql(hidden: int, expectile: float, weight_temp: float) -> Any:
    """d3rlpy's IQL on the CPU with ``hidden x hidden`` networks, batch 256, gamma 0.99."""
    from myriad.datasets import import_d3rlpy

    d3rlpy = import_d3rlpy()
    enc = d3rlpy.models.VectorEncoderFactory([hidden, hidden])
    return d3rlpy.algos.IQLConfig(
        actor_encoder_factory=enc,
        critic_encoder_factory=enc,
        value_encoder_factory=enc,
        batch_size=256,
        gamma=0.99,
        expectile=expectile,
        weight_temp=weight_temp,
        tau=0.005,
    ).create(device="cpu")


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
    p.add_argument("--td3-steps", type=int, default=TD3_STEPS)
    p.add_argument("--iql-steps", type=int, default=IQL_STEPS)
    p.add_argument(
        "--curve-points", type=int, default=10, help="evaluations per run (the learning curve)"
    )
    p.add_argument("--eval-episodes", type=int, default=50, help="per goal")
    p.add_argument(
        "--goal-radius",
        type=float,
        default=None,
        help="a goal is reached within this distance (relabelling and evaluation; default: "
        "GOAL_RADII's for the env)",
    )
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument(
        "--iterations",
        type=int,
        default=None,
        help="pretraining iterations (default: PRETRAIN_ITERATIONS's for the env)",
    )
    p.add_argument("--only", nargs="*", default=None, help="run ids to run (default: all)")
    p.add_argument(
        "--sources",
        nargs="*",
        choices=SOURCES + REMEDIES,
        default=list(SOURCES),
        help="data sources to plan (default: the protocol's four; the remedies are extra)",
    )
    p.add_argument(
        "--envs",
        nargs="*",
        choices=sorted(ENVS),
        default=sorted(ENVS),
        help="run only these envs (one process per env shares a machine without two processes "
        "pretraining the same run)",
    )
    p.add_argument("--report", action="store_true", help="only aggregate finished runs")
    p.add_argument(
        "--allow-missing-datasets",
        action="store_true",
        help="--report even where runs' datasets are gone (their measures left out)",
    )
    p.add_argument(
        "--store-measures",
        action="store_true",
        help="record the dataset measures in finished runs that predate them (needs their "
        "datasets, under --work)",
    )
    p.add_argument("--quick", action="store_true", help="tiny everything (smoke test)")
    args = p.parse_args(argv)
    if args.quick:
        args.size, args.sizes, args.seeds, args.goals = 4000, [2000], 1, 2
        args.td3_steps = args.iql_steps = 200
        args.curve_points, args.eval_episodes, args.hidden, args.iterations = 1, 2, 32, 4
        args.work, args.out = args.work + "-quick", args.out + "-quick"
    return args


def goal_radius(args: argparse.Namespace, env: str) -> float:
    return args.goal_radius if args.goal_radius is not None else GOAL_RADII[env]


def iterations(args: argparse.Namespace, env: str) -> int:
    return args.iterations if args.iterations is not None else PRETRAIN_ITERATIONS[env]


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
                        for source in args.sources:
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
        # The size sweep (TD3, maze) of seeds 0-1 runs after seed 1's main runs, each later
        # seed's right after its own: the first figures against size come early.
        if seed == 1:
            add(range(2), ("td3",), ("maze",), list(args.sizes))
        elif seed > 1:
            add(range(seed, seed + 1), ("td3",), ("maze",), list(args.sizes))
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
    if source in WHOLE_RUN:
        run = pretrain_run(work, env, WHOLE_RUN[source], seed, iterations(args, env))
        spec, rows = whole_run_rows(run, size, seed)
    else:
        run = pretrain_run(work, env, source, seed, iterations(args, env))
        spec, rows = final_population_rows(run, size, seed=seed)
    writer = D4RLWriter(
        path, spec.obs_dim, spec.action_dim, spec.feature_names, metadata=spec.metadata
    )
    for batch in rows:
        writer.append(batch)
    writer.close()
    return path


def whole_run_rows(run: Path, size: int, seed: int) -> tuple[Any, Any]:
    """``size`` transitions of whole episodes drawn uniformly without replacement from every row
    a pretraining run recorded (the last drawn episode cut to fit, its last row a timeout);
    returns ``(spec, rows)`` like :func:`myriad.datasets.final_population_rows`."""
    from myriad.datasets import DatasetSpec, open_reader
    from myriad.datasets.formats import run_dataset
    from myriad.datasets.selection import episode_stream

    path = run_dataset(run)
    reader = open_reader(path)
    try:
        spec = reader.spec
        done = np.concatenate([r["terminals"] | r["timeouts"] for r in reader.iter_chunks()])
    finally:
        reader.close()
    lengths = np.diff(np.concatenate([[-1], np.flatnonzero(done)]))  # [K] rows per episode
    order = np.random.default_rng(seed).permutation(len(lengths))
    total = np.cumsum(lengths[order])
    count = int(np.searchsorted(total, size)) + 1  # episodes until the sum reaches ``size``
    if count > len(order):
        raise ValueError(f"{path} holds {int(total[-1])} transitions, fewer than {size}")
    chosen = order[:count]
    last_rows = int(size - (total[count - 2] if count > 1 else 0))
    metadata = {
        **{k: v for k, v in spec.metadata.items() if k != "iteration_rows"},
        "exported_from": str(path),
        "selection": {
            "rule": "uniform_episodes",
            "transitions": size,
            "seed": seed,
            "episodes_chosen": count,
            "episodes_available": len(lengths),
        },
    }
    out = DatasetSpec(spec.obs_dim, spec.action_dim, spec.feature_names, metadata)

    def rows() -> Any:
        reader = open_reader(path)
        try:
            yield from episode_stream(reader.iter_chunks(), chosen, int(chosen[-1]), last_rows)
        finally:
            reader.close()

    return out, rows()


def env_options(env: str) -> dict[str, Any]:
    import yaml

    cfg = yaml.safe_load(
        (Path(__file__).resolve().parents[1] / "configs" / "env" / f"{env}.yaml").read_text()
    )
    return dict(cfg.get("options") or {})


# Goal distances from the start (geodesic, in cells), near to far: the nearest goals are where
# a short budget can succeed, the farthest where only value propagation over long horizons can.
GOAL_DISTANCES = {
    "maze": (5, 10, 20, 30, 45, 60),
    "three_routes": (3, 6, 10, 14, 18, 24),
    # The U-maze's 7 cells: every free cell but the start's, the env's own goal last.
    "antmaze_u": (1, 2, 3, 4, 5, 6),
}


def maze_of(env: str) -> Any:
    """The env's layout: a nav :class:`~myriad.envs.layout.Layout` or an Ant maze's
    :class:`~myriad.envs.mujoco.models.MazeLayout`."""
    from myriad.envs.layout import Layout
    from myriad.envs.mujoco.locomotion import AntMazeEnv

    if ENVS[env].startswith("mujoco-antmaze-"):
        return AntMazeEnv._MAZES[ENVS[env].removeprefix("mujoco-antmaze-")]
    return Layout.load(env)


def goals_of(env: str, count: int) -> tuple[list[tuple[float, float]], list[int]]:
    """Up to ``count`` goals at the distances of :data:`GOAL_DISTANCES` (for each, the first
    reachable cell in row-major order at that geodesic distance from the start), and their
    distances."""
    layout = maze_of(env)
    if hasattr(layout, "starts"):  # nav
        dist = np.where(layout.reachable, layout.distances_from(layout.starts[0]), -1)
    else:
        dist = layout.distances_from(layout.cells_with("r")[0])
    goals, dists = [], []
    for d in GOAL_DISTANCES[env][:count]:
        rows, cols = np.nonzero(dist == d)
        goals.append(layout.cell_center(int(rows[0]), int(cols[0])))
        dists.append(int(d))
    return goals, dists


def map_frame(env: str) -> tuple[tuple[float, float], tuple[float, float]]:
    """``(size, origin)`` of the env's map: goals are scaled to ``2 (goal - origin) / size - 1``
    (a nav env's position scaling; an Ant maze is centred on 0)."""
    layout = maze_of(env)
    if hasattr(layout, "extent"):
        hx, hy = layout.extent
        return (2 * hx, 2 * hy), (-hx, -hy)
    return (layout.width, layout.height), (0.0, 0.0)


def scaled(goal: tuple[float, float], env: str) -> np.ndarray:
    size, origin = map_frame(env)
    return ((np.asarray(goal, np.float32) - origin) / np.asarray(size) * 2 - 1).astype(np.float32)


def goal_conditioned(
    data: Any, env: str, goals: list[tuple[float, float]], radius: float = GOAL_RADIUS
) -> Any:
    """One relabelled copy of ``data`` per goal (reached within ``radius``), the goal appended
    to (next) observations."""
    from myriad.datasets.data import goal_conditioned as conditioned

    size, origin = map_frame(env)
    return conditioned(data, goals, size, clip_actions=True, goal_radius=radius, origin=origin)


# -- learners ------------------------------------------------------------------------------------
def eval_seed(seed: int, goal_index: int) -> int:
    """The start-drawing seed of goal ``goal_index``'s evaluation episodes in seed ``seed``'s
    runs: the same for every data source and learner (they are compared on the same starts),
    distinct for every (seed, goal)."""
    return 10_000 + 100 * seed + goal_index


def evaluate(
    act: Any,
    env: str,
    goals: list[tuple[float, float]],
    episodes: int,
    seed: int,
    radius: float = GOAL_RADIUS,
) -> dict[str, list[float]]:
    """The deterministic policy ``act(obs [N, O + 2]) -> [N, A]`` on each goal, ``episodes``
    episodes from starts drawn over the env's start square (:func:`eval_seed`).

    Returns, per goal: ``success_per_goal``, the rate of episodes that reach the goal (within
    ``radius``) before the time limit; ``closest_cells_per_goal``, the mean over episodes of the
    smallest geodesic distance in cells from the agent's cell to the goal's cell during the
    episode (0 for an episode that reaches the goal); ``progress_per_goal``, the mean of
    ``1 - closest / d0`` with ``d0`` the distance from the start cell (1 at the goal, 0 for a
    policy that gets no closer than its start). Success says whether the goal is reached;
    closeness says how far the policy gets when it is not.
    """
    from myriad.envs import make

    opts = {**env_options(env), "goal_radius": radius}
    envs = [make(ENVS[env], episodes, "cpu", task="sparse", goal=g, **opts) for g in goals]
    obs = [e.reset(seed=eval_seed(seed, i)) for i, e in enumerate(envs)]
    goal_index = torch.zeros(episodes, dtype=torch.long)
    start = [e.geodesic_to_goal(e.pos, goal_index).numpy() for e in envs]
    closest = [s.copy() for s in start]
    tags = [np.broadcast_to(scaled(g, env), (episodes, 2)) for g in goals]
    done = [np.zeros(episodes, bool) for _ in goals]
    hit = [np.zeros(episodes, bool) for _ in goals]
    for _ in range(envs[0].max_episode_steps):
        batch = np.concatenate([np.concatenate([o.numpy(), t], 1) for o, t in zip(obs, tags)])
        actions = np.clip(np.asarray(act(batch.astype(np.float32))), -1.0, 1.0)
        for i, e in enumerate(envs):
            a = torch.as_tensor(actions[i * episodes : (i + 1) * episodes], dtype=torch.float32)
            obs[i], _, term, trunc, info = e.step(a)
            # The position this step reached, before the reset of an episode that ended.
            here = e.geodesic_to_goal(e.positions(info["final_obs"]), goal_index).numpy()
            closest[i] = np.where(done[i], closest[i], np.minimum(closest[i], here))
            hit[i] |= ~done[i] & info["success"].numpy()
            done[i] |= (term | trunc).numpy()
        if all(d.all() for d in done):
            break
    for e in envs:
        e.close()
    closest = [np.where(h, 0.0, c) for h, c in zip(hit, closest)]
    return {
        "success_per_goal": [float(h.mean()) for h in hit],
        "closest_cells_per_goal": [float(c.mean()) for c in closest],
        "progress_per_goal": [
            float(np.mean(1 - c / np.maximum(s, 1))) for c, s in zip(closest, start)
        ],
    }


def train(
    args: argparse.Namespace, job: dict[str, Any], data: Any, goals: list[tuple[float, float]]
) -> list[dict[str, Any]]:
    """Train one learner, evaluating ``curve_points`` times at equal intervals; the learning
    curve (each point: step, success, closeness and progress per goal, losses)."""
    steps = args.td3_steps if job["learner"] == "td3" else args.iql_steps
    every = max(1, steps // args.curve_points)
    curve: list[dict[str, Any]] = []

    def point(step: int, act: Any, **stats: Any) -> None:
        scores = evaluate(
            act, job["env"], goals, args.eval_episodes, job["seed"], goal_radius(args, job["env"])
        )
        curve.append({"step": step, **scores, **stats})

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
            chunk = min(every, steps - done)
            for _ in range(chunk):
                stats = td3.update(td3.sample(tensors))
            done += chunk
            point(done, td3.act, **stats)
        return curve
    import logging
    from dataclasses import replace

    import structlog

    from myriad.datasets import import_d3rlpy, to_d3rlpy

    d3rlpy = import_d3rlpy()

    # ERROR: d3rlpy warns at every fitter after the first that its models are already built.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    d3rlpy.seed(job["seed"])
    algo = iql(args.hidden, IQL_SETTINGS["expectile"], IQL_SETTINGS["weight_temp"])
    shifted = replace(data, rewards=data.rewards + np.float32(IQL_SETTINGS["reward_offset"]))
    dataset = to_d3rlpy(shifted)
    done = 0
    while done < steps:
        # One fitter per curve point: d3rlpy's epochs must divide its step count.
        chunk = min(every, steps - done)
        for _ in algo.fitter(
            dataset,
            n_steps=chunk,
            n_steps_per_epoch=chunk,
            show_progress=False,
            save_interval=10**9,
            logger_adapter=d3rlpy.logging.NoopAdapterFactory(),
        ):
            pass
        done += chunk
        point(done, algo.predict)
    return curve


def run_job(args: argparse.Namespace, job: dict[str, Any]) -> dict[str, Any]:
    from exorl_report import file_sha256, read_measures

    from myriad.bench.common import code_commit, machine_info
    from myriad.datasets import load

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    path = build_dataset(args, job["env"], job["source"], job["size"], job["seed"])
    t_data = time.perf_counter() - t0
    goals, dist = goals_of(job["env"], args.goals)
    data = load(path)
    gc = goal_conditioned(data, job["env"], goals, goal_radius(args, job["env"]))
    reaching = [
        int(gc.terminals[i * len(data) : (i + 1) * len(data)].sum()) for i in range(len(goals))
    ]
    t1, c1 = time.perf_counter(), time.process_time()
    curve = train(args, job, gc, goals)
    final = curve[-1]["success_per_goal"]
    return {
        **job,
        "run": run_id(**job),
        "dataset": str(path),
        # Identifies the file: a dataset rebuilt at the same path may differ.
        "dataset_sha256": file_sha256(path),
        "transitions": len(data),
        "goals": [list(g) for g in goals],
        "goal_distances_from_start": dist,
        "goal_reaching_transitions": reaching,
        # Recorded with the run, so that a report never needs the datasets.
        **read_measures(str(path), job["source"]),
        "curve": curve,
        "success_per_goal": final,
        "success": float(np.mean(final)),
        "closest_cells_per_goal": curve[-1]["closest_cells_per_goal"],
        "progress_per_goal": curve[-1]["progress_per_goal"],
        "progress": float(np.mean(curve[-1]["progress_per_goal"])),
        "steps": curve[-1]["step"],
        "iql_settings": IQL_SETTINGS,
        "settings": {
            **{
                k: getattr(args, k)
                for k in (
                    "size",
                    "goals",
                    "td3_steps",
                    "iql_steps",
                    "curve_points",
                    "eval_episodes",
                    "hidden",
                    "quick",
                )
            },
            # As the run used them (the flags' defaults depend on the env).
            "goal_radius": goal_radius(args, job["env"]),
            "iterations": iterations(args, job["env"]),
        },
        "data_s": t_data,
        "train_s": time.perf_counter() - t1,
        # CPU time of training and evaluation (one thread): the cost that budgets are set from.
        "train_cpu_s": time.process_time() - c1,
        # The CPU model too: pretraining is reproducible on one machine, and its float results
        # (and so a seed's dataset) differ between CPUs.
        "machine": machine_info(),
        "commit": code_commit(),
    }


def main(argv: list[str] | None = None) -> int:
    from myriad.utils.checkpoint import atomic_write_text

    args = parse_args(argv)
    runs_dir = Path(args.out) / "runs"
    if args.report:
        from exorl_report import report

        report(args)
        return 0
    if args.store_measures:
        from exorl_report import store_measures

        print(f"recorded the dataset measures of {store_measures(runs_dir)} runs", flush=True)
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
        atomic_write_text(target, json.dumps(result, indent=1))  # whole or not at all
        print(
            f"{rid}: success {result['success']:.3f} ({result['train_s'] / 60:.1f} min)", flush=True
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
