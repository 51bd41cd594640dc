"""CPO's KL set point on the maze: does each follower's KL to the leader stay near its target?

Every run finetunes the default pretraining run (``myriad pretrain``, K-Myriad on nav-maze) with
the default finetuning config (``myriad finetune --algo cpo --init RUN``), one case per set of
coefficients:

- ``fixed``: the fixed coefficients (``algo.kl_target=null``: preset ``light``, c_adv 0.002);
- ``target_0.1``, ``target_0.3``, ``target_0.5``: ``algo.kl_target=0.1`` / ``0.3`` / ``0.5`` for
  every follower;
- ``spread``: ``algo.kl_targets=[0.1,0.3,1.0]``.

Per run and follower: the fraction of post-warm-up iterations (after the critic warm-up and
``--settle`` further iterations) whose KL lies within [0.5, 2] x the target, on the controller's
measurement (``cpo/kl/follower_i``, every state of the follower's rollout) and on the
diagnostics' (``kl_to_leader/on_own_states/member_i``, a fixed sample of 256 of them); the
final KLs; the leader's final deterministic success (``eval.final_episodes`` episodes).

    python benchmarks/cpo_setpoint.py --init /tmp/pretrain-run --seeds 3 --jobs 2

Without ``--init`` the default pretraining run is made first (about a minute). Writes ``--out``
(JSON) and a figure next to it (same name, ``.png``).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myriad.bench.common import machine_info, write_json
from myriad.finetune.api import resolve_config
from myriad.finetune.kl_setpoint import fraction_in_band
from myriad.finetune.runner import FinetuneRunner
from myriad.utils.checkpoint import library_versions

CASES: dict[str, list[str]] = {
    "fixed": ["algo.kl_target=null", "algo.kl_targets=null"],
    "target_0.1": ["algo.kl_target=0.1", "algo.kl_targets=null"],
    "target_0.3": ["algo.kl_target=0.3", "algo.kl_targets=null"],
    "target_0.5": ["algo.kl_target=0.5", "algo.kl_targets=null"],
    "spread": ["algo.kl_target=null", "algo.kl_targets=[0.1,0.3,1.0]"],
}


def _series(history: dict[str, list[tuple[int, float]]], key: str) -> list[float]:
    return [v for _, v in history.get(key, [])]


def run_once(case: str, seed: int, init: str, args: argparse.Namespace, workdir: Path) -> dict:
    """One finetuning run; returns the followers' KL and coefficient curves and the scores."""
    overrides = [
        f"seed={seed}",
        "checkpoint_every=0",
        "progress=false",
        "plots=false",
        "tensorboard=false",
        "torch_threads=1",
        *CASES[case],
        *args.overrides,
    ]
    cfg = resolve_config("cpo", overrides, init=init)
    runner = FinetuneRunner(cfg, workdir / f"{case}-{seed}")
    start = time.perf_counter()
    try:
        runner.initialise(cfg["init"]["source"])
        runner.learn(int(cfg["iterations"]))
        summary = runner.finish()
        history = runner.logger.history
        warmup = runner.critic_warmup
        followers = runner.algorithm.follower_index.tolist()
        setpoint = runner.algorithm.setpoint
        targets = setpoint.targets.tolist() if setpoint is not None else None
    finally:
        runner.close()
    wall = time.perf_counter() - start

    def per_follower(name: str) -> list[list[float]]:
        return [_series(history, name.format(i=i)) for i in followers]

    record: dict[str, Any] = {
        "case": case,
        "seed": seed,
        "followers": followers,
        "targets": targets,
        "critic_warmup": warmup,
        "setpoint_config": dict(cfg["algo"]["setpoint"]),
        "kl": per_follower("cpo/kl/follower_{i}"),
        "kl_diagnostics": per_follower("kl_to_leader/on_own_states/member_{i}"),
        "kl_coef": per_follower("cpo/kl_coef/follower_{i}"),
        "adversarial_coef": per_follower("cpo/adversarial_coef/follower_{i}"),
        "leader_eval": history.get("eval/leader_success", []),
        "final_leader_success": summary["final_eval"]["eval/leader_success"],
        "first_success_iteration": next(
            (s for s, v in history.get("eval/leader_success", []) if v >= 0.5), None
        ),
        "final_kl": [k[-1] for k in per_follower("cpo/kl/follower_{i}")],
        "wall_s": wall,
    }
    if targets is not None:
        first = warmup + args.settle
        for key in ("kl", "kl_diagnostics"):
            kl = torch.tensor(record[key]).t()[first:]  # [I, F]
            record[f"in_band_{key}"] = fraction_in_band(kl, torch.tensor(targets)).tolist()
    return record


