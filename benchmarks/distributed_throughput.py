"""Throughput of remote (Ray) environments against the same environments stepped locally.

Measures env-steps per second and the added time per vector step for

- ``local``: ``myriad.envs.make(env, E)`` stepped in this process;
- ``remote W=w`` (central inference): :class:`myriad.distributed.RemoteVecEnv` with ``w`` Ray
  workers, actions sent from this process every step;
- ``rollout`` (worker-side inference): :class:`myriad.distributed.APSCollector` with a
  :class:`~myriad.distributed.LinearPolicy`, ``T`` steps per round trip, against the same policy
  and loop run locally.

Usage::

    python benchmarks/distributed_throughput.py [--envs 16 256 2048] [--workers 1 2] [--quick]

Writes ``benchmarks/results/distributed_throughput.json`` and ``.png``.
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
from myriad.distributed import APSCollector, LinearPolicy, RemoteVecEnv
from myriad.distributed.policy import as_dist_params, dist_sample
from myriad.envs import make

RESULTS = Path(__file__).resolve().parent / "results"


def time_steps(step: Any, steps: int, warmup: int = 5) -> float:
    """Seconds per call of ``step()``, median of three timed blocks after a warm-up."""
    for _ in range(warmup):
        step()
    blocks = []
    for _ in range(3):
        start = time.perf_counter()
        for _ in range(steps):
            step()
        blocks.append((time.perf_counter() - start) / steps)
    return float(np.median(blocks))


def bench_central(env_name: str, num_envs: int, workers: list[int], steps: int) -> list[dict]:
    rows = []
    local = make(env_name, num_envs)
    local.reset(0)
    zeros = torch.zeros(num_envs, local.action_dim)
    t_local = time_steps(lambda: local.step(zeros), steps)
    rows.append({"mode": "local", "workers": 0, "num_envs": num_envs, "s_per_step": t_local})
    for w in workers:
        if w > num_envs:
            continue
        remote = RemoteVecEnv(env_name, num_envs, w, cpus_per_worker=0.5, timeout_s=300.0)
        try:
            remote.reset(0)
            t_remote = time_steps(lambda r=remote: r.step(zeros), steps)
        finally:
            remote.close()
        rows.append({"mode": "remote", "workers": w, "num_envs": num_envs, "s_per_step": t_remote})
    for row in rows:
        row["env_steps_per_s"] = num_envs / row["s_per_step"]
        row["overhead_ms_per_step"] = 1e3 * (row["s_per_step"] - t_local)
    return rows


def bench_rollout(
    env_name: str, num_envs: int, workers: int, horizon: int, rounds: int
) -> list[dict]:
    local = make(env_name, num_envs)
    policy = LinearPolicy(local.obs_dim, local.action_dim)
    member = torch.zeros(num_envs, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    obs = local.reset(0)

    @torch.no_grad()
    def local_rollout() -> None:
        nonlocal obs
        for _ in range(horizon):
            params = as_dist_params(policy.action_params(obs, member))
            obs = local.step(dist_sample(params, gen))[0]

    t_local = time_steps(local_rollout, rounds, warmup=1) / horizon
    remote = RemoteVecEnv(env_name, num_envs, workers, cpus_per_worker=0.5, timeout_s=300.0)
    try:
        collector = APSCollector(remote, policy, horizon=horizon, delta=0.0, seed=0)
        t_remote = time_steps(collector.collect, rounds, warmup=1) / horizon
    finally:
        remote.close()
    return [
        {
            "mode": "local rollout",
            "workers": 0,
            "num_envs": num_envs,
            "horizon": horizon,
            "s_per_step": t_local,
        },
        {
            "mode": "remote rollout",
            "workers": workers,
            "num_envs": num_envs,
            "horizon": horizon,
            "s_per_step": t_remote,
        },
    ]


def plot(rows: list[dict], path: Path, note: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    labels = sorted({(r["mode"], r["workers"]) for r in rows}, key=lambda k: (k[0], k[1]))
    for mode, w in labels:
        sel = sorted(
            (r for r in rows if (r["mode"], r["workers"]) == (mode, w)), key=lambda r: r["num_envs"]
        )
        name = mode if w == 0 else f"{mode} W={w}"
        style = "--" if "rollout" in mode else "-"
        ax.plot(
            [r["num_envs"] for r in sel],
            [r["env_steps_per_s"] for r in sel],
            style,
            marker="o",
            label=name,
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("environments E")
    ax.set_ylabel("env-steps / s")
    ax.set_title(f"Remote vs local environments ({note})", fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="nav-maze")
    parser.add_argument("--envs", type=int, nargs="+", default=[16, 256, 2048])
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--steps", type=int, default=200, help="timed steps per block")
    parser.add_argument("--horizon", type=int, default=64, help="rollout length (worker mode)")
    parser.add_argument("--rounds", type=int, default=5, help="timed rollouts per block")
    parser.add_argument("--num-cpus", type=int, default=None, help="embedded Ray CPUs")
    parser.add_argument("--quick", action="store_true", help="small sizes, few steps")
    parser.add_argument("--out", type=Path, default=RESULTS / "distributed_throughput.json")
    args = parser.parse_args()
    if args.quick:
        args.envs, args.steps, args.rounds = [16, 256], 50, 2

    import ray

    torch.set_num_threads(1)
    ray.init(num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    load = os.getloadavg()  # other jobs on the machine slow every figure below
    rows: list[dict[str, Any]] = []
    for n in args.envs:
        rows += bench_central(args.env, n, args.workers, args.steps)
        rows += bench_rollout(args.env, n, max(args.workers), args.horizon, args.rounds)
    for row in rows:
        row.setdefault("env_steps_per_s", row["num_envs"] / row["s_per_step"])
    for n in args.envs:
        base = next(r for r in rows if r["mode"] == "local rollout" and r["num_envs"] == n)
        for r in rows:
            if r["mode"] == "remote rollout" and r["num_envs"] == n:
                r["overhead_ms_per_step"] = 1e3 * (r["s_per_step"] - base["s_per_step"])
    ray.shutdown()

    info = machine_info()
    payload = {
        "benchmark": "distributed_throughput",
        "env": args.env,
        "machine": info,
        "load_average_1_5_15": list(load),
        "ray": __import__("ray").__version__,
        "settings": vars(args) | {"out": str(args.out)},
        "rows": rows,
    }
    write_json(args.out, payload)
    note = f"{args.env}, {info['cpu_count']} CPUs"
    plot(rows, args.out.with_suffix(".png"), note)
    print_table(
        f"{args.env}: remote vs local",
        ["mode", "W", "E", "env-steps/s", "ms/step", "overhead ms/step"],
        [
            [
                r["mode"],
                r["workers"],
                r["num_envs"],
                round(r["env_steps_per_s"]),
                round(1e3 * r["s_per_step"], 3),
                round(r.get("overhead_ms_per_step", 0.0), 3),
            ]
            for r in rows
        ],
    )
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
