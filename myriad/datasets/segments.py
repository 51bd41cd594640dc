"""Rows staged as write-once segment files: the crash-safe part of every streaming writer.

A folder holds ``header.json`` (the row spec) and ``seg_XXXXXXXX.hdf5`` files, one per append.
Each segment is built in memory and written under a temporary name, then renamed, so:

- a process killed at any instant (even mid-append) leaves every earlier segment intact;
- a failed write (a full disk) is an ordinary ``OSError`` from plain file I/O, never HDF5 writing
  to a failing file (which can leave the library in a state that crashes the process);
- cutting back to a checkpoint's row count (resume) rewrites at most one segment.

The writers turn the segments into their format when the dataset is complete.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np

from myriad.datasets.checksums import read_hdf5
from myriad.datasets.schema import ROW_KEYS, DatasetSpec, DatasetWriteError, Rows
from myriad.utils.faults import fault_point
from myriad.utils.ownership import make_partial

_HEADER = "header.json"


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def conform(rows: Rows, spec: DatasetSpec) -> tuple[Rows, int]:
    """Rows cast to the schema's dtypes (shapes must already match); returns ``(rows, N)``."""
    missing = [k for k in ROW_KEYS if k not in rows]
    if missing:
        raise ValueError(f"rows are missing {missing}; every batch needs {list(ROW_KEYS)}")
    n = len(rows["observations"])
    out: Rows = {}
    for key, (shape, dtype) in spec.fields().items():
        value = np.asarray(rows[key])
        if value.shape != (n, *shape):
            raise ValueError(f"rows[{key!r}] has shape {value.shape}, expected {(n, *shape)}")
        out[key] = value.astype(dtype, copy=False)
    return out, n


