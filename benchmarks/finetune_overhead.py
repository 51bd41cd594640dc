"""What ``myriad finetune``'s runner costs per iteration beyond collecting and updating.

The runner of ``myriad finetune`` (:class:`~myriad.finetune.runner.FinetuneRunner`, built from the
command's config, in a process started like the command: ``import myriad`` first, so its
process settings apply, then the run's ``torch_threads``) runs ``--iterations`` iterations of
``FinetuneRunner.learn`` after ``--warmup`` ones, with its methods timed: the rollout
(``collect``), the algorithm's ``update``, the whole ``iteration`` (which adds the episode
statistics, the member scalars and the KL diagnostics) and the loop around it (logging, the
progress bar, bookkeeping). The end-of-run checkpoint and summary, written once per run, are
left out. Per iteration: seconds of each part and the overhead's share of the loop.

    python benchmarks/finetune_overhead.py [--algos ppo cpo] [--threads 1 2] [--num-envs 4096]

Writes ``benchmarks/results/finetune_overhead.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
RANK_FLAG = "--one"
#: The rsl_rl comparison's env, network and PPO settings (benchmarks/rsl_rl_compare.py) for
#: ``algo=ppo``; the algorithm's own population for the others. Quiet: no evaluation during
#: training, no plots, no TensorBoard, no periodic checkpoints.
COMMON = (
    "env=maze",
    "task=dense",
    "env.options.max_episode_steps=400",
    "env.options.max_speed=0.85",
    "population.actor_hidden=[64,64]",
    "population.critic_hidden=[64,64]",
    "num_steps=32",
    "eval.every=0",
    "checkpoint_every=0",
    "progress=false",
    "plots=false",
    "tensorboard=false",
)


def overrides(algo: str, num_envs: int, threads: int) -> list[str]:
    size = ["population.size=1"] if algo == "ppo" else []
    return [*COMMON, *size, f"num_envs={num_envs}", f"torch_threads={threads}"]


def one(algo: str, num_envs: int, threads: int, warmup: int, iterations: int) -> dict[str, Any]:
    """One run in this process (started like the command); the per-iteration figures."""
    import myriad  # noqa: F401  (the process settings, before torch)
    from myriad.finetune.api import resolve_config
    from myriad.finetune.runner import FinetuneRunner
    from myriad.rl.runner import set_torch_threads

    cfg = resolve_config(algo, overrides(algo, num_envs, threads))
    set_torch_threads(cfg)
    seconds: dict[str, float] = defaultdict(float)

    def timed(owner: Any, name: str) -> None:
        method = getattr(owner, name)

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return method(*args, **kwargs)
            finally:
                seconds[name] += time.perf_counter() - start

        setattr(owner, name, wrapper)

    with tempfile.TemporaryDirectory() as tmp:
        runner = FinetuneRunner(cfg, Path(tmp) / "run")
        for owner, name in (
            (runner, "collect"),
            (runner.algorithm, "update"),
            (runner, "iteration"),
            (runner, "save_checkpoint"),
            (runner, "write_summary"),
        ):
            timed(owner, name)
        runner.learn(warmup)
        seconds.clear()
        start = time.perf_counter()
        runner.learn(warmup + iterations)
        loop = time.perf_counter() - start - seconds["save_checkpoint"] - seconds["write_summary"]
        runner.close()
    per = {k: v / iterations for k, v in seconds.items()}
    loop /= iterations
    statistics_s = per["iteration"] - per["collect"] - per["update"]
    logging_s = loop - per["iteration"]
    return {
        "algo": algo,
        "threads": threads,
        "num_envs": num_envs,
        "openmp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "loop_s": loop,
        "collect_s": per["collect"],
        "update_s": per["update"],
        "statistics_diagnostics_s": statistics_s,
        "logging_loop_s": logging_s,
        "overhead_s": loop - per["collect"] - per["update"],
        "overhead_share": (loop - per["collect"] - per["update"]) / loop,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=["ppo", "cpo"])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default=str(RESULTS / "finetune_overhead.json"))
    args = parser.parse_args(argv)
    import json

    load_before = os.getloadavg()
    rows = []
    for repeat in range(args.repeats):
        for algo in args.algos:
            for threads in args.threads:
                env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
                command = [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    RANK_FLAG,
                    json.dumps([algo, args.num_envs, threads, args.warmup, args.iterations]),
                ]
                done = subprocess.run(command, env=env, capture_output=True, text=True)
                if done.returncode:
                    raise RuntimeError(done.stderr[-3000:])
                row = json.loads(done.stdout.strip().splitlines()[-1])
                row.update(repeat=repeat, load_average=os.getloadavg())
                rows.append(row)
                print(row, flush=True)
    keys = ("loop_s", "collect_s", "update_s", "statistics_diagnostics_s", "logging_loop_s")
    summary = {}
    for algo in args.algos:
        for threads in args.threads:
            cell = [r for r in rows if r["algo"] == algo and r["threads"] == threads]
            figures = {k: statistics.median(r[k] for r in cell) for k in keys}
            figures["overhead_s"] = figures["loop_s"] - figures["collect_s"] - figures["update_s"]
            figures["overhead_share"] = figures["overhead_s"] / figures["loop_s"]
            summary[f"{algo}/{threads}threads"] = figures
            print(
                f"{algo:5s} {threads} thread(s): loop {figures['loop_s']:.3f} s, collect "
                f"{figures['collect_s']:.3f}, update {figures['update_s']:.3f}, statistics and "
                f"diagnostics {figures['statistics_diagnostics_s'] * 1e3:.1f} ms, logging "
                f"{figures['logging_loop_s'] * 1e3:.1f} ms ({figures['overhead_share']:.1%})"
            )
    from myriad.bench.common import machine_info, write_json

    payload = {
        "machine": machine_info(),
        "config": {a: overrides(a, args.num_envs, 0)[:-1] for a in args.algos},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "note": "medians over repeats; a shared 2-core machine: see the load averages",
        "summary": summary,
        "runs": rows,
    }
    print(f"written {write_json(args.out, payload)}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == RANK_FLAG:
        import json

        print(json.dumps(one(*json.loads(sys.argv[2]))))
        raise SystemExit(0)
    raise SystemExit(main())
