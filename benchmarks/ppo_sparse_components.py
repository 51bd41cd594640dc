"""Which part of PPO decides whether it reaches a sparse goal: the update's normalisations or
exploration?

On ``nav-empty`` with the sparse reward (+1 on reaching the goal, about five cells from the
start), PPO at a small budget (128 envs, 40 iterations, 64-64 networks) reaches the goal in some
seeds and never in others. This benchmark runs the same seeds with one component of the update
changed at a time:

- ``default``: ``myriad finetune --algo ppo`` as configured;
- ``no_value_norm``: ``population.normalize_value=false`` (the critic on raw returns; with
  normalisation, before any success the bootstrapped values keep the running return std near
  0.06-0.12, so a first success is a target some 10-15 stds away);
- ``no_value_clip``: ``ppo.value_clip=null``;
- ``no_advantage_norm``: ``ppo.advantage_normalization=none`` (with no reward yet, the
  normalisation scales the critic's noise to unit advantages, which move the policy);
- ``std_1``: ``population.init_log_std=0.0`` (the initial std of the SAPG and CPO papers, 1
  instead of myriad's 0.61): exploration itself;
- ``max_lr_1e-2``: ``ppo.max_lr=1.0e-2``, the cap of rsl_rl's adaptive learning rate (myriad's
  is 1e-3), and ``as_rsl_rl``: that and no value normalisation, rsl_rl's remaining differences
  in the update but for where advantages are normalised (per minibatch here, per rollout there)
  and how truncated episodes are bootstrapped;
- ``rsl_rl`` and ``rsl_rl_std_1``: rsl_rl's PPO (``OnPolicyRunner``, the ``bench`` extra) on the
  same env through the adapter of ``benchmarks/rsl_rl_compare.py``, with myriad's settings (no
  value normalisation there; its adaptive learning rate capped at 1e-2 where myriad's is at
  1e-3), at std 0.61 and 1: a peer library's PPO on the same task, so that a fraction of seeds
  that never reach the goal can be told from a defect of myriad's.

Per case and seed: the training episodes' success rate at every iteration and its mean over the
last five (the measure both libraries share; a seed "reaches" the goal at >= 0.8), and for
myriad the leader's final deterministic success over 64 episodes and its final log std. If a
case changes which seeds reach the goal, that component matters; if only ``std_1`` does,
reaching it is a matter of exploration. Per pair of cases, Fisher's exact test of their
fractions of seeds that reach it, and between two of myriad's cases, which start each seed from
the same network and env draws, McNemar's exact test paired by seed (the seeds where exactly
one of the two reaches the goal).

    python benchmarks/ppo_sparse_components.py --seeds 0-31 \
        --out benchmarks/results/ppo_sparse_components.json
    python benchmarks/ppo_sparse_components.py --seeds 0-95 --cases default,as_rsl_rl,rsl_rl \
        --out benchmarks/results/ppo_sparse_components_96.json
    python benchmarks/ppo_sparse_components.py --seeds 0-95 \
        --cases default,no_value_norm,max_lr_1e-2 \
        --out benchmarks/results/ppo_sparse_components_96_single.json
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from scipy.stats import binomtest, fisher_exact

from myriad.bench.common import machine_info, write_json
from myriad.finetune.api import resolve_config
from myriad.finetune.runner import FinetuneRunner

#: The small budget, also that of ``tests/test_finetune_learning.py``'s sparse-goal test.
BUDGET = [
    "env=empty",
    "num_envs=128",
    "population.actor_hidden=[64,64]",
    "population.critic_hidden=[64,64]",
    "eval.every=0",
    "checkpoint_every=0",
    "progress=false",
    "plots=false",
    "tensorboard=false",
    "torch_threads=1",
]
NUM_ENVS, NUM_STEPS, MAX_EPISODE_STEPS = 128, 32, 100
CASES: dict[str, list[str]] = {
    "default": [],
    "no_value_norm": ["population.normalize_value=false"],
    "no_value_clip": ["ppo.value_clip=null"],
    "no_advantage_norm": ["ppo.advantage_normalization=none"],
    "std_1": ["population.init_log_std=0.0"],
    "max_lr_1e-2": ["ppo.max_lr=1.0e-2"],
    "as_rsl_rl": ["ppo.max_lr=1.0e-2", "population.normalize_value=false"],
}
#: rsl_rl's runs: the initial log std of each.
RSL_RL_CASES: dict[str, float] = {"rsl_rl": -0.5, "rsl_rl_std_1": 0.0}
#: A seed "reaches" the goal when its last iterations' training episodes succeed this often.
REACHED = 0.8
LAST = 5


def record(case: str, seed: int, success: list[float]) -> dict[str, Any]:
    found = [i for i, v in enumerate(success) if v > 0]
    return {
        "case": case,
        "seed": seed,
        "train_success": success,
        "final_train_success": sum(success[-LAST:]) / len(success[-LAST:]),
        "first_success_iteration": found[0] if found else None,
    }


def run_myriad(case: str, seed: int, iterations: int, workdir: Path) -> dict[str, Any]:
    """One run of ``myriad finetune --algo ppo`` with ``case``'s settings."""
    config = resolve_config("ppo", [*BUDGET, *CASES[case], f"seed={seed}"])
    assert (config["num_envs"], config["num_steps"]) == (NUM_ENVS, NUM_STEPS)
    runner = FinetuneRunner(config, workdir / f"{case}-{seed}")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            runner.learn(iterations)
        history = runner.logger.history
        out = record(case, seed, [v for _, v in history["episode/success"]])
        out["final_log_std"] = history["policy/log_std_mean"][-1][1]
        out["final_leader_success"] = runner.evaluate_leader(64)["eval/leader_success"]
    finally:
        runner.close()
    return out


