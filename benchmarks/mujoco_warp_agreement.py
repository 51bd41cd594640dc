"""MuJoCo Warp (Warp's CPU device, float32) against CPU MuJoCo (float64), Gymnasium models.

For each case (robot, friction cone) and seed, on ``--envs`` envs and ``--steps`` env steps under
random controls (``myriad.envs.mujoco.agreement``):

- **stepwise**: every step starts Warp from the CPU state; the one-step relative gap of
  ``qpos``/``qvel`` (max, median, 99th percentile, share of env-steps over the tolerance);
- **free running**: both reset to the same states and never re-synchronised; the first step at
  which the gap exceeds the tolerance (median and minimum over envs), for Warp against CPU and for
  CPU against itself with its state rounded to float32 after every step (how fast the dynamics
  amplify a float32-sized difference, whatever its source).

Cases: HalfCheetah and Ant as Gymnasium ships them (pyramidal friction cones), and Ant with
elliptic cones, whose friction does not depend on the contact frame's tangent directions (the one
place where MuJoCo Warp's plane-capsule contacts differ from MuJoCo's; docs/mujoco.md).

python benchmarks/mujoco_warp_agreement.py [--envs 16] [--steps 100] [--seeds 0 1 2]
    [--out benchmarks/results/mujoco_warp_agreement.json]
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import version

import mujoco
import torch

from myriad.bench.common import machine_info, print_table, write_json
from myriad.envs.mujoco.agreement import STEP_TOLERANCE, free_running_gaps, stepwise_gaps
from myriad.envs.mujoco.backends import CpuBackend, WarpBackend
from myriad.envs.mujoco.models import locomotion_model

CASES = (("halfcheetah", "pyramidal"), ("ant", "pyramidal"), ("ant", "elliptic"))
# Contact capacity per world as the envs allocate it.
CAPACITY = {"ant": (32, 192), "halfcheetah": (64, 256)}


def build(robot: str, cone: str, envs: int) -> tuple[CpuBackend, WarpBackend, CpuBackend]:
    model = locomotion_model(robot, "gymnasium")
    if cone == "elliptic":
        model.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    fields = ("xpos", "cfrc_ext")
    nconmax, njmax = CAPACITY[robot]
    cpu = CpuBackend(model, envs, 5, fields, num_workers=0)
    twin = CpuBackend(model, envs, 5, fields, num_workers=0)
    warp = WarpBackend(model, envs, 5, fields, "cpu", nconmax=nconmax, njmax=njmax)
    return cpu, warp, twin


def first_over(gaps: torch.Tensor, tolerance: float) -> torch.Tensor:
    """``[steps, E] -> [E]``: 1-based step at which each env first exceeds ``tolerance``
    (``steps + 1`` if never)."""
    over = gaps > tolerance
    steps = gaps.shape[0]
    index = torch.where(over.any(0), over.float().argmax(0) + 1, torch.tensor(steps + 1))
    return index


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", default="benchmarks/results/mujoco_warp_agreement.json")
    args = parser.parse_args(argv)
    tol = STEP_TOLERANCE
    results, rows = [], []
    for robot, cone in CASES:
        cpu, warp, twin = build(robot, cone, args.envs)
        step, free_warp, free_f32 = [], [], []
        try:
            for seed in args.seeds:
                step.append(stepwise_gaps(cpu, warp, args.steps, seed))
                free_warp.append(first_over(free_running_gaps(cpu, warp, args.steps, seed), tol))
                gaps = free_running_gaps(cpu, twin, args.steps, seed, round32=True)
                free_f32.append(first_over(gaps, tol))
        finally:
            for b in (cpu, warp, twin):
                b.close()
        g = torch.cat([s.flatten() for s in step])
        fw, ff = torch.cat(free_warp).double(), torch.cat(free_f32).double()
        case = {
            "robot": robot,
            "cone": cone,
            "stepwise": {
                "max": float(g.max()),
                "median": float(g.median()),
                "p99": float(torch.quantile(g, 0.99)),
                "share_over_tolerance": float((g > tol).double().mean()),
                "env_steps": int(g.numel()),
            },
            "free_running_first_step_over_tolerance": {
                "warp_vs_cpu": {"median": float(fw.median()), "min": int(fw.min())},
                "cpu_vs_cpu_rounded_to_float32": {
                    "median": float(ff.median()),
                    "min": int(ff.min()),
                },
            },
        }
        results.append(case)
        s = case["stepwise"]
        rows.append(
            [
                f"{robot} ({cone})",
                f"{s['max']:.1e}",
                f"{s['median']:.1e}",
                f"{s['p99']:.1e}",
                f"{100 * s['share_over_tolerance']:.2f}%",
                f"{fw.median():.0f} (min {fw.min():.0f})",
                f"{ff.median():.0f} (min {ff.min():.0f})",
            ]
        )
    print_table(
        "MuJoCo Warp (float32) against CPU MuJoCo: relative gap of qpos/qvel",
        [
            "case",
            "step max",
            "median",
            "p99",
            f"> {tol:g}",
            "free: warp leaves tol at",
            "cpu-f32 leaves tol at",
        ],
        rows,
    )
    write_json(
        args.out,
        {
            "benchmark": "mujoco_warp_agreement",
            "tolerance": tol,
            "envs": args.envs,
            "steps": args.steps,
            "seeds": args.seeds,
            "device": "warp cpu",
            "versions": {p: version(p) for p in ("mujoco", "mujoco-warp", "warp-lang")},
            "cases": results,
            "machine": machine_info(),
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
