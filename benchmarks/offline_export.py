"""Export speed and size on disk: a pretraining run's dataset to each format, streaming.

    python benchmarks/offline_export.py RUN [--formats hdf5 zarr minari] [--chunk-rows 16384]

Also times ``load`` (whole dataset into memory), ``dataset info`` and ``dataset validate`` on the
source. Writes ``benchmarks/results/offline_export.json``.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from myriad.bench.common import write_json
from myriad.datasets import dataset_info, export, load, validate
from myriad.datasets.formats import open_reader
from myriad.datasets.schema import disk_size
from myriad.utils.optional import available

RESULTS = Path(__file__).parent / "results"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("run", help="pretraining run folder or dataset")
    p.add_argument("--formats", nargs="+", default=["hdf5", "zarr", "minari"])
    p.add_argument("--chunk-rows", type=int, default=16384)
    p.add_argument("--out", default=str(RESULTS / "offline_export.json"))
    args = p.parse_args(argv)

    reader = open_reader(args.run)
    source, rows = Path(reader.path), reader.num_rows
    reader.close()
    result: dict[str, object] = {
        "source": str(source),
        "rows": rows,
        "source_bytes": disk_size(source),
        "source_mib": disk_size(source) / 2**20,
        "chunk_rows": args.chunk_rows,
        "formats": {},
    }
    timings: dict[str, float] = {}
    for name, fn in (
        ("load_s", lambda: load(args.run)),
        ("info_s", lambda: dataset_info(args.run)),
        ("validate_s", lambda: validate(source)),
    ):
        t = time.perf_counter()
        fn()
        timings[name] = time.perf_counter() - t
    result.update(timings)
    with tempfile.TemporaryDirectory(dir=source.parent) as tmp:
        for fmt in args.formats:
            if fmt == "minari" and not available("minari"):
                continue
            out = Path(tmp) / {"hdf5": "t.hdf5", "zarr": "t.zarr", "minari": "minari"}[fmt]
            r = export(args.run, fmt, out, chunk_rows=args.chunk_rows)
            result["formats"][fmt] = {  # type: ignore[index]
                "seconds": r.seconds,
                "rows_per_s": r.rows / r.seconds,
                "bytes": disk_size(r.path),
                "mib": disk_size(r.path) / 2**20,
                "ratio_to_source": disk_size(r.path) / disk_size(source),
            }
            rate = r.rows / r.seconds
            size = disk_size(r.path) / 2**20
            print(f"{fmt:7s} {r.rows:,} rows {r.seconds:.1f} s ({rate:,.0f} rows/s) {size:.0f} MiB")
            shutil.rmtree(out, ignore_errors=True) if out.is_dir() else out.unlink()
    print(
        f"load {timings['load_s']:.1f} s, info {timings['info_s']:.1f} s, "
        f"validate {timings['validate_s']:.1f} s for {rows:,} rows"
    )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_json(args.out, result)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
