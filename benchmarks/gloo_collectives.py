"""A sum over two gloo ranks: ``torch.distributed.all_reduce`` against the all-gather that
:meth:`myriad.distributed.torchdist.RankGroup.all_reduce_` uses for small tensors.

Two torchrun ranks on this machine (gloo, loopback, one torch thread each) sum a float32 tensor
of each size many times, each way, interleaved in rounds. Between two sums each rank runs
``--work-ms`` of matrix products, as a rank runs a minibatch between two gradient averages, so
the figures include the wait for the other rank's arrival as the update sees it; ``0`` times
back-to-back sums. Per way and size: the median, 90th percentile and mean seconds of a call on
rank 0. ``gathered`` is a sum from an all-gather, as ``RankGroup.all_reduce_`` (and the split
update's gradient average, started with ``start_all_reduce_``) makes it below
``GATHERED_SUM_LIMIT``; ``all_reduce`` is gloo's own. Sizes above the limit go to gloo's
all-reduce both ways.

    python benchmarks/gloo_collectives.py [--sizes 100 8600 100000] [--work-ms 0 10]

Writes ``benchmarks/results/gloo_collectives.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
RANK_FLAG = "--rank"
WAYS = ("all_reduce", "gathered")


def rank_main(sizes: list[int], work_ms: list[float], calls: int, rounds: int, report: str) -> int:
    """One rank: every (way, size, work) cell timed ``calls`` times per round."""
    import torch
    import torch.distributed as dist

    from myriad.distributed.torchdist import RankGroup

    ranks = RankGroup.launch("cpu")
    work = torch.randn(128, 128, generator=torch.Generator().manual_seed(ranks.rank))

    def compute(seconds: float) -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            work @ work

    times: dict[str, list[float]] = {}
    for _ in range(rounds):
        for ms in work_ms:
            for size in sizes:
                x = torch.randn(size)
                for way in WAYS:
                    cell = times.setdefault(f"{way} {size} {ms:g}", [])
                    for k in range(calls + 5):
                        compute(ms / 1000.0)
                        t0 = time.perf_counter()
                        if way == "all_reduce":
                            dist.all_reduce(x)
                        else:
                            ranks.all_reduce_(x)
                        if k >= 5:  # the first calls of a cell warm the buffers up
                            cell.append(time.perf_counter() - t0)
                        x.div_(2.0)  # keep the values bounded
    if ranks.is_writer:
        Path(report).write_text(json.dumps(times))
    ranks.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", type=int, default=[100, 8600, 100000])
    parser.add_argument("--work-ms", nargs="+", type=float, default=[0.0, 10.0])
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default=str(RESULTS / "gloo_collectives.json"))
    args = parser.parse_args(argv)
    from myriad.bench.common import machine_info, torchrun_prefix, write_json
    from myriad.distributed.torchdist.group import GATHERED_SUM_LIMIT

    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "times.json"
        env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
        env.pop("WORLD_SIZE", None)
        command = [
            *torchrun_prefix(2),
            str(Path(__file__).resolve()),
            RANK_FLAG,
            json.dumps([args.sizes, args.work_ms, args.calls, args.rounds, str(report)]),
        ]
        load_before = os.getloadavg()
        subprocess.run(command, env=env, check=True)
        times = json.loads(report.read_text())
    cells = []
    for key, values in times.items():
        way, size, ms = key.split()
        values.sort()
        cells.append(
            {
                "way": way,
                "elements": int(size),
                "work_ms": float(ms),
                "median_s": statistics.median(values),
                "p90_s": values[int(0.9 * len(values))],
                "mean_s": statistics.fmean(values),
                "calls": len(values),
            }
        )
    payload: dict[str, Any] = {
        "machine": machine_info(),
        "gathered_sum_limit": GATHERED_SUM_LIMIT,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "cells": cells,
    }
    write_json(args.out, payload)
    for c in cells:
        print(
            f"{c['way']:10s} {c['elements']:>8d} floats, work {c['work_ms']:>4g} ms: "
            f"median {c['median_s'] * 1e3:.3f} ms, p90 {c['p90_s'] * 1e3:.3f} ms, "
            f"mean {c['mean_s'] * 1e3:.3f} ms"
        )
    print(f"written {args.out}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == RANK_FLAG:
        raise SystemExit(rank_main(*json.loads(sys.argv[2])))
    raise SystemExit(main())
