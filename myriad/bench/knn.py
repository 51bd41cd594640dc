"""`myriad bench knn`: speed and accuracy of the kNN backends behind the entropy estimators.

For each size N and dimension p, on N standard-Gaussian states (the hardest case for trees and
inverted files: no low-dimensional structure), it times every backend on the k-NN self-query
(index or tree construction included, best of ``--repeats``), and compares each result with the
exact neighbours: recall@k and the relative error of the Kozachenko-Leonenko entropy computed from
its distances. It also times the per-group query (``--groups`` equal blocks) and reports what
``backend="auto"`` picks. Results go to a JSON file and a table.

Exact backends whose projected time exceeds ``--max-seconds`` (the kd-tree in high dimension,
brute force at large N) are timed on a subset of queries and reported as extrapolated: their
construction cost is negligible, so time scales with the number of queries. Approximate indexes
are always run in full (their build cost does not scale with the queries).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from myriad.bench.common import machine_info, write_json
from myriad.entropy.estimators import kl_entropy_from_distances
from myriad.entropy.knn import (
    KNNSearch,
    ivf_parameters,
    pq_subquantizers,
    select_backend,
    select_grouped_backend,
)
from myriad.utils.commandline import ArgumentParser
from myriad.utils.threads import available_cpus

DEFAULT_OUT = Path("benchmarks/results/knn.json")
ALL_BACKENDS = ("kdtree", "faiss", "torch", "faiss-pq", "faiss-ivf", "faiss-hnsw")
QUICK_BACKENDS = ("kdtree", "faiss", "torch", "faiss-pq")
# Per-group searches are small (N / M points each): only the exact backends are compared there.
GROUPED_BACKENDS = ("kdtree", "faiss", "torch")
TARGETS_S = {2: 0.2, 29: 1.5}
PROBE_QUERIES = 2048
# Backends whose cost is all in the queries (tree build / none), so a probe extrapolates.
EXTRAPOLATABLE = ("kdtree", "faiss", "torch")


def _parse_ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def _parser() -> argparse.ArgumentParser:
    ap = ArgumentParser(
        prog="myriad bench knn",
        description="Time the kNN backends (k-NN self-query) and measure approximate-index error.",
    )
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    ap.add_argument("--quick", action="store_true", help="small sizes, one repeat (smoke run)")
    ap.add_argument("--sizes", type=_parse_ints, default=None, help="comma list of N (65536)")
    ap.add_argument("--dims", type=_parse_ints, default=None, help="comma list of p (2,29)")
    ap.add_argument("--k", type=int, default=10, help="neighbour count (10)")
    ap.add_argument(
        "--backends",
        type=lambda s: [b for b in s.split(",") if b],
        default=None,
        help=f"comma list among {','.join(ALL_BACKENDS)} "
        f"(default all; --quick: {','.join(QUICK_BACKENDS)})",
    )
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per case, best kept (3)")
    ap.add_argument("--groups", type=int, default=16, help="members for the per-group query (16)")
    ap.add_argument("--no-grouped", action="store_true", help="skip the per-group timings")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads (all available)")
    ap.add_argument(
        "--max-seconds",
        type=float,
        default=None,
        help="extrapolate from a query subset when a run would take longer (30)",
    )
    ap.add_argument("--device", default="cpu", help="torch device of the data (cpu)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def _set_threads(threads: int) -> None:
    torch.set_num_threads(threads)
    try:
        import faiss

        faiss.omp_set_num_threads(threads)
    except ImportError:
        pass


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Any, device: torch.device) -> tuple[float, float, Any]:
    """``(wall seconds, process CPU seconds, result)``."""
    _sync(device)
    start = time.perf_counter()
    cpu = time.process_time()
    out = fn()
    _sync(device)
    return time.perf_counter() - start, time.process_time() - cpu, out


def _load_average() -> list[float] | None:
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


def _recall(found: torch.Tensor, exact: torch.Tensor) -> float:
    """Mean fraction of each row's exact neighbours that were found."""
    n, k = exact.shape
    hits = (found[:, :, None] == exact[:, None, :]).any(dim=1).sum()
    return float(hits) / (n * k)


