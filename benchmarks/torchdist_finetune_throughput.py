"""Finetuning over two torchrun ranks: the update split over the ranks against replicated.

Each algorithm on the maze with the dense task and 4,096 envs (``algo=ppo``: one policy;
``cpo`` and ``sapg``: their default population of 4), run four ways, interleaved so the
machine's load falls on each alike:

- ``one_process``: ``myriad finetune`` with one torch thread (the default);
- ``one_process_2threads``: the same with ``torch_threads=2`` (both cores of this machine);
- ``two_ranks_split``: ``torchrun --nproc_per_node=2 -m myriad finetune``, each rank stepping
  half of the envs and learning from its share of the update (by envs for PPO, by rows of every
  minibatch for CPO and SAPG: ``FinetuneAlgorithm.rank_split``);
- ``two_ranks_replicated``: the same launch with the whole update on both ranks over the
  gathered rollout (``rank_split = "none"`` set in the ranks before they start);
- ``one_process_half``: one process with half the envs (each member's block halved), that is a
  rank's share of the work with nothing crossing processes: what a perfect split could reach on
  this CPU, per iteration (its env steps per second are those of half the envs);
- ``one_process_pair``: two one-process runs at once, each with all the envs: what the two cores
  lose when both are busy (shared caches and memory bandwidth), figures averaged over the pair.

``ceiling_vs_one_process`` (from the last two, when both ran) is the speed-up two ranks would
have if a rank's iteration took what the half-size iteration takes, slowed as a pair's iterations
are: ``one_process`` iteration time / (``one_process_half``'s x ``one_process_pair``'s /
``one_process``'s).

Every variant runs the ``myriad`` command through this script, which times the update and logs
it as ``train/update_seconds``. Per run: the median over iterations (the first two left out) of
rank 0's ``perf/steps_per_second`` (env steps of all ranks per second of wall time), of its
iteration time, of its update's seconds and of the CPU seconds of its process per iteration.
The machine's load average is recorded with every run. On a machine shared with other jobs the
wall-clock figures follow the load, and two processes get two shares of the cores where one
process gets one, which flatters the ranks; ``cpu_speed_vs_one_process`` (one process's CPU
seconds per iteration over rank 0's) is the speed-up on cores of their own, less the time a rank
waits for the other in a collective. ``paired_speed_vs_one_process`` is the median over repeats
of each repeat's ratio to the one-process run of the same repeat (:func:`paired_speedups`): on a
machine whose speed drifts between repeats it is steadier than the ratio of the medians.

    python benchmarks/torchdist_finetune_throughput.py [--algos ppo cpo sapg] [--repeats 2]

Writes ``benchmarks/results/torchdist_finetune_throughput.json``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
# The agreement benchmark's launch helpers and settings (benchmarks/ is on the path of a script
# run from it).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from torchdist_finetune_agreement import AGREEMENT  # noqa: E402

#: The agreement settings that set the env and its size, replaced here.
SIZE_KEYS = ("env=", "num_envs=", "population.", "iterations=")
VARIANTS = (
    "one_process",
    "one_process_2threads",
    "two_ranks_split",
    "two_ranks_replicated",
    "one_process_half",
    "one_process_pair",
)
RANK_FLAG = "--rank"
REPLICATED_FLAG = "--replicated"


def overrides(algo: str, num_envs: int, iterations: int) -> list[str]:
    """The agreement runs' task and quiet settings (no evaluation during training, no
    checkpoints but the last, no plots), on the maze: one policy for PPO, the algorithm's
    default population otherwise."""
    kept = [o for o in AGREEMENT if not o.startswith(SIZE_KEYS)]
    size = ["population.size=1"] if algo == "ppo" else []
    return [*kept, *size, f"num_envs={num_envs}", f"iterations={iterations}"]


def launch(algo: str, variant: str, run_dirs: list[Path], args: list[str]) -> None:
    """Run ``variant`` (one run directory per process it starts: two for the pair)."""
    from myriad.bench.common import torchrun_prefix

    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo"}
    env.pop("WORLD_SIZE", None)
    script = [str(Path(__file__).resolve()), RANK_FLAG]
    commands = [["finetune", "--algo", algo, "--run-dir", str(d), *args] for d in run_dirs]
    if variant.startswith("one_process"):
        threads = "2" if variant.endswith("2threads") else "1"
        argvs = [[sys.executable, *script, *c, f"torch_threads={threads}"] for c in commands]
    else:
        env["OMP_NUM_THREADS"] = "1"
        if variant == "two_ranks_replicated":
            script.append(REPLICATED_FLAG)
        argvs = [[*torchrun_prefix(2), *script, *c] for c in commands]
    # Each process's stderr goes to its own file, so neither can block on a full pipe while the
    # other runs; a failure stops the rest.
    logs = [d.parent / f"{d.name}.stderr" for d in run_dirs]
    running = []
    for argv, log in zip(argvs, logs):
        with open(log, "w") as err:
            running.append(subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=err))
    try:
        for argv, process, log in zip(argvs, running, logs):
            if process.wait():
                raise RuntimeError(f"{' '.join(argv)} failed:\n{log.read_text()[-3000:]}")
    finally:
        for process in running:
            if process.poll() is None:
                process.kill()
                process.wait()


def perfect_split(one: float, half: float, pair: float) -> float:
    """The iteration time of a rank with a perfect split (s): a half-size iteration ``half`` in
    one process, slowed by ``pair / one`` as an iteration of two concurrent processes is."""
    return half * pair / one


def paired_speedups(rows: list[dict[str, Any]], algo: str, variant: str) -> list[float]:
    """Per repeat, ``variant``'s env steps per second over ``one_process``'s of the same repeat.

    The variants of a repeat run back to back (interleaved), so a machine whose speed drifts
    between repeats moves both figures of a pair alike, where the ratio of two medians taken
    over different repeats moves with the drift."""

    def sps(v: str, repeat: int) -> float | None:
        found = [
            r["steps_per_second"]
            for r in rows
            if r["algo"] == algo and r["variant"] == v and r["repeat"] == repeat
        ]
        return found[0] if found else None

    ratios = []
    for repeat in sorted({r["repeat"] for r in rows if r["algo"] == algo}):
        one, other = sps("one_process", repeat), sps(variant, repeat)
        if one is not None and other is not None:
            ratios.append(other / one)
    return ratios


def env_count(variant: str, num_envs: int) -> int:
    """The envs a variant's processes run: half for ``one_process_half``."""
    return num_envs // 2 if variant == "one_process_half" else num_envs


