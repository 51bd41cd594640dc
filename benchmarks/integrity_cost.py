"""What the checksums cost: writing and reading with and without them, per format.

    python benchmarks/integrity_cost.py [--rows 500000] [--obs-dim 29] [--repeats 3]

- HDF5: the finished D4RL file as :class:`~myriad.datasets.hdf5.D4RLWriter` writes it (LZF,
  ``CHUNK_ROWS`` rows per chunk), with and without the Fletcher-32 filter; read column by column
  in ``CHUNK_ROWS`` steps, as the readers do.
- zarr: the replay-buffer arrays as :class:`~myriad.datasets.zarr_store.ZarrWriter` writes them
  (Blosc/zstd), with and without the CRC32C codec; read in ``CHUNK_ROWS`` steps.
- Minari: the block digests (:func:`~myriad.datasets.checksums.write_block_digests`, checked by
  :func:`~myriad.datasets.checksums.check_block_digests`) against the whole export
  (``myriad.datasets.export``) of the same rows.
- Checkpoints: :func:`~myriad.utils.checkpoint.save_checkpoint` and
  :func:`~myriad.utils.checkpoint.load_checkpoint` (digest included) against plain
  ``torch.save`` (through the same atomic write) / ``torch.load(weights_only=True)`` of the
  same payload.

Each figure is the median of ``--repeats`` runs. Writes ``benchmarks/results/integrity_cost.json``.
"""

from __future__ import annotations

import argparse
import io
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import h5py
import numpy as np
import torch
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec

from myriad.bench.common import write_json
from myriad.datasets.checksums import check_block_digests, write_block_digests
from myriad.datasets.schema import CHUNK_ROWS, DatasetSpec
from myriad.utils.checkpoint import atomic_write_bytes, load_checkpoint, save_checkpoint
from myriad.utils.optional import available

RESULTS = Path(__file__).parent / "results"


