"""Ant throughput: myriad's CPU MuJoCo backend against Gymnasium's AsyncVectorEnv, same model.

Interleaved rounds (so a load change on a shared machine hits both sides alike) of:

- myriad ``mujoco-ant`` on the ``mujoco`` backend with the Gymnasium-faithful model (Gymnasium's
  ``Ant-v5`` MJCF: RK4, Newton with 100 iterations, all body-floor contacts) and with the
  ``fast`` model, at ``--num-envs`` envs;
- Gymnasium ``gym.make_vec("Ant-v5", vectorization_mode="async")`` used directly (numpy actions,
  no myriad adapter) at 2, 4 and 8 sub-processes.

Random actions in [-1, 1] from a pre-generated bank; each case runs ``--seconds`` after a warm-up,
best of two per round. The ratio reported is median over rounds of myriad's figure divided by the
median of Gymnasium's best sub-process count. The load average before and after is recorded: on a
shared machine figures under load are lower bounds.

python benchmarks/mujoco_vs_gymnasium.py [--rounds 3] [--out results/mujoco_vs_gymnasium.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch

from myriad.bench.common import machine_info, print_table, write_json
from myriad.bench.envs import time_env

ASYNC_SUBPROCESSES = (2, 4, 8)
TARGET_RATIO = 1.5


def time_gymnasium_async(num_envs: int, seconds: float, repeats: int = 2) -> float:
    """Env-steps/s of Gymnasium's AsyncVectorEnv over ``num_envs`` Ant-v5 sub-processes."""
    import gymnasium as gym

    env = gym.make_vec("Ant-v5", num_envs=num_envs, vectorization_mode="async")
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        bank = [rng.uniform(-1, 1, (num_envs, 8)).astype(np.float32) for _ in range(8)]
        for i in range(20):
            env.step(bank[i % 8])
        best = 0.0
        for _ in range(repeats):
            t0, steps = time.perf_counter(), 0
            while time.perf_counter() - t0 < seconds:
                env.step(bank[steps % 8])
                steps += 1
            best = max(best, num_envs * steps / (time.perf_counter() - t0))
        return best
    finally:
        env.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--num-envs", type=int, default=1024, help="myriad envs (1024)")
    ap.add_argument("--seconds", type=float, default=2.0, help="timed seconds per case")
    ap.add_argument("--out", default="benchmarks/results/mujoco_vs_gymnasium.json")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the physics runs in the worker processes

    load_before = os.getloadavg()
    rounds: list[dict[str, float]] = []
    for r in range(args.rounds):
        row: dict[str, float] = {}
        for model in ("gymnasium", "fast"):
            res = time_env(
                "mujoco-ant",
                args.num_envs,
                "cpu",
                {"backend": "mujoco", "model": model},
                seconds=args.seconds,
                repeats=2,
            )
            row[f"myriad_{model}"] = res["steps_per_s"]
        for n in ASYNC_SUBPROCESSES:
            row[f"gymnasium_async_{n}"] = time_gymnasium_async(n, args.seconds)
        rounds.append(row)
        print(f"round {r}: " + ", ".join(f"{k} {v:,.0f}" for k, v in row.items()), flush=True)

    median = {k: statistics.median(row[k] for row in rounds) for k in rounds[0]}
    best_async = max(median[f"gymnasium_async_{n}"] for n in ASYNC_SUBPROCESSES)
    ratios = {model: median[f"myriad_{model}"] / best_async for model in ("gymnasium", "fast")}
    payload = {
        "machine": machine_info("cpu"),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "num_envs": args.num_envs,
        "rounds": rounds,
        "median_steps_per_s": median,
        "gymnasium_async_best_median": best_async,
        "ratio_to_gymnasium_async": ratios,
        "target_ratio": TARGET_RATIO,
        "target_met_gymnasium_model": ratios["gymnasium"] >= TARGET_RATIO,
    }
    write_json(args.out, payload)
    print_table(
        f"Ant-v5 model, env-steps/s (median of {args.rounds} interleaved rounds)",
        ["case", "steps/s", "x Gymnasium async"],
        [[k, v, f"{v / best_async:.2f}"] for k, v in median.items()],
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
