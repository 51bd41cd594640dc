"""Size of a Minari export against its source HDF5, and whether it recovers its env.

    python benchmarks/minari_size.py [--iterations 30] [--out benchmarks/results/minari_size.json]

Pretrains small runs (``nav-maze`` with the default population, 512 envs and 400-step
episodes; ``gymnasium`` Pendulum-v1 with 64 envs and 200-step episodes), exports each dataset
to Minari and records the bytes on disk of the source HDF5 (D4RL layout, lzf, Fletcher-32) and
of the Minari dataset (``data/`` plus ``myriad-digest.json``), their ratio, and whether
``minari.load_dataset(...).recover_environment()`` builds an env whose spaces are the
dataset's.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from myriad.bench.common import write_json
from myriad.datasets import export
from myriad.datasets.schema import disk_size
from myriad.pretrain.api import pretrain

RESULTS = Path(__file__).parent / "results"

CASES: dict[str, list[str]] = {
    "nav-maze": [],
    "gymnasium-pendulum": [
        "env=gymnasium",
        "env.id=Pendulum-v1",
        "env.features=[0,1]",
        "num_envs=64",
        "population.size=4",
    ],
}


def measure(name: str, overrides: list[str], iterations: int, root: Path) -> dict[str, object]:
    import minari

    run = root / name
    common = ["progress=false", "plots=false", "tensorboard=false", f"iterations={iterations}"]
    pretrain([*overrides, *common], run_dir=run, quiet=True)
    source = run / "dataset" / "transitions.hdf5"
    os.environ["MINARI_DATASETS_PATH"] = str(root / "minari")
    start = time.perf_counter()
    result = export(run, "minari", root / "minari", dataset_id=f"bench/{name}-v0")
    seconds = time.perf_counter() - start
    dataset = minari.load_dataset(f"bench/{name}-v0")
    env = dataset.recover_environment()
    recovered = (
        env.observation_space == dataset.observation_space
        and env.action_space == dataset.action_space
    )
    row = {
        "overrides": overrides,
        "rows": result.rows,
        "episodes": int(dataset.total_episodes),
        "source_bytes": disk_size(source),
        "minari_bytes": disk_size(result.path),
        "minari_data_bytes": disk_size(result.path / "data"),
        "export_s": seconds,
        "recovered_env": env.spec.id if env.spec is not None else None,
        "recovered_spaces_match": bool(recovered),
    }
    row["ratio"] = row["minari_bytes"] / row["source_bytes"]  # type: ignore[operator]
    env.close()
    print(
        f"{name}: {result.rows:,} rows, {row['episodes']} episodes; HDF5 "
        f"{row['source_bytes'] / 2**20:.1f} MiB, Minari {row['minari_bytes'] / 2**20:.1f} MiB "
        f"({row['ratio']:.2f}x); recover_environment: {row['recovered_env']}"
    )
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--out", default=str(RESULTS / "minari_size.json"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        cases = {name: measure(name, o, args.iterations, Path(tmp)) for name, o in CASES.items()}
    write_json(args.out, {"iterations": args.iterations, "cases": cases})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
