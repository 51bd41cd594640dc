"""The commands with the MLPs' products on oneDNN against torch's own (MKL), as users run them.

Each job runs as the ``myriad`` command in its own process, once with the default products
(oneDNN's linear kernel, :mod:`myriad.nn.products`) and once with ``MYRIAD_CPU_MATMUL=blas``,
alternating (A B, then B A, ...) so that the machine's load falls on both alike:

- ``pretrain``: the default job (``myriad pretrain``, the maze, 8 members, 512 envs,
  150 iterations);
- ``finetune-ppo``: ``myriad finetune --algo ppo`` on the maze's dense task at 4,096 envs, one
  policy, 30 iterations;
- ``finetune-sapg`` and ``finetune-cpo``: the same with the algorithm's default population.

Per run: the training wall time and env-steps/s of its ``summary.json`` (the loop alone: set-up
and the final report are left out) and the figures that show the two learned alike (final
entropy and coverage for pretraining, the last episode return for finetuning; the products
differ in floating-point summation order, so the runs are not bit-identical), and the load
average. The JSON gives, per job, the median wall time of each variant and their ratio.
Beside the timed runs, the default pretraining job runs once per variant for each of
``--quality-seeds`` (seed 0 is the timed runs'): its final collective entropy and coverage per
seed, to tell a change of behaviour from the spread between seeds.

    python benchmarks/cpu_matmul.py [--rounds 2] [--jobs pretrain finetune-ppo ...]
        [--quality-seeds 1 2 3]

Writes ``benchmarks/results/cpu_matmul.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
QUIET = ("progress=false", "plots=false", "tensorboard=false", "checkpoint_every=0")
FINETUNE = (
    "task=dense",
    "num_envs=4096",
    "iterations=30",
    "eval.every=0",
    "eval.final_episodes=16",
)
JOBS: dict[str, list[str]] = {
    "pretrain": ["pretrain", *QUIET],
    "finetune-ppo": ["finetune", "--algo", "ppo", "population.size=1", *FINETUNE, *QUIET],
    "finetune-sapg": ["finetune", "--algo", "sapg", *FINETUNE, *QUIET],
    "finetune-cpo": ["finetune", "--algo", "cpo", *FINETUNE, *QUIET],
}
VARIANTS = ("onednn", "blas")
KEPT = (
    "wall_time_s",
    "steps_per_second",
    "eval_entropy_collective",
    "eval_coverage_union",
)


def run(job: str, variant: str, folder: Path, extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One run of ``job`` as the ``myriad`` command (with ``extra`` overrides); its summary's
    figures."""
    env = {**os.environ, "MYRIAD_CPU_MATMUL": variant}
    command = [*JOBS[job], *extra]
    argv = [sys.executable, "-m", "myriad", *command[:1], "--run-dir", str(folder), *command[1:]]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{done.stderr[-3000:]}")
    summary = json.loads((folder / "summary.json").read_text())
    out = {key: summary[key] for key in KEPT if key in summary}
    final_eval = summary.get("final_eval") or {}
    if "eval/leader_return" in final_eval:
        out["final_return"] = final_eval["eval/leader_return"]
    out["load_average"] = os.getloadavg()
    return out


def summarize(
    jobs: list[str], runs: list[dict[str, Any]], quality: list[dict[str, Any]]
) -> dict[str, Any]:
    """Per job: each variant's median training wall time over its timed ``runs`` and the
    speed-up (MKL's time over oneDNN's); for ``pretrain``, beside them, the final collective
    entropy and coverage per seed and variant (seed 0 from the first round of the timed runs,
    the others from ``quality``)."""
    summary: dict[str, Any] = {}
    for job in jobs:
        walls = {
            v: statistics.median(
                x["wall_time_s"] for x in runs if (x["job"], x["variant"]) == (job, v)
            )
            for v in VARIANTS
        }
        summary[job] = {"wall_time_s": walls, "speed_up": walls["blas"] / walls["onednn"]}
    if "pretrain" in jobs:
        seed0 = [{**x, "seed": 0} for x in runs if x["job"] == "pretrain" and x["round"] == 0]
        summary["pretrain"]["per_seed"] = {
            v: {
                key: [x[key] for x in [*seed0, *quality] if x["variant"] == v]
                for key in ("seed", "eval_entropy_collective", "eval_coverage_union")
            }
            for v in VARIANTS
        }
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--jobs", nargs="+", default=list(JOBS), choices=list(JOBS))
    parser.add_argument("--quality-seeds", type=int, nargs="*", default=[1, 2, 3])
    parser.add_argument("--out", default=str(RESULTS / "cpu_matmul.json"))
    args = parser.parse_args()

    import myriad  # noqa: F401  (the process settings, before torch)
    from myriad.bench.common import machine_info, write_json

    runs: list[dict[str, Any]] = []
    quality: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for job in args.jobs:
            for r in range(args.rounds):
                for variant in VARIANTS if r % 2 == 0 else VARIANTS[::-1]:
                    folder = Path(tmp) / f"{job}-{variant}-{r}"
                    record = {"job": job, "variant": variant, "round": r}
                    record |= run(job, variant, folder)
                    runs.append(record)
                    print(record, flush=True)
        for seed in args.quality_seeds:
            for variant in VARIANTS:
                folder = Path(tmp) / f"quality-{variant}-{seed}"
                record = {"job": "pretrain", "variant": variant, "seed": seed, "timed": False}
                record |= run("pretrain", variant, folder, (f"seed={seed}",))
                quality.append(record)
                print(record, flush=True)
    summary = summarize(args.jobs, runs, quality)
    for job in args.jobs:
        walls = summary[job]["wall_time_s"]
        print(
            f"{job:14s} oneDNN {walls['onednn']:.1f} s, MKL {walls['blas']:.1f} s:"
            f" {summary[job]['speed_up']:.2f}x",
            flush=True,
        )
    write_json(
        args.out,
        {
            "machine": machine_info(),
            "note": "wall time of the training loop (summary.json), median over rounds",
            "jobs": {job: JOBS[job] for job in args.jobs},
            "summary": summary,
            "runs": runs,
            "quality_runs": quality,
        },
    )
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
