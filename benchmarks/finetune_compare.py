"""PPO vs SAPG vs CPO vs PBT on a sparse goal, each with and without K-Myriad initialisation.

Every (algorithm, init, seed) run trains for the same number of env steps and evaluates its
leader (deterministic actions, fresh envs) every ``--eval-every`` iterations. The score is the
leader's success rate (``--metric success``, goal tasks) or its mean episode return
(``--metric return``, for example Ant's own reward). Per run:

- ``final_success`` / ``final_return``: the score over ``--final-episodes`` episodes at the end;
- ``auc``: mean of the leader's evaluated score over the run (sample efficiency);
- ``steps_to_half`` (success) / ``steps_to_threshold`` (return): env steps until the evaluated
  score first reaches ``--threshold`` (the budget when it never does);
- ``leader_ess``: mean normalised ESS of the leader's off-policy batch (SAPG, CPO).

Aggregates across seeds are the interquartile mean (IQM) and the mean with 95% stratified
bootstrap confidence intervals from ``rliable``. A second measurement compares the learning
throughput (collection + update, env steps per second) of a population of 16 with a single
policy on the same number of envs.

    python benchmarks/finetune_compare.py --init runs/pretrain/nav-maze-... --seeds 5
    python benchmarks/finetune_compare.py --init runs/pretrain/mujoco-ant-... --metric return \
        --threshold 100 --jobs 2 --out benchmarks/results/finetune_compare_ant.json \
        env=ant task=native

writes ``--out`` (JSON) and a figure next to it (same name, ``.png``).
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from seed_statistics import iqm_and_mean, iqm_bars, iqm_curve

from myriad.bench.common import write_json
from myriad.finetune.api import resolve_config
from myriad.finetune.runner import FinetuneRunner
from myriad.utils.checkpoint import library_versions

ALGOS = ("ppo", "sapg", "cpo", "pbt")
METRICS = ("success", "return")


def metric_keys(metric: str) -> tuple[str, str]:
    """Record keys of a run's final score and of its env steps to the threshold."""
    return f"final_{metric}", "steps_to_half" if metric == "success" else "steps_to_threshold"


def run_once(
    algo: str,
    seed: int,
    init: str | None,
    args: argparse.Namespace,
    workdir: Path,
) -> dict[str, Any]:
    """One training run; returns its curve and summary numbers."""
    overrides = [
        f"seed={seed}",
        f"num_envs={args.num_envs}",
        f"eval.every={args.eval_every}",
        f"eval.episodes={args.eval_episodes}",
        "checkpoint_every=0",
        "progress=false",
        "plots=false",
        "tensorboard=false",
        *args.overrides,
    ]
    cfg = resolve_config(algo, overrides, init=init)
    name = f"{algo}-{'init' if init else 'scratch'}-{seed}"
    runner = FinetuneRunner(cfg, workdir / name)
    start = time.perf_counter()
    try:
        if init:
            runner.initialise(cfg["init"]["source"])
        runner.learn(args.iterations)
        final = runner.evaluate_leader(args.final_episodes)[f"eval/leader_{args.metric}"]
        history = runner.logger.history
        steps_per_iteration = runner.steps_per_iteration
    finally:
        runner.close()
    wall = time.perf_counter() - start
    curve = [
        (step * steps_per_iteration, value) for step, value in history[f"eval/leader_{args.metric}"]
    ]
    budget = args.iterations * steps_per_iteration
    reached = [s for s, v in curve if v >= args.threshold]
    ess = [v for _, v in history.get("train/leader_ess", [])]
    final_key, reach_key = metric_keys(args.metric)
    return {
        "algo": algo,
        "init": bool(init),
        "seed": seed,
        "metric": args.metric,
        "curve": curve,
        final_key: final,
        "auc": float(np.mean([v for _, v in curve])) if curve else 0.0,
        reach_key: reached[0] if reached else budget,
        "leader_ess": float(np.mean(ess)) if ess else None,
        "ess_curve": [(s * steps_per_iteration, v) for s, v in history.get("train/leader_ess", [])],
        "wall_s": wall,
        "env_steps": budget,
    }


