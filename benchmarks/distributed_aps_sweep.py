"""APS threshold sweep: PPO with worker-side inference on Ray workers, for several ``delta``.

For each ``delta`` and seed, a :class:`~myriad.nn.PopulationActorCritic` is trained with
:class:`~myriad.rl.PPO` on batches collected by :class:`~myriad.distributed.APSCollector` (the
workers act with the version they hold; PPO's old log-probabilities are the workers' behaviour
log-probabilities). ``delta = 0`` sends the weights after every update: the always-sync
baseline. Recorded per run: syncs, bytes of weights sent, policy lag, KL at sync time, the final
greedy return (deterministic policy, fresh local envs) and the training return.

Usage::

    python benchmarks/distributed_aps_sweep.py [--deltas 0 0.01 0.05 0.1 0.5] [--seeds 0 1 2]

Writes ``benchmarks/results/distributed_aps_sweep.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myriad.bench.common import machine_info, print_table, write_json
from myriad.distributed import APSCollector, RemoteVecEnv
from myriad.envs import make
from myriad.nn import PopulationActorCritic
from myriad.rl import PPO, PPOConfig, RolloutStorage
from myriad.utils.seeding import seed_everything

RESULTS = Path(__file__).resolve().parent / "results"


@torch.no_grad()
def greedy_return(
    model: PopulationActorCritic, env_name: str, options: dict, num_envs: int, seed: int
) -> float:
    """Mean return of one deterministic episode in each of ``num_envs`` fresh local envs."""
    env = make(env_name, num_envs, **options)
    member = torch.zeros(num_envs, dtype=torch.long)
    obs = env.reset(seed)
    total = torch.zeros(num_envs)
    alive = torch.ones(num_envs, dtype=torch.bool)
    for _ in range(env.max_episode_steps):
        actions = model.act(obs, member, deterministic=True).actions
        obs, reward, terminated, truncated, _ = env.step(actions)
        total += reward * alive
        alive &= ~(terminated | truncated)
    return float(total.mean())


def run(env: RemoteVecEnv, args: argparse.Namespace, delta: float, seed: int) -> dict[str, Any]:
    seed_everything(seed)
    # The settings the committed results were measured with (before the Python defaults became
    # the CLI's: init_log_std -0.5, max_lr 1e-3).
    model = PopulationActorCritic(
        env.obs_dim,
        env.action_dim,
        1,
        actor_hidden=(64, 64),
        critic_hidden=(64, 64),
        init_log_std=0.0,
    )
    ppo = PPO(
        model,
        PPOConfig(
            lr=args.lr, epochs=4, minibatches=4, gamma=0.98, schedule=args.schedule, max_lr=1e-2
        ),
        generator=torch.Generator().manual_seed(seed),
    )
    collector = APSCollector(
        env, model, horizon=args.horizon, delta=delta, seed=seed, max_lag=args.max_lag
    )
    storage = RolloutStorage(
        args.horizon,
        torch.zeros(env.num_envs, dtype=torch.long),
        env.obs_dim,
        env.action_dim,
        feature_dim=env.features.dim,
    )
    start = time.perf_counter()
    curve, train_returns = [], []
    for it in range(args.iterations):
        batch = collector.collect()
        batch.fill_storage(storage, model)
        ppo.update(storage)
        collector.publish()
        done = batch.done
        if done.any():
            train_returns.append(float(batch.episode_return[done].mean()))
        if (it + 1) % args.eval_every == 0 or it + 1 == args.iterations:
            curve.append(
                (it + 1, greedy_return(model, args.env, args.options, args.eval_envs, 10_000))
            )
    wall = time.perf_counter() - start
    stats = collector.stats()
    updates = args.iterations
    return {
        "delta": delta,
        "seed": seed,
        "final_return": curve[-1][1],
        "curve": curve,
        "train_return_last": float(np.mean(train_returns[-5:])) if train_returns else None,
        "syncs": stats["syncs"],
        "forced_syncs": stats["forced_syncs"],
        "sync_fraction": stats["syncs"] / (updates * env.num_workers),
        "syncs_per_worker": stats["syncs_per_worker"],
        "bytes_sent": stats["bytes_sent"],
        "lag_mean": stats["lag_mean"],
        "lag_max": stats["lag_max"],
        "kl_at_sync_mean": stats["kl_at_sync_mean"],
        "env_steps": stats["env_steps"],
        "wall_s": wall,
    }


def summarise(runs: list[dict[str, Any]], deltas: list[float]) -> list[dict[str, Any]]:
    base = [r for r in runs if r["delta"] == 0.0]
    base_return = float(np.mean([r["final_return"] for r in base])) if base else float("nan")
    base_bytes = float(np.mean([r["bytes_sent"] for r in base])) if base else float("nan")
    rows = []
    for d in deltas:
        sel = [r for r in runs if r["delta"] == d]
        ret = np.array([r["final_return"] for r in sel])
        rows.append(
            {
                "delta": d,
                "seeds": len(sel),
                "final_return_mean": float(ret.mean()),
                "final_return_std": float(ret.std(ddof=1)) if len(ret) > 1 else 0.0,
                "return_minus_always_sync": float(ret.mean() - base_return),
                "syncs_mean": float(np.mean([r["syncs"] for r in sel])),
                "sync_fraction_mean": float(np.mean([r["sync_fraction"] for r in sel])),
                "bytes_mean": float(np.mean([r["bytes_sent"] for r in sel])),
                "bytes_vs_always_sync": float(np.mean([r["bytes_sent"] for r in sel]) / base_bytes),
                "lag_mean": float(np.mean([r["lag_mean"] for r in sel])),
                "kl_at_sync_mean": float(np.mean([r["kl_at_sync_mean"] for r in sel])),
            }
        )
    return rows


def plot(runs: list[dict], rows: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    labels = [f"{r['delta']:g}" for r in rows]
    x = np.arange(len(rows))
    axes[0].bar(x, [r["sync_fraction_mean"] for r in rows], color="tab:blue")
    axes[0].set_ylabel("syncs / (updates x workers)")
    axes[1].bar(x, [r["bytes_mean"] / 1e6 for r in rows], color="tab:orange")
    axes[1].set_ylabel("weights sent (MB)")
    axes[2].errorbar(
        x,
        [r["final_return_mean"] for r in rows],
        yerr=[r["final_return_std"] for r in rows],
        fmt="o",
        capsize=4,
        color="tab:green",
    )
    for r in runs:
        axes[2].plot(
            [x[[row["delta"] for row in rows].index(r["delta"])]],
            [r["final_return"]],
            ".",
            color="gray",
            alpha=0.6,
        )
    axes[2].set_ylabel("final greedy return")
    for ax in axes:
        ax.set_xticks(x, labels)
        ax.set_xlabel("APS delta (0 = always sync)")
        ax.grid(True, axis="y", alpha=0.3)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="nav-two-rooms")
    parser.add_argument("--task", default="dense")
    parser.add_argument("--episode-steps", type=int, default=100)
    parser.add_argument("--num-envs", type=int, default=64)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--horizon", type=int, default=32)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--schedule", default="adaptive", choices=["adaptive", "fixed"])
    parser.add_argument("--max-lag", type=int, default=None, help="APS forced-sync lag")
    parser.add_argument("--deltas", type=float, nargs="+", default=[0.0, 0.01, 0.05, 0.1, 0.5])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--eval-every", type=int, default=10)
    parser.add_argument("--eval-envs", type=int, default=64)
    parser.add_argument("--num-cpus", type=int, default=None, help="embedded Ray CPUs")
    parser.add_argument("--out", type=Path, default=RESULTS / "distributed_aps_sweep.json")
    args = parser.parse_args()
    if 0.0 not in args.deltas:
        args.deltas = [
            0.0,
            *args.deltas,
        ]  # the always-sync baseline every other delta is read against
    args.options = {"task": args.task, "max_episode_steps": args.episode_steps}

    import ray

    torch.set_num_threads(1)
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    env = RemoteVecEnv(
        args.env, args.num_envs, args.workers, env_options=args.options, cpus_per_worker=0.5
    )
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    try:
        for seed in args.seeds:
            for delta in args.deltas:
                runs.append(run(env, args, delta, seed))
                r = runs[-1]
                print(
                    f"delta={delta:g} seed={seed}: return {r['final_return']:.2f}, "
                    f"syncs {r['syncs']}, {r['wall_s']:.1f} s",
                    flush=True,
                )
    finally:
        env.close()
        ray.shutdown()
    rows = summarise(runs, args.deltas)
    payload = {
        "benchmark": "distributed_aps_sweep",
        "machine": machine_info(),
        "load_average_1_5_15": list(load_before),
        "ray": ray.__version__,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "summary": rows,
        "runs": runs,
    }
    write_json(args.out, payload)
    title = (
        f"APS sweep: PPO on {args.env} ({args.task}), E={args.num_envs}, W={args.workers}, "
        f"T={args.horizon}, {args.iterations} updates, {len(args.seeds)} seeds, "
        f"lr {args.schedule}" + ("" if args.max_lag is None else f", max_lag={args.max_lag}")
    )
    plot(runs, rows, args.out.with_suffix(".png"), title)
    print_table(
        title,
        ["delta", "syncs", "sync frac", "bytes", "bytes/always", "lag", "return", "vs always"],
        [
            [
                f"{r['delta']:g}",
                round(r["syncs_mean"], 1),
                round(r["sync_fraction_mean"], 3),
                round(r["bytes_mean"]),
                round(r["bytes_vs_always_sync"], 3),
                round(r["lag_mean"], 2),
                f"{r['final_return_mean']:.2f} +- {r['final_return_std']:.2f}",
                f"{r['return_minus_always_sync']:+.2f}",
            ]
            for r in rows
        ],
    )
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
