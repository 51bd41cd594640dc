"""The learning loop with glibc's default allocator thresholds and with the ones ``myriad`` sets.

``myriad.utils.memory.keep_freed_memory`` (called by the ``myriad`` command) keeps freed blocks
of up to 32 MiB in the heap, so a minibatch's tensors reuse the previous minibatch's pages
instead of faulting in fresh ones. The allocator's settings belong to a process, so each case
runs in its own child process: ``rsl_rl_compare.py``'s myriad learner (nav-maze, dense reward,
4,096 envs, 64-64 ELU actor and critic, 32-step rollouts, 4 epochs x 4 minibatches), a warm-up
of 2 iterations, then ``--iterations`` timed ones. The two cases alternate for ``--rounds``
rounds per thread count; the JSON holds every child's iteration times and peak resident memory,
and the ratio of the medians.

    .venv/bin/python benchmarks/malloc_tuning.py     # writes benchmarks/results/malloc_tuning.json
"""

from __future__ import annotations

import argparse
import json
import os

# The OpenMP policy malloc_tuning.json was measured under.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from myriad.bench.common import machine_info, write_json

CASES = ("glibc_default", "keep_freed_memory")


def child(case: str, threads: int, iterations: int) -> dict[str, Any]:
    """One case in this process: iteration wall times and peak resident memory."""
    import torch

    from myriad.utils.memory import keep_freed_memory

    tuned = keep_freed_memory() if case == "keep_freed_memory" else False
    sys.path.insert(0, str(Path(__file__).parent))
    from rsl_rl_compare import MyriadLearner

    torch.set_num_threads(threads)
    learner = MyriadLearner(4096, 0, 0.2)
    learner.run(2)
    times = []
    for _ in range(iterations):
        start = time.perf_counter()
        learner.run(1)
        times.append(time.perf_counter() - start)
    return {
        "case": case,
        "threads": threads,
        "set": tuned,
        "iteration_s": times,
        "steps_per_s": learner.steps_per_iteration / statistics.median(times),
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/malloc_tuning.json"))
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iterations", type=int, default=4)
    ap.add_argument("--child", choices=CASES, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.threads[0], args.iterations)))
        return 0
    load_before = os.getloadavg()
    runs = []
    for threads in args.threads:
        for r in range(args.rounds):
            for case in CASES if r % 2 == 0 else CASES[::-1]:
                cmd = [sys.executable, __file__, "--child", case, "--threads", str(threads)]
                cmd += ["--iterations", str(args.iterations)]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                runs.append(json.loads(out.strip().splitlines()[-1]))
                row = runs[-1]
                print(
                    f"{threads} thread(s), {case:<18} {row['steps_per_s']:>9,.0f} env-steps/s, "
                    f"peak RSS {row['max_rss_mb']:.0f} MB",
                    flush=True,
                )
    summary = []
    for threads in args.threads:
        rate = {
            c: statistics.median(
                r["steps_per_s"] for r in runs if r["case"] == c and r["threads"] == threads
            )
            for c in CASES
        }
        rss = {
            c: statistics.median(
                r["max_rss_mb"] for r in runs if r["case"] == c and r["threads"] == threads
            )
            for c in CASES
        }
        summary.append(
            {
                "threads": threads,
                "steps_per_s": rate,
                "ratio": rate["keep_freed_memory"] / rate["glibc_default"],
                "max_rss_mb": rss,
            }
        )
        print(f"{threads} thread(s): ratio {summary[-1]['ratio']:.3f}")
    write_json(
        args.out,
        {
            "benchmark": "malloc_tuning",
            "machine": machine_info(),
            "load_average_before": list(load_before),
            "load_average_after": list(os.getloadavg()),
            "settings": {"rounds": args.rounds, "iterations": args.iterations, "num_envs": 4096},
            "summary": summary,
            "runs": runs,
        },
    )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