def columns(rows: int, obs_dim: int, action_dim: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Rows shaped like a pretraining dataset's (random values: no compression gains)."""
    rng = np.random.default_rng(seed)
    ends = np.zeros(rows, bool)
    ends[199::200] = True
    ends[-1] = True
    return {
        "observations": rng.standard_normal((rows, obs_dim), np.float32),
        "next_observations": rng.standard_normal((rows, obs_dim), np.float32),
        "actions": rng.uniform(-1, 1, (rows, action_dim)).astype(np.float32),
        "rewards": rng.standard_normal(rows, np.float32),
        "terminals": np.zeros(rows, bool),
        "timeouts": ends,
        "member": (np.arange(rows) // 200 % 8).astype(np.int32),
        "features": rng.standard_normal((rows, 2), np.float32),
    }


def median_time(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def hdf5_write(path: Path, data: dict[str, np.ndarray], checksums: bool) -> None:
    with h5py.File(path, "w") as f:
        for key, value in data.items():
            f.create_dataset(
                key,
                data=value,
                chunks=(min(CHUNK_ROWS, len(value)), *value.shape[1:]),
                compression="lzf",
                fletcher32=checksums,
            )


def hdf5_read(path: Path) -> None:
    with h5py.File(path, "r") as f:
        for key in f:
            n = f[key].shape[0]
            for start in range(0, n, CHUNK_ROWS):
                f[key][start : start + CHUNK_ROWS]


def zarr_write(path: Path, data: dict[str, np.ndarray], checksums: bool) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    root = zarr.open_group(path, mode="w", zarr_format=3)
    codecs: tuple = (BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle"),)
    if checksums:
        codecs = (*codecs, Crc32cCodec())
    for key, value in data.items():
        array = root.create_array(
            key,
            shape=value.shape,
            chunks=(CHUNK_ROWS, *value.shape[1:]),
            dtype=value.dtype,
            compressors=codecs,
        )
        array[:] = value


def zarr_read(path: Path) -> None:
    root = zarr.open_group(path, mode="r")
    for _, array in root.arrays():
        n = array.shape[0]
        for start in range(0, n, CHUNK_ROWS):
            array[start : start + CHUNK_ROWS]


def size_of(path: Path) -> int:
    return (
        path.stat().st_size
        if path.is_file()
        else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    )


def _bind(fn: Callable[..., object], *args: object) -> Callable[[], object]:
    return lambda: fn(*args)


def pair(off: float, on: float) -> dict[str, float]:
    return {"without_s": round(off, 4), "with_s": round(on, 4), "overhead": round(on / off - 1, 4)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--rows", type=int, default=500_000)
    p.add_argument("--obs-dim", type=int, default=29)
    p.add_argument("--action-dim", type=int, default=8)
    p.add_argument("--minari-rows", type=int, default=100_000)
    p.add_argument("--checkpoint-params", type=int, default=5_000_000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(RESULTS / "integrity_cost.json"))
    args = p.parse_args(argv)

    data = columns(args.rows, args.obs_dim, args.action_dim)
    result: dict[str, object] = {
        "rows": args.rows,
        "obs_dim": args.obs_dim,
        "action_dim": args.action_dim,
        "chunk_rows": CHUNK_ROWS,
        "repeats": args.repeats,
        "raw_bytes": int(sum(v.nbytes for v in data.values())),
    }
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for fmt, write, read in (("hdf5", hdf5_write, hdf5_read), ("zarr", zarr_write, zarr_read)):
            entry: dict[str, object] = {}
            paths = {flag: root / f"{fmt}_{flag}" for flag in (False, True)}
            w = {f: median_time(_bind(write, paths[f], data, f), args.repeats) for f in paths}
            r = {f: median_time(_bind(read, paths[f]), args.repeats) for f in paths}
            entry["write"] = pair(w[False], w[True])
            entry["read"] = pair(r[False], r[True])
            entry["bytes"] = {"without": size_of(paths[False]), "with": size_of(paths[True])}
            result[fmt] = entry

        if available("minari"):
            from myriad.datasets import D4RLWriter, export

            small = {k: v[: args.minari_rows] for k, v in data.items()}
            small["timeouts"][-1] = True
            spec = DatasetSpec(args.obs_dim, args.action_dim, ("x", "y"), {})
            source = root / "source.hdf5"
            writer = D4RLWriter(source, spec.obs_dim, spec.action_dim, spec.feature_names)
            writer.append(small)
            writer.close()
            t = time.perf_counter()
            out = export(source, "minari", root / "minari", dataset_id="bench/rows-v0").path
            total = time.perf_counter() - t
            write_s = median_time(lambda: write_block_digests(out), args.repeats)
            check_s = median_time(lambda: check_block_digests(out), args.repeats)
            result["minari"] = {
                "rows": args.minari_rows,
                "export_s": round(total, 4),
                "digest_write_s": round(write_s, 4),
                "digest_check_s": round(check_s, 4),
                "digest_share_of_export": round(write_s / total, 4),
                "bytes": size_of(out / "data"),
            }

        payload = {
            "config": {"seed": 0},
            "state": {"model": {"w": torch.randn(args.checkpoint_params)}},
        }
        plain = root / "plain.pt"
        mine = root / "iter_000001.pt"

        def torch_save() -> None:  # the same atomic, fsynced write, without the digest
            buffer = io.BytesIO()
            torch.save(payload, buffer)
            atomic_write_bytes(plain, buffer.getvalue())

        save = pair(
            median_time(torch_save, args.repeats),
            median_time(lambda: save_checkpoint(mine, payload), args.repeats),
        )
        load = pair(
            median_time(lambda: torch.load(plain, weights_only=True), args.repeats),
            median_time(lambda: load_checkpoint(mine), args.repeats),
        )
        result["checkpoint"] = {
            "params": args.checkpoint_params,
            "bytes": mine.stat().st_size,
            "save": save,
            "load": load,
        }
    write_json(Path(args.out), result)
    print(json_summary(result))
    return 0


def json_summary(result: dict[str, object]) -> str:
    import json

    return json.dumps(result, indent=2)


if __name__ == "__main__":
    raise SystemExit(main())
