"""Finetuning over two torchrun ranks against one process: agreement of the learning curves.

For each algorithm and seed, the agreement config of tests/test_torchdist_finetune.py (the open
room with the dense task, 64 envs, 10 iterations) in one process and over two ranks
(``torchrun --nproc_per_node=2 -m myriad finetune``), interleaved so the machine's load falls on
both alike. Per run: the mean training episode return over the last three iterations (all
members, and the leader's) and the final evaluation's deterministic leader return. The two
launches draw different random numbers (each rank resets and samples with its own stream), so
the seed-to-seed spread of the one-process runs is the yardstick for the same-seed differences.

Tolerance: the two-rank mean over the seeds agrees with the one-process mean when their
difference is at most the one-process seed-to-seed standard deviation (about 1.7 standard errors
of a difference of two means over 6 seeds); ``agrees`` records it per algorithm and quantity.

Usage::

    python benchmarks/torchdist_finetune_agreement.py [--seeds 0 1 2 3 4 5] \
        [--algos ppo cpo sapg pbt]

Writes ``benchmarks/results/torchdist_finetune_agreement.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from myriad.bench.common import machine_info, print_table, run_myriad_over_ranks, write_json

RESULTS = Path(__file__).resolve().parent / "results"
# The config and its per-algorithm settings are the test's, read from the test file itself: its
# tolerance is measured on exactly these runs.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_torchdist_finetune import AGREEMENT, AGREEMENT_ALGOS  # noqa: E402

QUANTITIES = ("return_last3", "leader_return_last3", "eval_leader_return")


def run(run_dir: Path, algo: str, overrides: list[str], ranks: int) -> dict[str, Any]:
    """One finetuning, in one process (``ranks == 1``) or over ``ranks`` torchrun ranks;
    returns its summary and per-iteration history."""
    return run_myriad_over_ranks(
        ["finetune", "--algo", algo, "--run-dir", str(run_dir), *overrides], run_dir, ranks
    )


def last3(history: dict[str, list[list[float]]], key: str) -> float:
    return float(np.mean([v for _, v in history[key][-3:]]))


def agreement(algos: list[str], seeds: list[int], root: Path) -> dict[str, Any]:
    rows = []
    for algo in algos:
        for seed in seeds:
            for ranks in (1, 2):
                overrides = [*AGREEMENT, *AGREEMENT_ALGOS[algo], f"seed={seed}"]
                out = run(root / f"{algo}-{seed}-{ranks}", algo, overrides, ranks)
                h, s = out["history"], out["summary"]
                rows.append(
                    {
                        "algo": algo,
                        "seed": seed,
                        "ranks": ranks,
                        "return_last3": last3(h, "episode/return"),
                        "leader_return_last3": last3(
                            h, "episode/return/member_0" if algo != "ppo" else "episode/return"
                        ),
                        "eval_leader_return": s["final_eval"]["eval/leader_return"],
                        "load_average": os.getloadavg(),
                    }
                )
                print(rows[-1], flush=True)
    stats: dict[str, Any] = {}
    for algo in algos:
        stats[algo] = {}
        for key in QUANTITIES:
            one = np.array([r[key] for r in rows if r["algo"] == algo and r["ranks"] == 1])
            two = np.array([r[key] for r in rows if r["algo"] == algo and r["ranks"] == 2])
            stats[algo][key] = {
                "one_process_mean": float(one.mean()),
                "one_process_std": float(one.std(ddof=1)) if len(one) > 1 else None,
                "two_ranks_mean": float(two.mean()),
                "two_ranks_std": float(two.std(ddof=1)) if len(two) > 1 else None,
                "same_seed_abs_difference_max": float(np.abs(one - two).max()),
                "same_seed_abs_difference_mean": float(np.abs(one - two).mean()),
            }
            cell = stats[algo][key]
            cell["tolerance"] = cell["one_process_std"]
            cell["agrees"] = (
                cell["tolerance"] is not None
                and abs(cell["two_ranks_mean"] - cell["one_process_mean"]) <= cell["tolerance"]
            )
    return {
        "config": list(AGREEMENT),
        "per_algo": AGREEMENT_ALGOS,
        "seeds": seeds,
        "runs": rows,
        "stats": stats,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(6)))
    parser.add_argument("--algos", nargs="+", default=list(AGREEMENT_ALGOS))
    parser.add_argument("--out", default=str(RESULTS / "torchdist_finetune_agreement.json"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        agree = agreement(args.algos, args.seeds, Path(tmp))
    payload = {
        "machine": machine_info(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "agreement": agree,
    }
    path = write_json(args.out, payload)
    print_table(
        "finetuning: two ranks against one process (mean over seeds)",
        [
            "algo",
            "quantity",
            "1 process",
            "sd over seeds",
            "2 ranks",
            "max |same-seed diff|",
            "agrees",
        ],
        [
            [
                algo,
                key,
                f"{v['one_process_mean']:.3f}",
                f"{v['one_process_std']:.3f}" if v["one_process_std"] is not None else "-",
                f"{v['two_ranks_mean']:.3f}",
                f"{v['same_seed_abs_difference_max']:.3f}",
                str(v["agrees"]),
            ]
            for algo, per in agree["stats"].items()
            for key, v in per.items()
        ],
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