def run_rsl_rl(case: str, seed: int, iterations: int) -> dict[str, Any]:
    """One run of rsl_rl's ``OnPolicyRunner`` on the same env with myriad's PPO settings."""
    from rsl_rl.runners import OnPolicyRunner
    from rsl_rl_compare import RslRlNavEnv, desync, rsl_rl_config

    from myriad.envs import make
    from myriad.utils.seeding import seed_everything

    seed_everything(seed)
    env = make("nav-empty", NUM_ENVS, "cpu", task="sparse", max_episode_steps=MAX_EPISODE_STEPS)
    obs = env.reset(seed=seed)
    desync(env)
    adapter = RslRlNavEnv(env, obs)
    config = rsl_rl_config()
    config["num_steps_per_env"] = NUM_STEPS
    config["actor"]["distribution_cfg"]["init_std"] = math.exp(RSL_RL_CASES[case])
    with contextlib.redirect_stdout(io.StringIO()):
        runner = OnPolicyRunner(adapter, config, log_dir=None, device="cpu")
    success = []
    for _ in range(iterations):
        with contextlib.redirect_stdout(io.StringIO()):
            runner.learn(1)
        # Sparse reward, +1 once at the goal: an episode's return is its success.
        success.append(adapter.summary()[1])
    success = [0.0 if math.isnan(v) else v for v in success]
    return record(case, seed, success)


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per case: the seeds that reached the goal and those whose training episodes found it;
    per pair of cases, Fisher's exact test of their fractions that reached it."""
    per_case: dict[str, Any] = {}
    for case in [*CASES, *RSL_RL_CASES]:
        mine = [r for r in runs if r["case"] == case]
        if not mine:
            continue
        reached = [r["seed"] for r in mine if r["final_train_success"] >= REACHED]
        per_case[case] = {
            "seeds": len(mine),
            "reached": reached,
            "fraction_reached": len(reached) / len(mine),
            "found_in_training": [
                r["seed"] for r in mine if r["first_success_iteration"] is not None
            ],
        }
        if "final_leader_success" in mine[0]:
            per_case[case]["leader_reached"] = [
                r["seed"] for r in mine if r["final_leader_success"] >= REACHED
            ]
            per_case[case]["mean_final_log_std"] = sum(r["final_log_std"] for r in mine) / len(mine)
    fisher, mcnemar = {}, {}
    for a, b in itertools.combinations(per_case, 2):
        table = [
            [len(per_case[c]["reached"]), per_case[c]["seeds"] - len(per_case[c]["reached"])]
            for c in (a, b)
        ]
        fisher[f"{a} vs {b}"] = float(fisher_exact(table).pvalue)
        if a in CASES and b in CASES:
            # myriad's cases share each seed's initial network and env draws: paired by seed,
            # only the seeds where exactly one of the two reached the goal count.
            only_a = len(set(per_case[a]["reached"]) - set(per_case[b]["reached"]))
            only_b = len(set(per_case[b]["reached"]) - set(per_case[a]["reached"]))
            pvalue = binomtest(only_a, only_a + only_b).pvalue if only_a + only_b else 1.0
            mcnemar[f"{a} vs {b}"] = {
                "only_first": only_a,
                "only_second": only_b,
                "p": float(pvalue),
            }
    return {"cases": per_case, "fisher_p": fisher, "mcnemar_exact": mcnemar}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="0-31")
    parser.add_argument("--iterations", type=int, default=40)
    names = [*CASES, *RSL_RL_CASES]
    parser.add_argument(
        "--cases", default=",".join(names), help="comma-separated, of " + ", ".join(names)
    )
    parser.add_argument("--out", default="benchmarks/results/ppo_sparse_components.json")
    parser.add_argument(
        "--resummarise",
        action="store_true",
        help="recompute the summary of --out from its runs (after a change of the statistics)",
    )
    args = parser.parse_args()
    if args.resummarise:
        result = json.loads(Path(args.out).read_text())
        result["summary"] = summarise(result["runs"])
        write_json(Path(args.out), result)
        print(f"wrote {args.out}")
        return
    cases = args.cases.split(",")
    unknown = [c for c in cases if c not in names]
    if unknown:
        parser.error(f"unknown case {unknown[0]!r}; choose from {', '.join(names)}")
    from cpo_regime import seeds  # benchmarks/, on the path when this script runs

    torch.set_num_threads(1)
    runs = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            for seed in seeds(args.seeds):
                if case in CASES:
                    runs.append(run_myriad(case, seed, args.iterations, Path(tmp)))
                else:
                    runs.append(run_rsl_rl(case, seed, args.iterations))
                r = runs[-1]
                print(
                    f"{case:18s} seed {seed:2d}: training success {r['final_train_success']:.3f}"
                    f" (last {LAST}), first at iteration {r['first_success_iteration']}",
                    flush=True,
                )
    result = {
        "benchmark": "ppo_sparse_components",
        "task": "nav-empty, sparse reward",
        "budget": BUDGET,
        "iterations": args.iterations,
        "reached_threshold": REACHED,
        "last_iterations": LAST,
        "cases": {**CASES, **{c: f"init log std {v}" for c, v in RSL_RL_CASES.items()}},
        "summary": summarise(runs),
        "runs": runs,
        "seconds": time.perf_counter() - start,
        "machine": machine_info(),
    }
    write_json(Path(args.out), result)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
