"""Per-chunk checksums of every dataset format, and the reads that check them.

- HDF5 (D4RL layout, and the staging segments): every dataset is written with the Fletcher-32
  filter; HDF5 checks each chunk when it reads it. :func:`read_hdf5` turns a failed check into a
  :class:`CorruptDatasetError` that names the column and the chunk.
- zarr: every array ends its codec chain with CRC32C (``zarr.codecs.Crc32cCodec``); zarr checks
  each chunk when it reads it (:func:`read_zarr`).
- Minari (whose files carry no checksums): ``myriad-digest.json`` beside the dataset's ``data/``
  folder holds a SHA-256 of every 4 MiB block of every file (:func:`write_block_digests`,
  :func:`check_block_digests`).

Datasets written before these checksums, or by other tools, are read as before, with one line
on stderr saying that they are unverified (:func:`note_unverified`).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from myriad.datasets.schema import CorruptDatasetError

DIGEST_FILE = "myriad-digest.json"
BLOCK_BYTES = 4 * 2**20

_noted: set[str] = set()


def note_unverified(path: str | os.PathLike[str], why: str) -> None:
    """Print once per dataset and process: ``path`` carries no checksums."""
    key = str(Path(path).resolve())
    if key not in _noted:
        _noted.add(key)
        print(f"myriad: note: {path} {why}: its rows are read unverified", file=sys.stderr)


def _fix(path: Path | str) -> str:
    return (
        f"the bytes of {path} changed after they were written (a disk or copy error): restore "
        "the dataset from a copy, or write it again (myriad export, or the run that made it)"
    )


def hdf5_checksummed(dataset: Any) -> bool:
    """Whether an h5py dataset carries Fletcher-32 checksums."""
    return bool(dataset.fletcher32)


def read_hdf5(dataset: Any, start: int, stop: int, path: Path | str, column: str) -> np.ndarray:
    """``dataset[start:stop]``; a chunk that fails its Fletcher-32 check raises
    :class:`CorruptDatasetError` naming it.

    Raises:
        CorruptDatasetError: the first bad chunk in ``[start, stop)``.
    """
    try:
        return np.asarray(dataset[start:stop])
    except OSError as exc:
        if "filter" not in str(exc) and "checksum" not in str(exc).lower():
            raise
        bad = _first_bad_chunk(lambda a, b: dataset[a:b], dataset.chunks, start, stop)
        raise CorruptDatasetError(_message(path, column, bad, "Fletcher-32")) from exc


def read_zarr(
    array: Any, start: int | None, stop: int | None, path: Path | str, column: str
) -> Any:
    """``array[start:stop]``; a chunk that fails its CRC32C check raises
    :class:`CorruptDatasetError` naming it."""
    try:
        return np.asarray(array[start:stop])
    except ValueError as exc:
        if "checksum" not in str(exc).lower():
            raise
        lo = 0 if start is None else start
        hi = int(array.shape[0]) if stop is None else stop
        bad = _first_bad_chunk(lambda a, b: array[a:b], array.chunks, lo, hi)
        raise CorruptDatasetError(_message(path, column, bad, "CRC32C")) from exc


def _first_bad_chunk(
    read: Any, chunks: tuple[int, ...] | None, start: int, stop: int
) -> tuple[int, int, int] | None:
    """``(chunk index, first row, end row)`` of the first chunk in ``[start, stop)`` that fails
    to read, or None when each reads alone."""
    size = int(chunks[0]) if chunks else max(1, stop - start)
    first = start // size
    for index in range(first, (max(stop, start + 1) - 1) // size + 1):
        lo, hi = index * size, (index + 1) * size
        try:
            read(lo, hi)
        except (OSError, ValueError):
            return index, lo, hi
    return None


def _message(path: Path | str, column: str, bad: tuple[int, int, int] | None, kind: str) -> str:
    where = f"chunk {bad[0]} (rows {bad[1]}-{bad[2] - 1})" if bad else "a chunk"
    return f"{path}: {column} {where} failed its {kind} checksum; {_fix(path)}"


# -- Minari: a digest file beside the dataset -------------------------------------------------
def _file_blocks(path: Path) -> list[str]:
    digests = []
    with open(path, "rb") as f:
        while block := f.read(BLOCK_BYTES):
            digests.append(hashlib.sha256(block).hexdigest())
    return digests


def write_block_digests(folder: Path, data: str = "data") -> Path:
    """Write ``folder/myriad-digest.json``: a SHA-256 of every block of every file under
    ``folder/data``."""
    root = folder / data
    files = {
        str(p.relative_to(folder)): _file_blocks(p) for p in sorted(root.rglob("*")) if p.is_file()
    }
    record = {"algorithm": "sha256", "block_bytes": BLOCK_BYTES, "files": files}
    target = folder / DIGEST_FILE
    target.write_text(json.dumps(record, indent=1))
    return target


def check_block_digests(folder: Path) -> bool:
    """Check every file listed in ``folder/myriad-digest.json``; returns False when there is
    no digest file (a dataset written before it, or by another tool).

    Raises:
        CorruptDatasetError: naming the first file and block whose bytes differ, a listed file
            that is missing, or an unreadable digest file.
    """
    record_path = folder / DIGEST_FILE
    if not record_path.is_file():
        return False
    try:
        record = json.loads(record_path.read_text())
        files = record["files"]
        block = int(record["block_bytes"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptDatasetError(f"{record_path} is not readable ({exc}); {_fix(folder)}") from exc
    for name, expected in files.items():
        path = folder / name
        if not path.is_file():
            raise CorruptDatasetError(f"{path} is missing; {_fix(folder)}")
        with open(path, "rb") as f:
            for index, digest in enumerate(expected):
                data = f.read(block)
                if hashlib.sha256(data).hexdigest() != digest:
                    first = index * block
                    raise CorruptDatasetError(
                        f"{path}: block {index} (bytes {first}-{first + len(data) - 1}) failed "
                        f"its SHA-256 check; {_fix(folder)}"
                    )
            if f.read(1):
                raise CorruptDatasetError(f"{path} is longer than when written; {_fix(folder)}")
    return True