def _run_job(job: tuple[str, int, str | None], args: argparse.Namespace, workdir: Path) -> dict:
    torch.set_num_threads(1)
    return run_once(*job, args, workdir)


def _run_all(
    jobs: list[tuple[str, int, str | None]], args: argparse.Namespace, workdir: Path
) -> list[dict[str, Any]]:
    """Every job's record, in job order; ``--jobs`` > 1 runs them in spawned processes (each
    run is seeded, so the records do not depend on the process that ran them)."""
    if args.jobs <= 1:
        return [run_once(*job, args, workdir) for job in jobs]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        return list(pool.map(_run_job, jobs, [args] * len(jobs), [workdir] * len(jobs)))


def aggregate(runs: list[dict[str, Any]], reps: int) -> dict[str, Any]:
    """IQM and mean with 95% stratified bootstrap CIs, per variant and metric."""
    variants = sorted(
        {(r["algo"], r["init"]) for r in runs}, key=lambda v: (ALGOS.index(v[0]), v[1])
    )
    out: dict[str, Any] = {}
    final_key, reach_key = metric_keys(runs[0].get("metric", "success"))
    for metric in (final_key, "auc", reach_key):
        scores = {
            f"{a}{'+init' if i else ''}": np.array(
                [[r[metric]] for r in runs if r["algo"] == a and r["init"] == i], dtype=float
            )
            for a, i in variants
        }
        out[metric] = iqm_and_mean(scores, reps)
    ess = {}
    for a, i in variants:
        values = [r["leader_ess"] for r in runs if r["algo"] == a and r["init"] == i]
        if values and values[0] is not None:
            ess[f"{a}{'+init' if i else ''}"] = {
                "mean": float(np.mean(values)),
                "min": float(np.min(values)),
                "max": float(np.max(values)),
            }
    out["leader_ess"] = ess
    return out


def claims(agg: dict[str, Any]) -> dict[str, Any]:
    """The CPO paper's claims, re-measured on these runs."""
    auc = agg["auc"]
    final_key, reach_key = next(metric_keys(m) for m in METRICS if metric_keys(m)[0] in agg)
    final = agg[final_key]
    half = agg[reach_key]

    def iqm(table: dict[str, Any], key: str) -> float | None:
        return table[key]["iqm"] if key in table else None

    out: dict[str, Any] = {}
    for suffix in ("+init", ""):
        keys = [f"{a}{suffix}" for a in ("cpo", "sapg", "ppo")]
        if all(k in auc for k in keys):
            c, s, p = (iqm(auc, k) for k in keys)
            out[f"cpo>=sapg>=ppo (auc{suffix or ', scratch'})"] = {
                # All three equal (for example none ever succeeds) decides nothing.
                "holds": None if c == s == p else bool(c >= s >= p),
                "auc_iqm": dict(zip(keys, (c, s, p))),
                f"{final_key}_iqm": {k: iqm(final, k) for k in keys},
            }
    for suffix in ("+init", ""):
        c, s = f"cpo{suffix}", f"sapg{suffix}"
        if c in agg["leader_ess"] and s in agg["leader_ess"]:
            ce, se = agg["leader_ess"][c]["mean"], agg["leader_ess"][s]["mean"]
            out[f"cpo keeps leader ESS above sapg{suffix or ' (scratch)'}"] = {
                "holds": bool(ce > se),
                "ratio": ce / se if se > 0 else None,
                "cpo": ce,
                "sapg": se,
            }
    for a in ALGOS:
        if f"{a}+init" in half and a in half:
            with_init, scratch = iqm(half, f"{a}+init"), iqm(half, a)
            budget = max(half[f"{a}+init"]["values"] + half[a]["values"])
            never = with_init >= budget and scratch >= budget
            out[f"K-Myriad init reaches the goal sooner ({a})"] = {
                # Neither variant reaching the threshold within the budget decides nothing.
                "holds": None if never else bool(with_init < scratch),
                f"{reach_key}_iqm": {"init": with_init, "scratch": scratch},
            }
    return out