def _measure(
    search: KNNSearch,
    x: torch.Tensor,
    k: int,
    repeats: int,
    max_seconds: float,
    grouped: int | None,
) -> dict[str, Any]:
    device = x.device
    n = x.shape[0]

    def full() -> Any:
        if grouped:
            return search.grouped(x, k, num_groups=grouped)
        return search(x, k)

    # A probe on a query subset bounds the run time before committing to the full query.
    probe = min(n, PROBE_QUERIES)
    resolved = search.resolve(n, n, x.shape[1], device)
    if probe < n and not grouped and resolved in EXTRAPOLATABLE:
        t_probe, c_probe, _ = _timed(lambda: search(x[:probe], k, x), device)
        projected = t_probe * n / probe
        if projected > max_seconds:
            return {
                "time_s": projected,
                "cpu_s": c_probe * n / probe,
                "times_s": [],
                "extrapolated": True,
                "result": None,
            }
    times, cpus = [], []
    result = None
    for _ in range(repeats):
        t, c, result = _timed(full, device)
        times.append(t)
        cpus.append(c)
        if t > max_seconds:
            break
    return {
        "time_s": min(times),
        "cpu_s": min(cpus),
        "times_s": times,
        "extrapolated": False,
        "result": result,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run the benchmark described by parsed ``args``; returns the JSON-ready record."""
    quick = args.quick
    sizes = args.sizes or ([8192] if quick else [65536])
    dims = args.dims or [2, 29]
    repeats = args.repeats or (1 if quick else 3)
    max_seconds = args.max_seconds or (10.0 if quick else 30.0)
    threads = args.threads or available_cpus()
    load_average_start = _load_average()
    _set_threads(threads)
    device = torch.device(args.device)
    backends = args.backends or list(QUICK_BACKENDS if quick else ALL_BACKENDS)
    for b in backends:
        if b not in ALL_BACKENDS:
            raise SystemExit(f"unknown backend {b!r}; choose among {', '.join(ALL_BACKENDS)}")
    k = args.k
    rows: list[dict[str, Any]] = []
    gen = torch.Generator().manual_seed(args.seed)
    for n in sizes:
        for p in dims:
            x = torch.randn(n, p, generator=gen).to(device)
            auto_pooled = select_backend(n, n, p, device)
            # Exact reference: the exact backend auto would use, else faiss brute force.
            ref_backend = auto_pooled if auto_pooled in ("kdtree", "faiss", "torch") else "faiss"
            exact = KNNSearch(backend=ref_backend)(x, k)
            modes = [("pooled", None)]
            if not args.no_grouped and args.groups > 1 and n % args.groups == 0:
                modes.append(("grouped", args.groups))
            for mode, groups in modes:
                if groups:
                    auto = select_grouped_backend(n // groups, p, device)
                    exact_g = KNNSearch(backend="kdtree" if p <= 8 else "faiss").grouped(
                        x, k, num_groups=groups
                    )
                else:
                    auto = auto_pooled
                    exact_g = exact
                # For the per-group query this is the same formula on per-group distances.
                h_ref = float(kl_entropy_from_distances(exact_g.distances[:, k - 1], p, k))
                candidates = [b for b in backends if not groups or b in GROUPED_BACKENDS]
                for backend in [*candidates, "auto"]:
                    search = KNNSearch(backend=backend)
                    m = _measure(search, x, k, repeats, max_seconds, groups)
                    print(
                        f"N={n} p={p} {mode} {backend}: {m['time_s']:.3f} s"
                        + (" (extrapolated)" if m["extrapolated"] else ""),
                        file=sys.stderr,
                        flush=True,
                    )
                    row: dict[str, Any] = {
                        "n": n,
                        "dim": p,
                        "k": k,
                        "mode": mode,
                        "groups": groups or 1,
                        "backend": backend,
                        "resolved": auto if backend == "auto" else backend,
                        "time_s": round(m["time_s"], 4),
                        "cpu_s": round(m["cpu_s"], 4),
                        "times_s": [round(t, 4) for t in m["times_s"]],
                        "extrapolated": m["extrapolated"],
                        "load_average": _load_average(),
                    }
                    res = m["result"]
                    if res is not None:
                        row["recall"] = round(_recall(res.indices, exact_g.indices), 5)
                        h = float(kl_entropy_from_distances(res.distances[:, k - 1], p, k))
                        row["entropy"] = round(h, 5)
                        row["entropy_exact"] = round(h_ref, 5)
                        row["entropy_rel_error"] = (h - h_ref) / abs(h_ref)
                        row["mean_log_rk_ratio"] = float(
                            (
                                res.distances[:, k - 1].double().log()
                                - exact_g.distances[:, k - 1].double().log()
                            ).mean()
                        )
                    if row["resolved"] == "faiss-pq":
                        row["pq_subquantizers"] = pq_subquantizers(p)[0]
                        row["pq_k_factor"] = search.pq_k_factor
                    if row["resolved"] == "faiss-ivf":
                        size = n // (groups or 1)
                        row["ivf_nlist"], row["ivf_nprobe"] = ivf_parameters(size)
                    target = TARGETS_S.get(p)
                    if backend == "auto" and mode == "pooled" and n == 65536 and target:
                        row["target_s"] = target
                        row["meets_target"] = m["time_s"] < target
                    rows.append(row)
    return {
        "benchmark": "knn",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "config": {
            "sizes": sizes,
            "dims": dims,
            "k": k,
            "repeats": repeats,
            "threads": threads,
            "device": str(device),
            "data": "standard Gaussian, float32",
            "timing": "wall clock, best of repeats, index/tree construction included; cpu_s is "
            "process CPU time (all threads) of the best run",
            "load_average_start": load_average_start,
            "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "quick": quick,
        },
        "machine": {
            **machine_info(str(device)),
            "faiss": _version("faiss"),
            "scipy": _version("scipy"),
        },
        "results": rows,
    }


def _version(module: str) -> str | None:
    try:
        mod = __import__(module)
    except ImportError:
        return None
    return getattr(mod, "__version__", None)


def _table(record: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    cfg = record["config"]
    table = Table(
        title=f"kNN self-query, k={cfg['k']}, {cfg['threads']} threads, {cfg['device']} "
        f"(best of {cfg['repeats']}, build included)"
    )
    for col in ("N", "p", "mode", "backend", "time (s)", "cpu (s)", "recall", "dH/|H|", "note"):
        table.add_column(col, justify="right" if col not in ("mode", "backend", "note") else "left")
    for r in record["results"]:
        backend = r["backend"] if r["backend"] != "auto" else f"auto -> {r['resolved']}"
        note = []
        if r["extrapolated"]:
            note.append("extrapolated")
        if "meets_target" in r:
            note.append(("meets" if r["meets_target"] else "misses") + f" < {r['target_s']} s")
        rec = f"{r['recall']:.3f}" if "recall" in r else "-"
        err = f"{r['entropy_rel_error']:+.2e}" if "entropy_rel_error" in r else "-"
        mode = r["mode"] if r["mode"] == "pooled" else f"{r['groups']} groups"
        time_s, cpu_s = f"{r['time_s']:.3f}", f"{r['cpu_s']:.2f}"
        table.add_row(
            str(r["n"]), str(r["dim"]), mode, backend, time_s, cpu_s, rec, err, ", ".join(note)
        )
    console = Console()
    if not console.is_terminal:
        # Redirected output (logs, CI) would otherwise wrap at 80 columns.
        console = Console(width=120)
    console.print(table)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``myriad bench knn``; returns the process exit status."""
    args = _parser().parse_args(argv)
    record = run(args)
    out = write_json(args.out, record)
    _table(record)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


__all__ = ["main", "run"]