def figures(run_dir: Path) -> dict[str, Any]:
    import torch

    last = sorted((run_dir / "checkpoints").glob("iter_*.pt"))[-1]
    history = torch.load(last, weights_only=True)["logger"]["history"]

    def series(key: str) -> list[float]:
        return [v for _, v in history[key]][2:]

    return {
        "steps_per_second": statistics.median(series("perf/steps_per_second")),
        "iteration_s": statistics.median(series("perf/iteration_time_s")),
        "update_s": statistics.median(series("train/update_seconds")),
        "cpu_s": statistics.median(series("perf/cpu_seconds")),
        "return_last3": statistics.fmean([v for _, v in history["episode/return"][-3:]]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=["ppo", "cpo", "sapg"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--iterations", type=int, default=12)
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--out", default=str(RESULTS / "torchdist_finetune_throughput.json"))
    args = parser.parse_args(argv)
    from myriad.bench.common import machine_info, write_json

    load_before = os.getloadavg()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos:
            for repeat in range(args.repeats):
                order = args.variants if repeat % 2 == 0 else args.variants[::-1]
                for variant in order:
                    copies = 2 if variant == "one_process_pair" else 1
                    run_dirs = [Path(tmp) / f"{algo}-{variant}-{repeat}-{k}" for k in range(copies)]
                    envs = env_count(variant, args.num_envs)
                    launch(algo, variant, run_dirs, overrides(algo, envs, args.iterations))
                    per_process = [figures(d) for d in run_dirs]
                    mean = {k: statistics.fmean(f[k] for f in per_process) for k in per_process[0]}
                    rows.append(
                        {
                            "algo": algo,
                            "variant": variant,
                            "repeat": repeat,
                            **mean,
                            "load_average": os.getloadavg(),
                        }
                    )
                    print(rows[-1], flush=True)
    summary: dict[str, dict[str, dict[str, Any]]] = {}
    for algo in args.algos:
        cells = {
            v: {
                key: statistics.median(
                    [r[key] for r in rows if r["variant"] == v and r["algo"] == algo]
                )
                for key in ("steps_per_second", "iteration_s", "update_s", "cpu_s")
            }
            for v in args.variants
        }
        base = cells["one_process"]["steps_per_second"]
        base_cpu = cells["one_process"]["cpu_s"]
        for cell in cells.values():
            cell["speed_vs_one_process"] = cell["steps_per_second"] / base
            # What each rank's core does per iteration against one process: the speed-up on
            # cores of their own, which the load of other jobs changes much less than the wall
            # clock (a rank waiting in a collective sleeps).
            cell["cpu_speed_vs_one_process"] = base_cpu / cell["cpu_s"]
        for variant, cell in cells.items():
            ratios = paired_speedups(rows, algo, variant)
            cell["paired_speedups"] = ratios
            cell["paired_speed_vs_one_process"] = statistics.median(ratios)
        if {"one_process_half", "one_process_pair"} <= cells.keys():
            one = cells["one_process"]["iteration_s"]
            slowed = perfect_split(
                one,
                cells["one_process_half"]["iteration_s"],
                cells["one_process_pair"]["iteration_s"],
            )
            cells["one_process"]["perfect_split_iteration_s"] = slowed
            cells["one_process"]["ceiling_vs_one_process"] = one / slowed
        summary[algo] = cells
    payload = {
        "machine": machine_info(),
        "config": {algo: overrides(algo, args.num_envs, args.iterations) for algo in args.algos},
        "num_envs": {v: env_count(v, args.num_envs) for v in args.variants},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "note": "a shared 2-core machine: the load averages (1, 5, 15 min) of every run are "
        "recorded; under a load above 2 the wall-clock figures are slowed by other jobs and "
        "two ranks get two shares of the cores (cpu_speed_vs_one_process is not)",
        "summary": summary,
        "runs": rows,
    }
    for algo, cells in summary.items():
        for variant, cell in cells.items():
            print(
                f"{algo:5s} {variant:22s} {cell['steps_per_second']:10,.0f} env-steps/s "
                f"({cell['speed_vs_one_process']:.2f}x) iteration {cell['iteration_s']:.3f} s "
                f"update {cell['update_s']:.3f} s, CPU {cell['cpu_s']:.3f} s "
                f"({cell['cpu_speed_vs_one_process']:.2f}x); per repeat "
                f"{cell['paired_speed_vs_one_process']:.2f}x (median)"
            )
        if "ceiling_vs_one_process" in cells["one_process"]:
            ceiling = cells["one_process"]["ceiling_vs_one_process"]
            print(f"{algo:5s} two ranks with a perfect split on this CPU: {ceiling:.2f}x")
    print(f"written {write_json(args.out, payload)}")
    return 0


def timed_rank(argv: list[str]) -> int:
    """One process of a variant: the myriad command with the update timed (and, after
    ``--replicated``, the whole update on every rank)."""
    import time

    from myriad.cli import main as cli_main
    from myriad.finetune.base import FinetuneAlgorithm
    from myriad.finetune.cpo import CPO
    from myriad.finetune.pbt import PBT
    from myriad.finetune.runner import FinetuneRunner
    from myriad.finetune.sapg import SAPG
    from myriad.rl.ppo import PPO

    if argv[:1] == [REPLICATED_FLAG]:
        for cls in (FinetuneAlgorithm, SAPG, PBT):
            cls.rank_split = "none"
        argv = argv[1:]

    def timed(update: Any) -> Any:
        def timed_update(self: PPO, *args: Any, **kwargs: Any) -> dict[str, float]:
            start = time.perf_counter()
            stats = update(self, *args, **kwargs)
            # The outermost override writes last: the whole update of the algorithm.
            stats["update_seconds"] = time.perf_counter() - start
            return dict(stats)

        return timed_update

    for cls in (PPO, SAPG, CPO):
        cls.update = timed(cls.update)  # type: ignore[method-assign]
    iteration = FinetuneRunner.iteration

    def cpu_timed_iteration(self: FinetuneRunner) -> dict[str, float]:
        start = time.process_time()
        scalars = iteration(self)
        scalars["perf/cpu_seconds"] = time.process_time() - start
        return scalars

    FinetuneRunner.iteration = cpu_timed_iteration  # type: ignore[method-assign]
    return cli_main(argv)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == RANK_FLAG:
        raise SystemExit(timed_rank(sys.argv[2:]))
    raise SystemExit(main())
