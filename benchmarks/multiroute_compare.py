"""Distinct solutions, leader success, sample efficiency and robustness on ``nav-three-routes``.

Variants: CPO with the KL set point (``algo.kl_target=0.3``), CPO with its fixed coefficients
(``algo.kl_target=null``), SAPG, PBT and PPO, each started from a K-Myriad population
(``--init``: one default pretraining run per seed on the same layout,
``myriad.pretrain.pretrain``) and from scratch. Every run finetunes on the sparse goal with
``eval.perturb=block_leader_route``, so its ``summary.json`` holds, per evaluation, the leader's
success, the best member's success and the number of distinct solutions (docs/finetune.md,
"Distinct solutions and robustness"), and at the end the same after the leader's route is
walled off. Per run:

- ``distinct_solutions``: routes holding >= 5% of the successful final evaluation episodes;
- ``leader_success`` / ``population_success``: the leader's / best member's final success;
- ``steps_to_threshold``: env steps until the evaluated leader success first reaches
  ``--threshold`` (the run's budget when it never does; ``reached`` says which);
- ``robust_population`` / ``robust_leader``: the best member's / leader's success with the
  leader's route walled off (0 when no member ever reached the goal: nothing to wall off).

Aggregates across seeds: IQM and mean with 95% stratified bootstrap intervals (``rliable``).

The sweep is resumable: a run whose ``summary.json`` holds a final evaluation is read, not run
again; an interrupted run with a checkpoint is resumed; the JSON is rewritten after every run.

    python benchmarks/multiroute_compare.py                 # the full sweep (or continue it)
    python benchmarks/multiroute_compare.py --reaggregate   # aggregates + figure from the runs

writes ``--out`` (JSON) and a figure next to it (same name, ``.png``).
"""

from __future__ import annotations

import argparse
import json
import platform
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from seed_statistics import iqm_and_mean, iqm_bars

from myriad.bench.common import code_commit, write_json
from myriad.utils.checkpoint import library_versions

#: name -> (algorithm, extra overrides)
VARIANTS: dict[str, tuple[str, list[str]]] = {
    "cpo-setpoint": ("cpo", ["algo.kl_target=0.3"]),
    "cpo-fixed": ("cpo", ["algo.kl_target=null"]),
    "sapg": ("sapg", []),
    "pbt": ("pbt", []),
    "ppo": ("ppo", []),
    # Not in the default sweep: larger or spread KL targets, tried when 0.3 kept one route.
    "cpo-setpoint-3": ("cpo", ["algo.kl_target=3.0"]),
    "cpo-spread": ("cpo", ["algo.kl_targets=[0.3,1.0,3.0]"]),
    "cpo-setpoint-1": ("cpo", ["algo.kl_target=1.0"]),
    # Without the advantage-weighted pull toward the leader's actions on the leader's states.
    "cpo-setpoint-noawac": ("cpo", ["algo.kl_target=0.3", "algo.awac=false"]),
    "cpo-setpoint-1-noawac": ("cpo", ["algo.kl_target=1.0", "algo.awac=false"]),
    # The set point without the adversarial reward (its maze recommendation).
    "cpo-setpoint-noadv": ("cpo", ["algo.kl_target=0.3", "algo.adversarial=false"]),
}
DEFAULT_VARIANTS = ("cpo-setpoint", "cpo-fixed", "sapg", "pbt", "ppo")
METRICS = (
    "distinct_solutions",
    "leader_success",
    "population_success",
    "steps_to_threshold",
    "robust_population",
    "robust_leader",
)
COLORS = {
    "cpo-setpoint": "tab:red",
    "cpo-fixed": "tab:orange",
    "sapg": "tab:blue",
    "pbt": "tab:green",
    "ppo": "tab:gray",
    "cpo-setpoint-3": "tab:purple",
    "cpo-spread": "tab:brown",
    "cpo-setpoint-noadv": "tab:pink",
    "cpo-setpoint-1": "tab:olive",
    "cpo-setpoint-noawac": "tab:cyan",
    "cpo-setpoint-1-noawac": "darkgoldenrod",
}


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def pretrained(seed: int, workdir: Path) -> Path:
    """The default K-Myriad pretraining on the three-routes layout for ``seed`` (run or
    resumed if missing or unfinished)."""
    from myriad.pretrain import pretrain
    from myriad.pretrain.api import resolve_config

    folder = workdir / f"pretrain-seed{seed}"
    overrides = ["env=three_routes", f"seed={seed}", "progress=false"]
    planned = int(resolve_config(overrides)["iterations"])
    summary = _read(folder / "summary.json")
    if summary and int(summary.get("iterations", 0)) >= planned and summary.get("checkpoint"):
        return folder
    if any((folder / "checkpoints").glob("*.pt")):
        pretrain(resume=folder, quiet=True)
    else:
        shutil.rmtree(folder, ignore_errors=True)
        pretrain(overrides, run_dir=folder, quiet=True)
    return folder


