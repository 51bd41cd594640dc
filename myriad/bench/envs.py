"""``myriad bench envs``: environment throughput (env-steps per second) per env, size and device.

Random actions from a pre-generated bank (so the figure is the environment's cost, not the random
number generator's), a warm-up, then the best of several timed repeats. Writes JSON and prints a
table. Families other than ``nav`` contribute their own cases through a ``BENCH_CASES`` list in
their module (``{"name", "options", "num_envs"}``).
"""

from __future__ import annotations

import importlib
import time
from typing import Any

import torch

from myriad.bench.common import machine_info, print_table, write_json
from myriad.envs import make
from myriad.utils.commandline import ArgumentParser
from myriad.utils.optional import available

NAV_CASES: list[dict[str, Any]] = [
    {"name": "nav-maze", "options": {}, "num_envs": [1024, 4096, 16384, 65536]},
    {"name": "nav-empty", "options": {}, "num_envs": [4096, 16384]},
    {"name": "nav-four-rooms", "options": {"control": "force"}, "num_envs": [16384]},
]
GYMNASIUM_CASES: list[dict[str, Any]] = [
    {"name": "gymnasium", "options": {"env_id": "Pendulum-v1"}, "num_envs": [64]},
    {"name": "gymnasium", "options": {"env_id": "Ant-v5"}, "num_envs": [4]},
    {
        "name": "gymnasium",
        "options": {"env_id": "Ant-v5", "vectorization_mode": "async"},
        "num_envs": [4],
    },
]
QUICK_CASES: list[dict[str, Any]] = [
    {"name": "nav-maze", "options": {}, "num_envs": [4096, 16384]},
    {"name": "gymnasium", "options": {"env_id": "Ant-v5"}, "num_envs": [4]},
]
FAMILY_MODULES = ("myriad.envs.mujoco",)


def family_cases() -> list[dict[str, Any]]:
    """Benchmark cases contributed by other env families (those importable here)."""
    cases: list[dict[str, Any]] = []
    for module in FAMILY_MODULES:
        if importlib.util.find_spec(module) is None:
            continue
        cases += list(getattr(importlib.import_module(module), "BENCH_CASES", []))
    return cases


def time_env(
    name: str,
    num_envs: int,
    device: str,
    options: dict[str, Any],
    seconds: float = 1.0,
    repeats: int = 3,
) -> dict[str, Any]:
    """Throughput of ``name`` at ``num_envs``: best of ``repeats`` runs of about ``seconds``."""
    env = make(name, num_envs, device, **options)
    try:
        gen = torch.Generator().manual_seed(0)
        bank = [
            (torch.rand(num_envs, env.action_dim, generator=gen) * 2 - 1).to(device)
            for _ in range(8)
        ]
        env.reset(seed=0)
        start = time.perf_counter()
        warm = 0
        while time.perf_counter() - start < min(0.3, seconds) or warm < 3:
            env.step(bank[warm % 8])
            warm += 1
        per_step = (time.perf_counter() - start) / warm
        steps = max(3, int(seconds / per_step))
        best = 0.0
        for _ in range(repeats):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for i in range(steps):
                env.step(bank[i % 8])
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            best = max(best, num_envs * steps / (time.perf_counter() - t0))
        return {
            "env": name,
            "options": options,
            "num_envs": num_envs,
            "device": device,
            "steps_per_s": best,
            "step_ms": 1e3 * num_envs / best,
        }
    finally:
        env.close()


def _label(case: dict[str, Any]) -> str:
    opts = ",".join(f"{k}={v}" for k, v in case["options"].items())
    return f"{case['env']}[{opts}]" if opts else case["env"]


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="myriad bench envs", description=__doc__)
    parser.add_argument("--out", default="benchmarks/results/envs.json", help="JSON output path")
    parser.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda")
    parser.add_argument("--quick", action="store_true", help="a short run over the key cases")
    parser.add_argument("--envs", nargs="*", help="only these env names")
    parser.add_argument("--num-envs", type=int, nargs="*", help="override the sizes")
    parser.add_argument("--seconds", type=float, default=1.0, help="timed seconds per repeat")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    cases = QUICK_CASES if args.quick else NAV_CASES + GYMNASIUM_CASES + family_cases()
    if args.envs:
        cases = [c for c in cases if c["name"] in args.envs] or [
            {"name": n, "options": {}, "num_envs": [4096]} for n in args.envs
        ]
    seconds = 0.3 if args.quick else args.seconds
    results, rows = [], []
    for case in cases:
        if case["options"].get("env_id") == "Ant-v5" and not available("mujoco"):
            continue
        for n in args.num_envs or case["num_envs"]:
            r = time_env(case["name"], n, args.device, dict(case["options"]), seconds)
            results.append(r)
            rows.append([_label(r), n, r["steps_per_s"], f"{r['step_ms']:.3f}"])
            print(f"  {_label(r)} x{n}: {r['steps_per_s']:,.0f} steps/s", flush=True)
    payload = {"benchmark": "envs", "machine": machine_info(args.device), "results": results}
    path = write_json(args.out, payload)
    print_table(
        f"env throughput on {args.device} ({torch.get_num_threads()} torch threads)",
        ["env", "num_envs", "env-steps/s", "ms per step"],
        rows,
    )
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