def _run_job(job: tuple[str, int], args: argparse.Namespace, workdir: Path) -> dict:
    torch.set_num_threads(1)
    return run_once(*job, args.init, args, workdir)


def run_all(jobs: list[tuple[str, int]], args: argparse.Namespace, workdir: Path) -> list[dict]:
    """Every job's record in job order; ``--jobs`` > 1 runs them in spawned processes (runs are
    seeded, so a record does not depend on the process that ran it)."""
    if args.jobs <= 1:
        return [_run_job(job, args, workdir) for job in jobs]
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(args.jobs, mp_context=mp.get_context("spawn")) as pool:
        return list(pool.map(_run_job, jobs, [args] * len(jobs), [workdir] * len(jobs)))


def aggregate(runs: list[dict[str, Any]], need: float) -> dict[str, Any]:
    """Per case: the band fractions of every (seed, follower), how many reach ``need``, the
    leader's final successes and the mean final KL per follower."""
    out: dict[str, Any] = {}
    for case in dict.fromkeys(r["case"] for r in runs):
        rows = [r for r in runs if r["case"] == case]
        entry: dict[str, Any] = {
            "seeds": [r["seed"] for r in rows],
            "final_leader_success": [r["final_leader_success"] for r in rows],
            "first_success_iteration": [r["first_success_iteration"] for r in rows],
            "final_kl_mean_per_follower": np.mean([r["final_kl"] for r in rows], axis=0).tolist(),
            "final_kl_min": float(np.min([r["final_kl"] for r in rows])),
            "final_kl_max": float(np.max([r["final_kl"] for r in rows])),
        }
        if rows[0]["targets"] is not None:
            for key in ("kl", "kl_diagnostics"):
                fractions = np.array([r[f"in_band_{key}"] for r in rows])  # [seeds, F]
                entry[f"in_band_{key}"] = {
                    "min": float(fractions.min()),
                    "mean": float(fractions.mean()),
                    "followers_at_or_above": int((fractions >= need).sum()),
                    "followers": int(fractions.size),
                }
        out[case] = entry
    return out


