"""Pretraining over two torchrun ranks against one process: agreement and throughput.

Agreement: for each seed, the tiny pretraining of the test suite (tests/test_torch_distributed.py)
in one process and over two ranks (``torchrun --nproc_per_node=2 -m myriad pretrain``); per run,
the mean over its iterations of the collective entropy and of the rollout's union coverage, and
the final evaluation's. The seed-to-seed spread of the one-process runs is the yardstick for the
two-rank differences, since the two launches draw different random numbers.

Throughput: a larger pretraining (``--envs`` envs, 8 members) in one process with one and with
two torch threads, and over two ranks of one thread each: env-steps per second of training
(``summary.json``'s ``steps_per_second``: the iterations only, not start-up or evaluation).

Usage::

    python benchmarks/torchdist_agreement.py [--seeds 0 1 2 3 4 5 6 7] [--envs 2048]

Writes ``benchmarks/results/torchdist_agreement.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from myriad.bench.common import machine_info, print_table, run_myriad_over_ranks, write_json

RESULTS = Path(__file__).resolve().parent / "results"
# The agreement runs are the test suite's tiny pretraining, read from the suite itself: the
# tolerances of tests/test_torch_distributed.py are measured on exactly this config.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from conftest import TINY_PRETRAIN  # noqa: E402

TINY = [*TINY_PRETRAIN, "plots=false"]


def run(run_dir: Path, overrides: list[str], ranks: int) -> dict[str, Any]:
    """One pretraining, in one process (``ranks == 1``) or over ``ranks`` torchrun ranks;
    returns its summary and per-iteration history."""
    return run_myriad_over_ranks(
        ["pretrain", "--run-dir", str(run_dir), *overrides], run_dir, ranks
    )


def agreement(seeds: list[int], root: Path) -> dict[str, Any]:
    rows = []
    for seed in seeds:
        for ranks in (1, 2):
            out = run(root / f"agree-{seed}-{ranks}", [*TINY, f"seed={seed}"], ranks)
            h, s = out["history"], out["summary"]
            rows.append(
                {
                    "seed": seed,
                    "ranks": ranks,
                    "entropy_mean": float(np.mean([v for _, v in h["entropy/collective"]])),
                    "coverage_mean": float(np.mean([v for _, v in h["coverage/union"]])),
                    "eval_entropy": s["eval_entropy_collective"],
                    "eval_coverage": s["eval_coverage_union"],
                }
            )
            print(rows[-1], flush=True)
    stats: dict[str, Any] = {}
    for key in ("entropy_mean", "coverage_mean", "eval_entropy", "eval_coverage"):
        one = np.array([r[key] for r in rows if r["ranks"] == 1])
        two = np.array([r[key] for r in rows if r["ranks"] == 2])
        stats[key] = {
            "one_process_mean": float(one.mean()),
            "one_process_std": float(one.std(ddof=1)) if len(one) > 1 else None,
            "one_process_range": float(one.max() - one.min()),
            "two_ranks_mean": float(two.mean()),
            "two_ranks_std": float(two.std(ddof=1)) if len(two) > 1 else None,
            "same_seed_abs_difference_max": float(np.abs(one - two).max()),
            "same_seed_abs_difference_mean": float(np.abs(one - two).mean()),
        }
    return {"config": TINY, "seeds": seeds, "runs": rows, "stats": stats}


def throughput(num_envs: int, iterations: int, root: Path) -> list[dict[str, Any]]:
    config = [
        "env=maze",
        f"num_envs={num_envs}",
        "population.size=8",
        "num_steps=32",
        f"iterations={iterations}",
        "checkpoint_every=0",
        "progress=false",
        "plots=false",
        "dataset.enabled=false",
        "eval.episodes=1",
    ]
    rows = []
    for name, ranks, threads in (
        ("1 process, 1 thread", 1, 1),
        ("2 ranks x 1 thread", 2, 1),
        ("1 process, 2 threads", 1, 2),
    ):
        start = time.perf_counter()
        out = run(root / f"speed-{ranks}-{threads}", [*config, f"torch_threads={threads}"], ranks)
        s = out["summary"]
        scalars = s["scalars"]
        rows.append(
            {
                "setup": name,
                "ranks": ranks,
                "torch_threads": threads,
                "steps_per_second": s["steps_per_second"],
                "train_wall_s": s["wall_time_s"],
                "launch_to_exit_s": time.perf_counter() - start,
                "knn_share": scalars.get("perf/knn_share"),
                "collect_share": scalars.get("perf/collect_share"),
                "update_share": scalars.get("perf/update_share"),
                "load_average": os.getloadavg(),
            }
        )
        print(rows[-1], flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(8)))
    parser.add_argument("--envs", type=int, default=2048)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--out", default=str(RESULTS / "torchdist_agreement.json"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        agree = agreement(args.seeds, root)
        speed = throughput(args.envs, args.iterations, root)
    payload = {
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "agreement": agree,
        "throughput": {"num_envs": args.envs, "iterations": args.iterations, "rows": speed},
    }
    path = write_json(args.out, payload)
    print_table(
        "two ranks against one process (tiny config; mean over seeds)",
        ["quantity", "1 process", "sd over seeds", "2 ranks", "max |same-seed difference|"],
        [
            [
                k,
                f"{v['one_process_mean']:.3f}",
                f"{v['one_process_std']:.3f}" if v["one_process_std"] is not None else "-",
                f"{v['two_ranks_mean']:.3f}",
                f"{v['same_seed_abs_difference_max']:.3f}",
            ]
            for k, v in agree["stats"].items()
        ],
    )
    print_table(
        f"throughput, {args.envs} envs, 8 members",
        ["setup", "env-steps/s", "train s", "k-NN share"],
        [
            [
                r["setup"],
                f"{r['steps_per_second']:,.0f}",
                f"{r['train_wall_s']:.1f}",
                f"{r['knn_share']:.2f}",
            ]
            for r in speed
        ],
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