def run_overrides(variant: str, seed: int, args: argparse.Namespace) -> list[str]:
    return [
        "env=three_routes",
        f"seed={seed}",
        f"num_envs={args.num_envs}",
        f"iterations={args.iterations}",
        f"eval.every={args.eval_every}",
        f"eval.episodes={args.eval_episodes}",
        f"eval.final_episodes={args.final_episodes}",
        "eval.perturb=block_leader_route",
        "checkpoint_every=10",
        "keep_checkpoints=1",
        "progress=false",
        "tensorboard=false",
        f"plots={str(args.plots).lower()}",
        *VARIANTS[variant][1],
    ]


def finetuned(variant: str, seed: int, init: Path | None, args: argparse.Namespace) -> Path:
    """The finetuning run of ``variant`` (finished, resumed or started)."""
    from myriad.finetune import finetune

    folder = Path(args.workdir) / f"{variant}-{'init' if init else 'scratch'}-seed{seed}"
    summary = _read(folder / "summary.json")
    if summary and summary.get("final_eval"):
        return folder
    if any((folder / "checkpoints").glob("*.pt")):
        finetune(resume=folder, quiet=True)
    else:
        shutil.rmtree(folder, ignore_errors=True)
        algo = VARIANTS[variant][0]
        finetune(algo, run_overrides(variant, seed, args), init=init, run_dir=folder, quiet=True)
    return folder


def record(variant: str, seed: int, init: bool, folder: Path, threshold: float) -> dict:
    """The numbers of one finished run, from its ``summary.json``."""
    summary = _read(folder / "summary.json")
    assert summary is not None
    final = summary["final_eval"]
    curve = [
        (e["env_steps"], e["eval/leader_success"], e.get("eval/distinct_solutions"))
        for e in summary["evaluations"]
    ]
    budget = int(summary["env_steps"])
    reached = [steps for steps, success, _ in curve if success >= threshold]
    robustness = summary.get("robustness") or {}
    after = robustness.get("after") or {"population_success": 0.0, "leader_success": 0.0}
    scalars = summary.get("scalars") or {}
    return {
        "variant": variant,
        "algo": summary["algo"],
        "init": init,
        "seed": seed,
        "distinct_solutions": final["eval/distinct_solutions"],
        "leader_success": final["eval/leader_success"],
        "population_success": final["eval/population_success"],
        "steps_to_threshold": reached[0] if reached else budget,
        "reached": bool(reached),
        "robust_population": after["population_success"],
        "robust_leader": after["leader_success"],
        "robustness": robustness,
        "member_route": (summary.get("solutions") or {}).get("member_route"),
        "clusters": (summary.get("solutions") or {}).get("clusters"),
        "kl_to_leader_own_states": scalars.get("kl_to_leader/on_own_states_mean"),
        "curve": curve,
        "env_steps": budget,
        "wall_s": summary.get("wall_time_s"),
        "run": str(folder),
    }


def _name(variant: str, init: bool) -> str:
    return f"{variant}{'+init' if init else ''}"


def aggregate(runs: list[dict[str, Any]], reps: int) -> dict[str, Any]:
    """IQM and mean with 95% stratified bootstrap CIs per variant and metric."""
    groups = sorted(
        {(r["variant"], r["init"]) for r in runs},
        key=lambda v: (list(VARIANTS).index(v[0]), not v[1]),
    )
    out: dict[str, Any] = {}
    for metric in METRICS:
        scores = {
            _name(v, i): np.array(
                [[r[metric]] for r in runs if r["variant"] == v and r["init"] == i], dtype=float
            )
            for v, i in groups
        }
        out[metric] = iqm_and_mean(scores, reps)
    return out