class RowSegments:
    """A folder of row segments.

    Args:
        folder: where the segments live.
        spec: the rows' schema; its metadata is kept in the header.
        resume_rows: reopen an existing folder and cut it back to this many rows.
        owner: the command that stages the rows; its name is written in the folder's marker
            (:func:`myriad.utils.ownership.make_partial`), and only it replaces the folder.

    Raises:
        FileNotFoundError: resuming a folder that does not exist.
        ValueError: resuming a folder of other rows, or with fewer rows than ``resume_rows``.
    """

    def __init__(
        self,
        folder: str | os.PathLike[str],
        spec: DatasetSpec,
        resume_rows: int | None = None,
        owner: str = "export",
    ) -> None:
        self.folder = Path(folder)
        self.spec = spec
        self.open = True
        self._unsynced: list[Path] = []
        self._segments: list[tuple[Path, int]] = []
        if resume_rows is not None:
            if not self.folder.is_dir():
                raise FileNotFoundError(
                    f"cannot resume the dataset: {self.folder} is missing (was the run folder "
                    "moved or the dataset already finalised?)"
                )
            self._check_header()
            self._segments = self._scan()
            self.truncate(int(resume_rows))
            return
        # A folder left by a killed writer of the same command is replaced; anything else
        # (another command's staged rows, a user's folder) is refused.
        make_partial(self.folder, owner, legacy=legacy_staging if owner == "pretrain" else None)
        header = {
            "obs_dim": spec.obs_dim,
            "action_dim": spec.action_dim,
            "feature_names": list(spec.feature_names),
            "metadata": spec.metadata,
        }
        tmp = self.folder / f".{_HEADER}.tmp"
        tmp.write_text(json.dumps(header, default=str))
        os.replace(tmp, self.folder / _HEADER)

    def __bool__(self) -> bool:
        return self.open

    def _check_header(self) -> None:
        header = json.loads((self.folder / _HEADER).read_text())
        found = (header["obs_dim"], header["action_dim"], tuple(header["feature_names"]))
        wanted = (self.spec.obs_dim, self.spec.action_dim, self.spec.feature_names)
        if found != wanted:
            raise ValueError(
                f"the partial dataset {self.folder} holds rows of (obs_dim, action_dim, "
                f"features) {found}, not {wanted}: it does not belong to this run"
            )
        # The metadata of the run that started the dataset is kept.
        self.spec = DatasetSpec(*wanted, header["metadata"])

    def _scan(self) -> list[tuple[Path, int]]:
        for leftover in self.folder.glob(".seg_*.tmp"):  # a segment whose writer was killed
            leftover.unlink()
        segments = []
        for seg in sorted(self.folder.glob("seg_*.hdf5")):
            with h5py.File(seg, "r") as f:
                segments.append((seg, int(f["observations"].shape[0])))
        return segments

    def _names(self, index: int) -> tuple[Path, Path]:
        return self.folder / f"seg_{index:08d}.hdf5", self.folder / f".seg_{index:08d}.hdf5.tmp"

    def _write(self, index: int, rows: Rows) -> Path:
        final, tmp = self._names(index)
        image = io.BytesIO()
        with h5py.File(image, "w") as f:
            for key in ROW_KEYS:
                f.create_dataset(key, data=rows[key], fletcher32=True)
        try:
            with open(tmp, "wb") as out:
                out.write(image.getbuffer())
            os.replace(tmp, final)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        fault_point("dataset.segment_written")
        self._unsynced.append(final)
        return final

    @property
    def rows(self) -> int:
        return sum(n for _, n in self._segments)

    @property
    def size_bytes(self) -> int:
        return sum(seg.stat().st_size for seg, _ in self._segments)

    def append(self, rows: Rows) -> int:
        """Stage a batch; returns its row count.

        Raises:
            DatasetWriteError: the write failed (a full disk); earlier segments are intact and
                the same batch can be appended again once there is space.
        """
        if not self.open:
            raise ValueError(f"the dataset in {self.folder} is closed")
        rows, n = conform(rows, self.spec)
        if n:
            index = len(self._segments)
            try:
                segment = self._write(index, rows)
            except OSError as exc:
                raise DatasetWriteError(
                    f"writing {n} rows to {self.folder} failed ({exc}); the {self.rows} rows "
                    "written before are intact"
                ) from exc
            self._segments.append((segment, n))
        return n

    def truncate(self, rows: int) -> None:
        """Keep the first ``rows`` rows."""
        if rows > self.rows:
            raise ValueError(
                f"dataset {self.folder} has {self.rows} rows but the checkpoint recorded {rows}: "
                "the file does not belong to this checkpoint"
            )
        kept: list[tuple[Path, int]] = []
        total = 0
        for index, (seg, n) in enumerate(self._segments):
            if total >= rows:
                seg.unlink()
                continue
            if total + n > rows:
                n = rows - total
                seg = self._write(index, self.read(seg, stop=n))
            kept.append((seg, n))
            total += n
        self._segments = kept

    @staticmethod
    def read(seg: Path, stop: int | None = None) -> Rows:
        with h5py.File(seg, "r") as f:
            n = int(f["observations"].shape[0]) if stop is None else stop
            return {k: read_hdf5(f[k], 0, n, seg, k) for k in ROW_KEYS}

    def __iter__(self) -> Iterator[Rows]:
        """Every segment's rows, in order (one segment in memory at a time)."""
        for seg, _ in self._segments:
            yield self.read(seg)

    def flush(self) -> None:
        """Make every segment written so far durable (fsync of the new files and the folder)."""
        if not self.open:
            return
        for path in self._unsynced:
            if path.exists():
                _fsync(path)
        self._unsynced = []
        _fsync(self.folder)

    def close(self) -> None:
        """Stop accepting rows; the folder stays (as a crash would leave it)."""
        self.open = False

    def remove(self) -> None:
        """Delete the folder, segment by segment (a kill midway leaves a folder that a resumed
        run discards: the published file holds its rows)."""
        self.open = False
        for seg, _ in self._segments:
            seg.unlink(missing_ok=True)
            fault_point("dataset.segment_removed")
        shutil.rmtree(self.folder, ignore_errors=True)


def legacy_staging(folder: Path) -> bool:
    """A training run's staging folder written before staging folders carried a marker."""
    return (folder / _HEADER).is_file()


def check_free_space(target: Path, needed: int) -> None:
    """Raise ``OSError`` when the file system of ``target`` has less than ``needed`` bytes free
    (checked before building a finished dataset, so a full disk stops it before it starts)."""
    free = shutil.disk_usage(target if target.exists() else target.parent).free
    if free < needed:
        raise OSError(28, f"{free} bytes free, about {needed} needed", str(target))
