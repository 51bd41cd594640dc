"""The k-NN share of a pretraining iteration at 16,384 envs x 16 members, before and after.

Two pretraining runners with the same seed (``num_envs=16384 population.size=16``, the maze, no
dataset) iterate in turn, for one and two torch threads in turn, so the machine's load falls on
every setting alike:

- ``before``: the k-NN search as it was at first: scipy's kd-tree over all rows (identical
  states included), queries in row order (:class:`LegacyKDTree`, a copy of that code
  registered for this script), the pooled and per-member searches one after the other;
- ``waited``: the default search, with the per-member search waited for before the update
  (``defer_members`` off);
- ``after``: the default configuration (at ``beta = 1`` the per-member search runs on during
  the update; ``perf/knn_share`` counts what the loop waits for it after the update). Its
  ``knn_cpu_s`` misses the per-member CPU time spent during the update, so compare the
  variants' ``iteration_cpu_s`` for the cost.

Both find the same neighbour distances, so the two runs train identically and see the same
states. Per iteration the JSON records the shares (``perf/knn_share``, ``perf/collect_share``,
``perf/update_share``), the iteration time, the k-NN seconds, the same in CPU seconds of the
process (``knn_cpu_share``: less sensitive to other processes than wall time), the load average
and the thread count. On the ``after`` run's states of each iteration the accuracy of the
default path is checked against exact search: the k-th neighbour distance of every state
against the legacy kd-tree (float64, exact), of a sample of states against float64 brute force,
and the entropies (collective, per member, diversity) against those of the exact search. A last
part times the pieces of one measurement (pooled search, per-member search, the whole
measurement) in CPU and wall seconds.

    python benchmarks/knn_share.py [--rounds 4] [--out benchmarks/results/knn_share.json]
        [--keep-freed-memory]   # the allocator setting of the myriad command
    python benchmarks/knn_share.py --default-run   # benchmarks/results/knn_share_default_run.json
"""

from __future__ import annotations

import argparse
import functools
import os
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

# faiss and torch each load their own OpenMP runtime; a spinning wait policy makes the idle
# threads of one compete with the working threads of the other on a small machine.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np
import torch

from myriad.bench.common import machine_info, write_json
from myriad.entropy import KNNSearch, Neighbors
from myriad.entropy.knn import REGISTRY, SearchBackend, SearchOptions
from myriad.entropy.knn.grouping import GroupLayout
from myriad.entropy.knn.multiset import DistinctRows
from myriad.entropy.knn.neighbors import drop_self_anywhere
from myriad.pretrain.api import resolve_config
from myriad.pretrain.objectives import EntropyMeasurement, Measurement, env_major
from myriad.pretrain.runner import PretrainRunner
from myriad.rl.runner import set_torch_threads

OVERRIDES = [
    "num_envs=16384",
    "population.size=16",
    "progress=false",
    "plots=false",
    "dataset.enabled=false",
    "checkpoint_every=0",
]
BRUTE_FORCE_QUERIES = 2048
VARIANTS = ("before", "waited", "after")


class LegacyKDTree(SearchBackend):
    """The kd-tree backend as it was: a median-split tree over all rows, queries in row order."""

    name: ClassVar[str] = "kdtree-legacy"
    centred: ClassVar[bool] = False

    def search(
        self, q: torch.Tensor, r: torch.Tensor, k: int, self_query: bool, options: SearchOptions
    ) -> Neighbors:
        from scipy.spatial import cKDTree

        ref = r.detach().to("cpu", torch.float64).numpy()
        qry = ref if self_query else q.detach().to("cpu", torch.float64).numpy()
        kk = k + 1 if self_query else k
        found_d, found_i = cKDTree(ref).query(qry, k=kk, workers=-1)
        dist = torch.from_numpy(np.asarray(found_d, dtype=np.float32).reshape(len(qry), kk))
        idx = torch.from_numpy(np.asarray(found_i, dtype=np.int64).reshape(len(qry), kk))
        if self_query:
            dist, idx = drop_self_anywhere(dist, idx, torch.arange(len(qry)))
        return Neighbors(dist[:, :k].contiguous(), idx[:, :k].contiguous())

    def grouped(
        self, x: torch.Tensor, k: int, layout: GroupLayout, options: SearchOptions
    ) -> Neighbors:
        from scipy.spatial import cKDTree

        n = x.shape[0]
        pts = layout.sort(x).detach().to("cpu", torch.float64).numpy()
        dist = np.empty((n, k + 1), dtype=np.float32)
        idx = np.empty((n, k + 1), dtype=np.int64)
        for s, m in zip(layout.starts.tolist(), layout.sizes.tolist()):
            block = pts[s : s + m]
            d, i = cKDTree(block).query(block, k=k + 1, workers=-1)
            dist[s : s + m] = np.asarray(d).reshape(m, k + 1)
            idx[s : s + m] = np.asarray(i).reshape(m, k + 1) + s
        d_t, i_t = drop_self_anywhere(
            torch.from_numpy(dist), torch.from_numpy(idx), torch.arange(n)
        )
        return layout.unsort(d_t, i_t)