def throughput(num_envs: int, iterations: int, workdir: Path) -> dict[str, Any]:
    """Env steps per second of collection + update: PPO with one policy vs populations of 16."""
    out = {}
    variants = [("ppo", 1), ("sapg", 16), ("cpo", 16), ("pbt", 16)]
    for algo, members in variants:
        cfg = resolve_config(
            algo,
            [
                f"num_envs={num_envs}",
                f"population.size={members}",
                "eval.every=0",
                "checkpoint_every=0",
                "progress=false",
                "plots=false",
                "tensorboard=false",
                "population.parameterization=shared_trunk",
            ],
        )
        runner = FinetuneRunner(cfg, workdir / f"throughput-{algo}-{members}")
        try:
            runner.learn(1)  # warm-up: first-call allocations
            start, steps = time.perf_counter(), runner.env_steps
            runner.learn(1 + iterations)
            elapsed = time.perf_counter() - start
            out[f"{algo} (M={members})"] = (runner.env_steps - steps) / elapsed
        finally:
            runner.close()
    return {"num_envs": num_envs, "steps_per_second": out}


def figure(path: Path, runs: list[dict[str, Any]], agg: dict[str, Any], reps: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(21, 4.6))
    colors = {"ppo": "tab:gray", "sapg": "tab:blue", "cpo": "tab:red", "pbt": "tab:green"}
    ax = axes[0]
    for algo in ALGOS:
        for init in (True, False):
            group = [r for r in runs if r["algo"] == algo and r["init"] == init]
            if not group:
                continue
            steps = np.array([s for s, _ in group[0]["curve"]])
            values = np.array([[v for _, v in r["curve"]] for r in group])  # [seeds, points]
            iqm, low, high = iqm_curve(values, reps)
            style = "-" if init else ":"
            label = f"{algo}{' + K-Myriad init' if init else ' (scratch)'}"
            ax.plot(steps, iqm, style, color=colors[algo], label=label, linewidth=1.4)
            ax.fill_between(steps, low, high, color=colors[algo], alpha=0.12)
    ax.set_xlabel("env steps")
    metric = runs[0].get("metric", "success")
    final_key, _ = metric_keys(metric)
    ax.set_ylabel(f"leader {metric} (deterministic), IQM")
    if metric == "success":
        ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=7)
    ax.set_title("learning curves (95% CI)", fontsize=10)

    for ax, key, title in (
        (axes[1], "auc", f"sample efficiency: mean evaluated {metric} (IQM, 95% CI)"),
        (axes[2], final_key, f"final leader {metric} (IQM, 95% CI)"),
    ):
        names, y, iqm, lo, hi = iqm_bars(agg[key])
        ax.barh(
            y,
            iqm,
            xerr=[iqm - lo, hi - iqm],
            color=[colors[n.split("+")[0]] for n in names],
            alpha=0.8,
            capsize=3,
        )
        ax.set_yticks(y, names, fontsize=8)
        if metric == "success":
            ax.set_xlim(0, 1.05)
        ax.set_title(title, fontsize=10)
    ax = axes[3]
    for algo in ("sapg", "cpo"):
        for init in (True, False):
            group = [r for r in runs if r["algo"] == algo and r["init"] == init and r["ess_curve"]]
            if not group:
                continue
            steps = np.array([s for s, _ in group[0]["ess_curve"]])
            values = np.array([[v for _, v in r["ess_curve"]] for r in group]).mean(axis=0)
            style = "-" if init else ":"
            label = f"{algo}{' + K-Myriad init' if init else ' (scratch)'}"
            ax.plot(steps, values, style, color=colors[algo], label=label, linewidth=1.2)
    ax.set_xlabel("env steps")
    ax.set_ylim(0, 1.02)
    ax.set_title("leader's off-policy ESS / n (mean over seeds)", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--init", help="pretraining run (K-Myriad) for the +init variants")
    parser.add_argument(
        "--reaggregate",
        metavar="JSON",
        help="recompute the aggregates, claims and figure of an earlier result (no training)",
    )
    parser.add_argument("--algos", nargs="+", default=list(ALGOS), choices=ALGOS)
    parser.add_argument(
        "--init-only", action="store_true", help="only the +init variants (no runs from scratch)"
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--num-envs", type=int, default=512)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-episodes", type=int, default=32)
    parser.add_argument("--final-episodes", type=int, default=64)
    parser.add_argument("--metric", choices=METRICS, default="success")
    parser.add_argument(
        "--threshold",
        type=float,
        default=None,
        help="score counted as reached (default 0.5 for success; required for return); with "
        "--reaggregate, recomputes the steps to it from the stored curves",
    )
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    parser.add_argument("--throughput-envs", type=int, default=1024)
    parser.add_argument(
        "--throughput-iterations", type=int, default=3, help="0 skips the throughput measurement"
    )
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--out", default="benchmarks/results/finetune_compare.json")
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides for every run (task=dense ...)"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.reaggregate:
        path = Path(args.reaggregate)
        result = json.loads(path.read_text())
        if args.threshold is not None:
            _, reach_key = metric_keys(result["runs"][0].get("metric", "success"))
            for run in result["runs"]:
                reached = [s for s, v in run["curve"] if v >= args.threshold]
                run[reach_key] = reached[0] if reached else run["env_steps"]
            result["settings"]["threshold"] = args.threshold
        result["aggregate"] = aggregate(result["runs"], args.reps)
        result["claims"] = claims(result["aggregate"])
        write_json(path, result)
        figure(path.with_suffix(".png"), result["runs"], result["aggregate"], min(args.reps, 500))
        print(json.dumps(result["claims"], indent=2))
        return 0
    if not args.init:
        parser.error("--init is required (a pretraining run for the +init variants)")
    if args.threshold is None:
        if args.metric != "success":
            parser.error("--metric return needs --threshold (the return counted as reached)")
        args.threshold = 0.5

    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    jobs = [
        (algo, seed, init)
        for seed in range(args.seeds)
        for algo in args.algos
        for init in ((args.init,) if args.init_only else (args.init, None))
    ]
    final_key, reach_key = metric_keys(args.metric)
    with tempfile.TemporaryDirectory(prefix="finetune-compare-") as tmp:
        workdir = Path(tmp)
        runs = _run_all(jobs, args, workdir)
        for record in runs:
            print(
                f"{record['algo']:<5} {'init' if record['init'] else 'scratch':<8} "
                f"seed {record['seed']}: final {record[final_key]:.2f}  auc {record['auc']:.2f}  "
                f"steps to {args.threshold:g}: {record[reach_key]:,}  ({record['wall_s']:.0f} s)",
                flush=True,
            )
        speed = (
            throughput(args.throughput_envs, args.throughput_iterations, workdir)
            if args.throughput_iterations > 0
            else None
        )
    agg = aggregate(runs, args.reps)
    result = {
        "benchmark": "finetune_compare",
        "machine": {
            "platform": platform.platform(),
            "cpu_threads": torch.get_num_threads(),
            "device": "cpu",
            "versions": library_versions(),
        },
        "settings": {
            "init": args.init,
            "algos": args.algos,
            "seeds": args.seeds,
            "iterations": args.iterations,
            "num_envs": args.num_envs,
            "env_steps_per_run": runs[0]["env_steps"] if runs else 0,
            "eval_every": args.eval_every,
            "eval_episodes": args.eval_episodes,
            "final_episodes": args.final_episodes,
            "metric": args.metric,
            "threshold": args.threshold,
            "overrides": args.overrides,
            "config": resolve_config("cpo", args.overrides)["env"],
        },
        "aggregate": agg,
        "claims": claims(agg),
        "throughput": speed,
        "runs": runs,
        "total_wall_s": time.perf_counter() - start,
    }
    write_json(out_path, result)
    figure(out_path.with_suffix(".png"), runs, agg, min(args.reps, 500))
    print(json.dumps({"claims": result["claims"], "throughput": speed}, indent=2))
    print(f"wrote {out_path} and {out_path.with_suffix('.png')} ({result['total_wall_s']:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
