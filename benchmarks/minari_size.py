"""Size of a Minari export against its source HDF5, and whether it recovers its env.

    python benchmarks/minari_size.py [--iterations 30] [--out benchmarks/results/minari_size.json]

Pretrains small runs (``nav-maze`` with the default population, 512 envs and 400-step
episodes; ``gymnasium`` Pendulum-v1 with 64 envs and 200-step episodes), exports each dataset
to Minari and records the bytes on disk of the source HDF5 (D4RL layout, lzf, Fletcher-32) and
of the Minari dataset (``data/`` plus ``myriad-digest.json``), their ratio, and whether
``minari.load_dataset(...).recover_environment()`` builds an env whose spaces are the
dataset's. Each dataset is written twice: contiguous episodes (what ``myriad export`` writes)
and Minari's own chunked layout (``MinariWriter(compact=False)``); ``*_overhead_per_episode``
is the file size less the stored arrays, per episode, in bytes.
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
    chunked = _write_chunked(run, root / "chunked", f"bench/{name}-v0")
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
        "minari_chunked_bytes": disk_size(chunked),
        "export_s": seconds,
        "recovered_env": env.spec.id if env.spec is not None else None,
        "recovered_spaces_match": bool(recovered),
    }
    row["ratio"] = row["minari_bytes"] / row["source_bytes"]  # type: ignore[operator]
    row["ratio_chunked"] = row["minari_chunked_bytes"] / row["source_bytes"]  # type: ignore[operator]
    episodes = row["episodes"]
    row["overhead_per_episode"] = _overhead(result.path) / episodes  # type: ignore[operator]
    row["chunked_overhead_per_episode"] = _overhead(chunked) / episodes  # type: ignore[operator]
    for key in ("source", "minari", "minari_chunked"):
        row[f"{key}_mib"] = row[f"{key}_bytes"] / 2**20  # type: ignore[operator]
    env.close()
    print(
        f"{name}: {result.rows:,} rows, {row['episodes']} episodes; HDF5 "
        f"{row['source_bytes'] / 2**20:.1f} MiB, Minari {row['minari_bytes'] / 2**20:.1f} MiB "
        f"({row['ratio']:.2f}x; Minari's chunked layout {row['ratio_chunked']:.2f}x); "
        f"recover_environment: {row['recovered_env']}"
    )
    return row


def _write_chunked(run: Path, root: Path, dataset_id: str) -> Path:
    """The run's dataset as Minari lays it out (no contiguous rewrite)."""
    from myriad.datasets.formats import open_reader
    from myriad.datasets.minari_store import MinariWriter

    with open_reader(run) as reader:
        writer = MinariWriter(dataset_id, reader.spec, root=root, compact=False)
        for rows in reader.iter_chunks():
            writer.append(rows)
        return writer.close()


def _overhead(folder: Path) -> int:
    """Bytes of ``main_data.hdf5`` that are not stored arrays (object headers, indexes)."""
    import h5py

    path = folder / "data" / "main_data.hdf5"
    stored: list[int] = []
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda _, o: (
                stored.append(o.id.get_storage_size()) if isinstance(o, h5py.Dataset) else None
            )
        )
    return path.stat().st_size - sum(stored)


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