def goal(agg: dict[str, Any]) -> dict[str, Any]:
    """CPO with a set point keeps >= 3 distinct solutions while its leader succeeds as often as
    PPO's (IQM over seeds), with and without K-Myriad init."""
    out = {}
    for init in (True, False):
        cpo, ppo = _name("cpo-setpoint", init), _name("ppo", init)
        if cpo not in agg["distinct_solutions"] or ppo not in agg["leader_success"]:
            continue
        distinct = agg["distinct_solutions"][cpo]["iqm"]
        leader, ppo_leader = agg["leader_success"][cpo]["iqm"], agg["leader_success"][ppo]["iqm"]
        out[f"cpo set point: >= 3 solutions and leader as good as ppo ({cpo})"] = {
            "holds": bool(distinct >= 3 and leader >= ppo_leader),
            "distinct_solutions_iqm": distinct,
            "leader_success_iqm": leader,
            "ppo_leader_success_iqm": ppo_leader,
        }
    return out


def figure(path: Path, runs: list[dict[str, Any]], agg: dict[str, Any]) -> None:
    from myriad.utils.plotting import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(2, 3, figsize=(18, 9))
    panels = (
        ("distinct_solutions", "distinct solutions at the end (IQM, 95% CI)", None),
        ("leader_success", "final leader success (IQM, 95% CI)", (0, 1.05)),
        ("steps_to_threshold", "env steps to leader success >= threshold (IQM)", None),
        ("robust_population", "best member, leader's route walled off (IQM)", (0, 1.05)),
    )
    for ax, (metric, title, limits) in zip(axes.flat, panels, strict=False):
        names, y, iqm, lo, hi = iqm_bars(agg[metric])
        colors = [COLORS[n.split("+")[0]] for n in names]
        alphas = [0.9 if n.endswith("+init") else 0.45 for n in names]
        for k in range(len(names)):
            ax.barh(
                y[k],
                iqm[k],
                xerr=[[iqm[k] - lo[k]], [hi[k] - iqm[k]]],
                color=colors[k],
                alpha=alphas[k],
                capsize=3,
            )
        ax.set_yticks(y, names, fontsize=8)
        if limits:
            ax.set_xlim(*limits)
        ax.set_title(title, fontsize=10)
    ax = axes[1, 1]
    names = list(agg["leader_success"])
    y = np.arange(len(names))
    before = [agg["leader_success"][n]["iqm"] for n in names]
    after = [agg["robust_leader"][n]["iqm"] for n in names]
    ax.barh(y + 0.2, before, height=0.4, color="tab:purple", alpha=0.8, label="before")
    ax.barh(y - 0.2, after, height=0.4, color="tab:brown", alpha=0.8, label="route walled off")
    ax.set_yticks(y, names, fontsize=8)
    ax.set_xlim(0, 1.05)
    ax.set_title("leader success before / after (IQM)", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1, 2]
    for variant in VARIANTS:
        for init in (True, False):
            group = [r for r in runs if r["variant"] == variant and r["init"] == init]
            if not group:
                continue
            length = min(len(r["curve"]) for r in group)
            steps = [s for s, _, _ in group[0]["curve"][:length]]
            mean = np.mean([[d for _, _, d in r["curve"][:length]] for r in group], axis=0)
            style = "-" if init else ":"
            ax.plot(steps, mean, style, color=COLORS[variant], label=_name(variant, init))
    ax.set_xlabel("env steps")
    ax.set_title("distinct solutions during training (mean over seeds)", fontsize=10)
    ax.legend(fontsize=7, ncol=2)
    fig.suptitle("nav-three-routes: solid bars K-Myriad init, faded from scratch", fontsize=11)
    save_figure(fig, path, dpi=100)


