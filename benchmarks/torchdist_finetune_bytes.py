"""What crosses the ranks per finetuning iteration, counted: every collective and its bytes.

Each algorithm runs a few iterations of ``myriad finetune``'s runner over two torchrun ranks
(gloo, CPU) with the collectives of :class:`~myriad.distributed.torchdist.RankGroup` counted:
per call site (the myriad function that asked for it), the number of calls and the bytes of
the tensor each rank puts in (an all-gather's local part, an all-reduce's buffer). The figures
are those of the last iteration (one without a checkpoint or an evaluation); they scale with the
config as the docstrings of the call sites say (docs/distributed.md).

    python benchmarks/torchdist_finetune_bytes.py [--algos ppo cpo sapg pbt] [--num-envs 4096]

Writes ``benchmarks/results/torchdist_finetune_bytes.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
sys.path.insert(0, str(Path(__file__).resolve().parent))
from torchdist_finetune_agreement import AGREEMENT  # noqa: E402

RANK_FLAG = "--rank"
SIZE_KEYS = ("env=", "num_envs=", "population.", "iterations=")
#: Files whose frames are the plumbing of a collective, not the place that asked for it.
PLUMBING = ("torchdist/group.py", "rl/row_share.py", "torchdist_finetune_bytes.py")


def overrides(algo: str, num_envs: int) -> list[str]:
    kept = [o for o in AGREEMENT if not o.startswith(SIZE_KEYS)]
    size = ["population.size=1"] if algo == "ppo" else []
    return [
        *kept,
        *size,
        f"num_envs={num_envs}",
        "iterations=3",
        "diagnostics.states_per_member=256",
    ]


def rank_main(algo: str, num_envs: int, run_dir: str, report: str) -> int:
    """One rank: three iterations with the collectives counted (the last one reported)."""
    import traceback

    import torch

    from myriad.distributed.torchdist import RankGroup, finetune_runner
    from myriad.finetune.api import resolve_config

    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])

    def site() -> str:
        for frame in reversed(traceback.extract_stack()[:-2]):
            if not frame.filename.endswith(PLUMBING):
                return f"{Path(frame.filename).name}:{frame.name}"
        return "?"

    def counted(name: str, method: Any) -> Any:
        def wrapper(self: RankGroup, *args: Any, **kwargs: Any) -> Any:
            value = args[0] if args else None
            if isinstance(value, torch.Tensor):
                cell = counts[f"{name} {site()}"]
                cell[0] += 1
                cell[1] += value.numel() * value.element_size()
            return method(self, *args, **kwargs)

        return wrapper

    # ``all_reduce_`` goes through ``start_all_reduce_``, which the gradient average calls
    # directly: counting the latter counts both once.
    labels = {"start_all_reduce_": "all_reduce_"}
    for name in ("all_gather_cat", "start_all_reduce_", "broadcast_", "gather_cat"):
        setattr(RankGroup, name, counted(labels.get(name, name), getattr(RankGroup, name)))
    cfg = resolve_config(algo, overrides(algo, num_envs))
    ranks = RankGroup.launch("cpu")
    runner = finetune_runner(cfg, run_dir, ranks)
    iteration = runner.iteration

    last: dict[str, dict[str, int]] = {}

    def counted_iteration() -> dict[str, float]:
        counts.clear()
        out = iteration()  # what follows (a checkpoint) is not the iteration's
        last.clear()
        last.update({key: {"calls": c, "bytes": b} for key, (c, b) in sorted(counts.items())})
        return out

    runner.iteration = counted_iteration  # type: ignore[method-assign]
    runner.learn(3)
    if ranks.is_writer:
        Path(report).write_text(
            json.dumps(
                {
                    "update_split": runner.update_split,
                    "rollout_rows": runner.storage.num_steps * runner.storage.num_envs,
                    "parameters": sum(p.numel() for p in runner.algorithm.parameters),
                    "per_iteration": last,
                    "total_bytes": sum(v["bytes"] for v in last.values()),
                }
            )
        )
    runner.close()
    ranks.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algos", nargs="+", default=["ppo", "cpo", "sapg", "pbt"])
    parser.add_argument("--num-envs", type=int, default=4096)
    parser.add_argument("--out", default=str(RESULTS / "torchdist_finetune_bytes.json"))
    args = parser.parse_args(argv)
    from myriad.bench.common import machine_info, torchrun_prefix, write_json

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for algo in args.algos:
            report = Path(tmp) / f"{algo}.json"
            command = [
                *torchrun_prefix(2),
                str(Path(__file__).resolve()),
                RANK_FLAG,
                algo,
                str(args.num_envs),
                str(Path(tmp) / algo),
                str(report),
            ]
            env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}
            done = subprocess.run(command, env=env, capture_output=True, text=True)
            if done.returncode:
                raise RuntimeError(f"{algo} failed:\n{done.stderr[-3000:]}")
            out[algo] = {"config": overrides(algo, args.num_envs), **json.loads(report.read_text())}
            print(algo, out[algo]["update_split"], f"{out[algo]['total_bytes']:,} bytes/rank")
            for key, cell in out[algo]["per_iteration"].items():
                print(f"    {key:60s} {cell['calls']:5d} calls {cell['bytes']:12,d} B")
    path = write_json(args.out, {"machine": machine_info(), "ranks": 2, "algos": out})
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == RANK_FLAG:
        algo, num_envs, run_dir, report = sys.argv[2:6]
        raise SystemExit(rank_main(algo, int(num_envs), run_dir, report))
    raise SystemExit(main())