class TimedMeasurement:
    """Wraps the runner's :class:`EntropyMeasurement` and adds up the CPU seconds of this
    process (every thread) spent in it: a figure the other processes on the machine change less
    than wall time."""

    def __init__(self, inner: EntropyMeasurement) -> None:
        self.inner = inner
        self.cpu_s = 0.0

    def __call__(self, features: torch.Tensor, update: bool = True) -> Measurement:
        start = time.process_time()
        out = self.inner(features, update)
        self.cpu_s += time.process_time() - start
        return out

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def make_runner(folder: Path, variant: str) -> PretrainRunner:
    """A runner of the benchmark's size with the k-NN path of ``variant``."""
    cfg = resolve_config(OVERRIDES)
    runner = PretrainRunner(cfg, folder)
    if variant == "before":
        runner.measure.search = KNNSearch(backend=LegacyKDTree.name)
        runner.measure.concurrent = False
    if variant in ("before", "waited"):
        runner.measure.defer_members = False
    runner.measure = TimedMeasurement(runner.measure)  # type: ignore[assignment]
    return runner


def exact_measurement(measure: EntropyMeasurement, features: torch.Tensor) -> Measurement:
    """The legacy exact search on ``features`` with ``measure``'s scale, every state queried."""
    exact = EntropyMeasurement(
        measure.k, measure.num_members, measure.dim, backend=LegacyKDTree.name
    )
    exact.normalizer.load_state_dict(measure.normalizer.state_dict())
    return exact.evaluate(features)