def pretraining_records(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Per seed, the pretraining run's wall time, env steps, diversity and coverage."""
    out = []
    for seed in range(args.seeds):
        summary = _read(args.workdir / f"pretrain-seed{seed}" / "summary.json")
        if summary:
            out.append(
                {
                    "seed": seed,
                    "wall_time_s": summary.get("wall_time_s"),
                    "env_steps": summary.get("env_steps"),
                    "diversity_nats": summary.get("eval_entropy_diversity"),
                    "union_coverage": summary.get("eval_coverage_union"),
                }
            )
    return out


def result_payload(
    runs: list[dict[str, Any]],
    args: argparse.Namespace,
    wall: float,
    complete: bool,
    with_aggregate: bool = True,
) -> dict[str, Any]:
    """The JSON written: settings, runs and (``with_aggregate``) the bootstrap aggregates,
    which take about a minute for the full sweep and are left out of the partial files."""
    agg = aggregate(runs, args.reps) if runs and with_aggregate else {}
    return {
        "benchmark": "multiroute_compare",
        "complete": complete,
        "machine": {
            "platform": platform.platform(),
            "cpu_threads": torch.get_num_threads(),
            "device": "cpu",
            "versions": library_versions(),
        },
        "code": code_commit(),
        "settings": {
            "env": "nav-three-routes (env=three_routes), task=sparse",
            "variants": {k: VARIANTS[k] for k in args.variants},
            "seeds": args.seeds,
            "iterations": args.iterations,
            "num_envs": args.num_envs,
            "env_steps_per_run": args.iterations * args.num_envs * 32,
            "eval_every": args.eval_every,
            "eval_episodes_per_member": args.eval_episodes,
            "final_episodes_per_member": args.final_episodes,
            "threshold": args.threshold,
            "pretraining": "default configs/pretrain.yaml with env=three_routes, seed=<seed>",
            "workdir": str(args.workdir),
        },
        "aggregate": agg,
        "goal": goal(agg) if agg else {},
        "pretraining": pretraining_records(args),
        "runs": runs,
        "finetune_wall_s_sum": sum(r["wall_s"] or 0.0 for r in runs),
        "wall_s_this_invocation": wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--variants", nargs="+", default=list(DEFAULT_VARIANTS), choices=list(VARIANTS)
    )
    parser.add_argument(
        "--no-scratch", action="store_true", help="only the runs with K-Myriad init"
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--iterations", type=int, default=60)
    parser.add_argument("--num-envs", type=int, default=256)
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument("--eval-episodes", type=int, default=16, help="per member")
    parser.add_argument("--final-episodes", type=int, default=32, help="per member")
    parser.add_argument("--threshold", type=float, default=0.5)
    parser.add_argument("--plots", action="store_true", help="each run writes its plots/")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    parser.add_argument("--workdir", type=Path, default=Path("runs/multiroute"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/multiroute.json"))
    parser.add_argument(
        "--reaggregate",
        action="store_true",
        help="recompute the aggregates and figure from the finished runs in --workdir",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    start = time.perf_counter()
    runs: list[dict[str, Any]] = []
    plan = [
        (seed, variant, init)
        for seed in range(args.seeds)
        for variant in args.variants
        for init in ((True,) if args.no_scratch else (True, False))
    ]
    for seed, variant, init in plan:
        folder = args.workdir / f"{variant}-{'init' if init else 'scratch'}-seed{seed}"
        if not args.reaggregate:
            source = pretrained(seed, args.workdir) if init else None
            began = time.perf_counter()
            folder = finetuned(variant, seed, source, args)
            print(f"{folder.name}: {time.perf_counter() - began:.0f} s", flush=True)
        summary = _read(folder / "summary.json")
        if not (summary and summary.get("final_eval")):
            continue
        runs.append(record(variant, seed, init, folder, args.threshold))
        if not args.reaggregate:
            wall = time.perf_counter() - start
            payload = result_payload(runs, args, wall, complete=False, with_aggregate=False)
            write_json(args.out, payload)
    complete = len(runs) == len(plan)
    wall = time.perf_counter() - start
    earlier = _read(args.out) if args.reaggregate else None
    if earlier:  # recomputing the aggregates keeps the sweep's own wall time and code
        wall = earlier.get("wall_s_this_invocation", wall)
    payload = result_payload(runs, args, wall, complete)
    if earlier and earlier.get("code"):
        payload["code"] = earlier["code"]
    write_json(args.out, payload)
    if runs:
        figure(args.out.with_suffix(".png"), runs, payload["aggregate"])
    print(json.dumps(payload["goal"], indent=2))
    print(f"{len(runs)} of {len(plan)} runs; wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