def figure(path: Path, runs: list[dict[str, Any]]) -> None:
    """One row per case: the followers' KL against their bands, lambda, c_adv and the leader's
    evaluated success, over iterations (one line per seed and follower)."""
    from myriad.utils.plotting import pyplot, save_figure

    plt = pyplot()
    cases = list(dict.fromkeys(r["case"] for r in runs))
    fig, axes = plt.subplots(len(cases), 4, figsize=(15, 2.8 * len(cases)), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for row, case in zip(axes, cases):
        rows = [r for r in runs if r["case"] == case]
        warmup = rows[0]["critic_warmup"]
        for r in rows:
            for j, _ in enumerate(r["followers"]):
                c = colors[j % len(colors)]
                label = f"follower {r['followers'][j]}" if r is rows[0] else None
                x = np.arange(1, len(r["kl"][j]) + 1)
                row[0].plot(x, r["kl"][j], color=c, linewidth=0.8, alpha=0.8, label=label)
                row[1].plot(x, r["kl_coef"][j], color=c, linewidth=0.8, alpha=0.8)
                if r["adversarial_coef"][j]:
                    row[2].plot(x, r["adversarial_coef"][j], color=c, linewidth=0.8, alpha=0.8)
            row[3].plot(
                [s for s, _ in r["leader_eval"]],
                [v for _, v in r["leader_eval"]],
                marker="o",
                markersize=2,
                linewidth=0.8,
                label=f"seed {r['seed']}",
            )
        targets = rows[0]["targets"]
        if targets is not None:
            for t in dict.fromkeys(targets):
                color = colors[targets.index(t) % len(colors)] if len(set(targets)) > 1 else "k"
                row[0].axhspan(0.5 * t, 2.0 * t, color=color, alpha=0.12)
                row[0].axhline(t, color=color, linestyle="--", linewidth=0.8)
        for ax in row:
            ax.axvspan(0, warmup, color="0.85", alpha=0.5, linewidth=0)
            ax.tick_params(labelsize=7)
            ax.set_xlabel("iteration", fontsize=8)
        row[0].set_yscale("log")
        row[1].set_yscale("log")
        row[2].set_yscale("log")
        row[3].set_ylim(-0.03, 1.03)
        row[0].set_ylabel(case, fontsize=9)
        row[0].set_title("KL(follower || leader), own states; band [0.5, 2] x target", fontsize=8)
        row[1].set_title("KL penalty lambda", fontsize=8)
        row[2].set_title("adversarial coefficient c_adv", fontsize=8)
        row[3].set_title("leader success (deterministic eval)", fontsize=8)
        row[0].legend(fontsize=6)
        row[3].legend(fontsize=6)
    save_figure(fig, path, dpi=90)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--init", help="the default pretraining run (made when not given)")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument(
        "--settle", type=int, default=10, help="iterations after the critic warm-up not scored"
    )
    parser.add_argument("--need", type=float, default=0.8, help="band fraction a follower needs")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel processes")
    parser.add_argument("--out", default="benchmarks/results/cpo_setpoint.json")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    out_path = Path(args.out)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="cpo-setpoint-") as tmp:
        workdir = Path(tmp)
        pretraining = None
        if args.init is None:
            from myriad.pretrain.api import pretrain

            began = time.perf_counter()
            pretrain(
                ["progress=false", "torch_threads=1"], run_dir=workdir / "pretrain", quiet=True
            )
            pretraining = {"config": "configs/pretrain.yaml", "wall_s": time.perf_counter() - began}
            args.init = str(workdir / "pretrain")
        jobs = [
            (case, seed)
            for seed in range(args.first_seed, args.first_seed + args.seeds)
            for case in args.cases
        ]
        runs = run_all(jobs, args, workdir)
    for r in runs:
        bands = r.get("in_band_kl")
        shown = " ".join(f"{b:.2f}" for b in bands) if bands else "-"
        print(
            f"{r['case']:<11} seed {r['seed']}: in band {shown}  final KL "
            + " ".join(f"{k:.3f}" for k in r["final_kl"])
            + f"  leader {r['final_leader_success']:.2f}  ({r['wall_s']:.0f} s)",
            flush=True,
        )
    result = {
        "benchmark": "cpo_setpoint",
        "machine": {**machine_info("cpu"), "versions": library_versions()},
        "settings": {
            "init": args.init,
            "pretraining": pretraining,
            "cases": {c: CASES[c] for c in args.cases},
            "seeds": list(range(args.first_seed, args.first_seed + args.seeds)),
            "settle": args.settle,
            "band": [0.5, 2.0],
            "need": args.need,
            "overrides": args.overrides,
            "jobs": args.jobs,
        },
        "aggregate": aggregate(runs, args.need),
        "runs": runs,
        "wall_s": time.perf_counter() - start,
    }
    write_json(out_path, result)
    figure(out_path.with_suffix(".png"), runs)
    print(json.dumps(result["aggregate"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