def brute_force_kth(
    x: torch.Tensor, rows: torch.Tensor, k: int, blocks: int, chunk: int = 32
) -> torch.Tensor:
    """``[len(rows)]`` float64 k-th neighbour distance of ``x[rows]`` among the other rows of
    ``x`` (``blocks == 1``) or of the row's own equal block, by exhaustive float64 search."""
    x64 = x.to(torch.float64)
    size = x.shape[0] // blocks
    out = torch.empty(len(rows), dtype=torch.float64)
    for b in range(blocks):
        mine = torch.nonzero(rows // size == b).flatten()
        ref = x64[b * size : (b + 1) * size]
        for s in range(0, len(mine), chunk):
            sel = mine[s : s + chunk]
            local = rows[sel] - b * size
            # Differences, not the |a|^2 + |b|^2 - 2 a.b expansion, which loses digits.
            d = torch.cdist(x64[rows[sel]], ref, compute_mode="donot_use_mm_for_euclid_dist")
            d[torch.arange(len(sel)), local] = float("inf")  # the point itself, by index
            out[sel] = torch.topk(d, k, dim=1, largest=False).values.max(dim=1).values
    return out


def recall(found_kth: torch.Tensor, true_kth: torch.Tensor) -> float:
    """Fraction of states whose k-th neighbour distance is the exact one (float32 rounding)."""
    return float((found_kth.to(torch.float32) == true_kth.to(torch.float32)).double().mean())


def neighbour_recall(found: torch.Tensor, true_kth: torch.Tensor) -> float:
    """Fraction of the returned ``[N, k]`` neighbours that lie within the exact k-th distance
    (a tie-robust recall@k: copies tied at one distance are interchangeable)."""
    return float((found <= true_kth[:, None]).double().mean())


def accuracy(runner: PretrainRunner, generator: torch.Generator) -> dict[str, Any]:
    """The default path against exact search on the runner's last rollout."""
    measure = runner.measure
    stored = runner.storage.features
    assert stored is not None
    features = stored.clone()
    k, m = measure.k, measure.num_members
    got = measure(features, update=False)
    exact = exact_measurement(measure, features)
    x = got.scaled
    rows = torch.randperm(x.shape[0], generator=generator)[:BRUTE_FORCE_QUERIES]
    pooled_true = brute_force_kth(x, rows, k, 1)
    out: dict[str, Any] = {
        "states": int(x.shape[0]),
        "distinct_states": DistinctRows.find(x.double().numpy()).num_distinct,
        "pooled_kth_recall_vs_exact_kdtree": recall(
            got.pooled.distances[:, k - 1], exact.pooled.distances[:, k - 1]
        ),
        "pooled_kth_recall_vs_brute_force": recall(got.pooled.distances[rows, k - 1], pooled_true),
        "pooled_neighbour_recall_vs_exact_kdtree": neighbour_recall(
            got.pooled.distances, exact.pooled.distances[:, k - 1]
        ),
        "brute_force_queries": len(rows),
    }
    grouped_true = brute_force_kth(x, rows, k, m)
    out["member_kth_recall_vs_exact_kdtree"] = recall(
        got.grouped.distances[:, k - 1], exact.grouped.distances[:, k - 1]
    )
    out["member_kth_recall_vs_brute_force"] = recall(
        got.grouped.distances[rows, k - 1], grouped_true
    )
    out["member_neighbour_recall_vs_exact_kdtree"] = neighbour_recall(
        got.grouped.distances, exact.grouped.distances[:, k - 1]
    )
    for name, a, b in (
        ("collective", got.collective, exact.collective),
        ("individual_mean", got.individual.mean(), exact.individual.mean()),
        ("diversity", got.diversity, exact.diversity),
    ):
        out[f"entropy_{name}"] = float(b)
        out[f"entropy_{name}_abs_error"] = float((a - b).abs())
        out[f"entropy_{name}_rel_error"] = float((a - b).abs() / b.abs())
    member_err = (got.individual - exact.individual).abs()
    out["entropy_member_max_abs_error"] = float(member_err.max())
    out["entropy_member_max_rel_error"] = float((member_err / exact.individual.abs()).max())
    return out


def timed(fn: Any) -> tuple[float, float]:
    """``(wall s, CPU s of this process)`` of one call."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def profile(runner: PretrainRunner, repeats: int = 3) -> dict[str, Any]:
    """Wall and CPU seconds of the pieces of one measurement, before and after, interleaved
    (the smallest of ``repeats``)."""
    measure = runner.measure
    stored = runner.storage.features
    assert stored is not None
    features = stored.clone()
    k, m = measure.k, measure.num_members
    x = measure.normalizer.scale(env_major(features)).contiguous()
    legacy = KNNSearch(backend=LegacyKDTree.name)
    legacy_measure = EntropyMeasurement(k, m, measure.dim, backend=LegacyKDTree.name)
    legacy_measure.concurrent = False
    legacy_measure.normalizer.load_state_dict(measure.normalizer.state_dict())
    pieces = {
        "before": {
            "pooled_search": lambda: legacy(x, k),
            "member_search": lambda: legacy.grouped(x, k, num_groups=m),
            "whole_measurement": lambda: legacy_measure(features, update=False),
        },
        "after": {
            "pooled_search": lambda: measure.search(x, k),
            "member_search": lambda: measure.search.grouped(x, k, num_groups=m),
            "whole_measurement": lambda: measure(features, update=False),
        },
    }
    best: dict[str, dict[str, list[float]]] = {
        v: {p: [float("inf"), float("inf")] for p in ps} for v, ps in pieces.items()
    }
    for _ in range(repeats):
        for variant, fns in pieces.items():
            for piece, fn in fns.items():
                wall, cpu = timed(fn)
                cell = best[variant][piece]
                cell[0], cell[1] = min(cell[0], wall), min(cell[1], cpu)
    return {
        "query_points": int(x.shape[0]),
        "reference_points": int(x.shape[0]),
        "per_member_points": int(x.shape[0]) // m,
        "dim": int(x.shape[1]),
        "k": k,
        "backend": measure.search.resolve(x.shape[0], x.shape[0], x.shape[1], x.device),
        "seconds": {
            v: {p: {"wall": c[0], "cpu": c[1]} for p, c in ps.items()} for v, ps in best.items()
        },
        "load_average": os.getloadavg(),
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean and range of the shares and times per (variant, threads)."""
    out: dict[str, Any] = {}
    for key in sorted({(r["variant"], r["torch_threads"]) for r in rows}):
        sel = [r for r in rows if (r["variant"], r["torch_threads"]) == key]
        cell: dict[str, Any] = {"iterations": len(sel)}
        for name in (
            "knn_share",
            "collect_share",
            "update_share",
            "iteration_s",
            "knn_s",
            "knn_cpu_share",
            "iteration_cpu_s",
            "knn_cpu_s",
        ):
            values = np.array([r[name] for r in sel])
            cell[name] = {
                "mean": float(values.mean()),
                "min": float(values.min()),
                "max": float(values.max()),
            }
        cell["load_average_1min_mean"] = float(np.mean([r["load_average"][0] for r in sel]))
        out[f"{key[0]}/{key[1]}thread"] = cell
    return out


DEFAULT_RUN_KEYS = (
    "eval_entropy_collective",
    "eval_entropy_individual_mean",
    "eval_entropy_diversity",
    "eval_coverage_union",
    "coverage/cumulative_union",
    "entropy/collective",
    "perf/knn_share",
    "wall_time_s",
)


def default_run() -> dict[str, Any]:
    """The default job (``myriad pretrain``, 512 envs x 8 members) with the k-NN search as it was
    and as it is: the final entropies and coverage must not get worse."""
    from myriad.pretrain import pretrain

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for variant, extra in (
            ("before", [f"objective.backend={LegacyKDTree.name}"]),
            ("after", []),
        ):
            summary = pretrain(
                ["progress=false", "plots=false", *extra], run_dir=Path(tmp) / variant, quiet=True
            )
            out[variant] = {key: summary.get(key) for key in DEFAULT_RUN_KEYS}
            print(variant, out[variant], flush=True)
        out["measurement_ms"] = default_measurement_timing(Path(tmp) / "timing")
        print(out["measurement_ms"], flush=True)
    return out


def default_measurement_timing(folder: Path, repeats: int = 30) -> dict[str, Any]:
    """Milliseconds of one measurement of a default-size rollout (512 envs x 32 steps, 8
    members), before and after, interleaved: the median and smallest of ``repeats``."""
    runner = PretrainRunner(resolve_config(["progress=false", "plots=false"]), folder)
    set_torch_threads(runner.config)
    runner.iteration()
    stored = runner.storage.features
    assert stored is not None
    features = stored.clone()
    after = runner.measure
    before = EntropyMeasurement(after.k, after.num_members, after.dim, backend=LegacyKDTree.name)
    before.concurrent = False
    before.normalizer.load_state_dict(after.normalizer.state_dict())
    times: dict[str, dict[str, list[float]]] = {
        v: {"wall": [], "cpu": []} for v in ("before", "after")
    }
    for _ in range(repeats):
        for variant, measure in (("before", before), ("after", after)):
            wall, cpu = timed(functools.partial(measure, features, update=False))
            times[variant]["wall"].append(1000 * wall)
            times[variant]["cpu"].append(1000 * cpu)
    runner.close()
    return {
        "states": int(features.shape[0] * features.shape[1]),
        **{
            v: {
                f"{kind}_{stat}": float(fn(values))
                for kind, values in t.items()
                for stat, fn in (("median", np.median), ("min", np.min))
            }
            for v, t in times.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=4, help="timed iterations per setting")
    parser.add_argument("--threads", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--out", default="benchmarks/results/knn_share.json")
    parser.add_argument(
        "--keep-freed-memory",
        action="store_true",
        help="apply the myriad command's allocator setting (myriad.utils.memory) first",
    )
    parser.add_argument(
        "--default-run",
        action="store_true",
        help="instead: the default job before and after, into knn_share_default_run.json",
    )
    args = parser.parse_args()
    if args.keep_freed_memory:
        from myriad.utils.memory import keep_freed_memory

        keep_freed_memory()
    REGISTRY[LegacyKDTree.name] = LegacyKDTree()
    if args.default_run:
        result = {"machine": machine_info(), "runs": default_run(), "load_average": os.getloadavg()}
        print(
            f"written {write_json(Path(args.out).with_name('knn_share_default_run.json'), result)}"
        )
        return
    set_torch_threads(resolve_config(OVERRIDES))
    generator = torch.Generator().manual_seed(0)
    rows: list[dict[str, Any]] = []
    checks: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        runners = {v: make_runner(Path(tmp) / v, v) for v in VARIANTS}
        for runner in runners.values():  # warm-up: first-touch allocations, thread pools
            runner.iteration()
        for round_index in range(args.rounds):
            for threads in args.threads:
                torch.set_num_threads(threads)
                for variant, runner in runners.items():
                    timer = runner.measure
                    assert isinstance(timer, TimedMeasurement)
                    knn_cpu = timer.cpu_s
                    start, start_cpu = time.perf_counter(), time.process_time()
                    s = runner.iteration()
                    elapsed = time.perf_counter() - start
                    cpu = time.process_time() - start_cpu
                    knn_cpu = timer.cpu_s - knn_cpu
                    rows.append(
                        {
                            "round": round_index,
                            "variant": variant,
                            "torch_threads": torch.get_num_threads(),
                            "knn_share": s["perf/knn_share"],
                            "collect_share": s["perf/collect_share"],
                            "update_share": s["perf/update_share"],
                            "iteration_s": elapsed,
                            "knn_s": s["perf/knn_share"] * elapsed,
                            "iteration_cpu_s": cpu,
                            "knn_cpu_s": knn_cpu,
                            "knn_cpu_share": knn_cpu / cpu,
                            "entropy_collective": s["entropy/collective"],
                            "load_average": os.getloadavg(),
                        }
                    )
                    print(
                        f"round {round_index} {variant:6s} threads={threads} "
                        f"knn_share={s['perf/knn_share']:.3f} iteration={elapsed:.2f}s "
                        f"load={os.getloadavg()[0]:.2f}",
                        flush=True,
                    )
            torch.set_num_threads(1)
            checks.append({"round": round_index, **accuracy(runners["after"], generator)})
            print({k: v for k, v in checks[-1].items() if "recall" in k or "rel" in k}, flush=True)
        torch.set_num_threads(1)
        pieces = profile(runners["after"])
        for runner in runners.values():
            runner.close()
    payload: dict[str, Any] = {
        "machine": machine_info(),
        "kdtree_workers": (
            "all cores whatever the torch thread count (before: scipy workers=-1; waited and "
            "after: pykdtree's OpenMP loop with every runtime's count raised to all cores)"
        ),
        "keep_freed_memory": args.keep_freed_memory,
        "overrides": OVERRIDES,
        "summary": summarise(rows),
        "iterations": rows,
        "accuracy": checks,
        "profile": pieces,
        "load_average_end": os.getloadavg(),
    }
    out = write_json(args.out, payload)
    for key, cell in payload["summary"].items():
        print(
            f"{key:18s} knn_share={cell['knn_share']['mean']:.3f} "
            f"iteration={cell['iteration_s']['mean']:.2f}s knn={cell['knn_s']['mean']:.2f}s "
            f"knn_cpu_share={cell['knn_cpu_share']['mean']:.3f} "
            f"load={cell['load_average_1min_mean']:.2f}"
        )
    print(f"written {out}")


if __name__ == "__main__":
    main()
