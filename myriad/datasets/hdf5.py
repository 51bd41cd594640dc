"""D4RL-layout HDF5 datasets, written in chunks while training runs.

Layout of the finished file (one row per transition, episodes contiguous):

    observations [N, O] float32      actions [N, A] float32     rewards [N] float32
    next_observations [N, O]         terminals [N] bool         timeouts [N] bool
    infos/member [N] int32           infos/<feature> [N] float32 (entropy features of
                                                                 the observation's state)
    metadata/*  attributes: env, config, myriad version, population size, seed, ...

Crash safety: while the writer runs, rows live in ``<path>.partial/``, a folder of write-once
segment files, one per :meth:`D4RLWriter.append`. A segment is written under a temporary name and
renamed when complete, so a process killed at any instant (even mid-append) leaves every segment
renamed before it intact; HDF5 files modified in place have no such guarantee. :meth:`close`
copies the segments, in order, into ``<path>`` (``attrs["complete"] = True``) through a temporary
file and a rename. A reader that finds only ``<path>.partial`` knows the run did not finish. A
resumed run reopens the folder and cuts it back to the row count recorded in its checkpoint, so no
row is duplicated or lost.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from myriad import __version__
from myriad.datasets.schema import (
    CHUNK_ROWS,
    DatasetSpec,
    DatasetWriteError,
    IncompleteDatasetError,
    Rows,
    decode_metadata,
    metadata_attr,
    partial_path,
)
from myriad.datasets.segments import RowSegments, check_free_space

CORE_KEYS = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")

__all__ = [
    "CHUNK_ROWS",
    "CORE_KEYS",
    "D4RLWriter",
    "DatasetWriteError",
    "HDF5Reader",
    "partial_path",
    "read_d4rl",
]


def _columns(rows: Rows, feature_names: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Row batch -> D4RL column name -> array."""
    columns = {k: rows[k] for k in CORE_KEYS}
    columns["infos/member"] = rows["member"]
    for i, name in enumerate(feature_names):
        columns[f"infos/{name}"] = rows["features"][:, i]
    return columns


class D4RLWriter:
    """Append-only, crash-safe writer of a D4RL-layout HDF5 file (a :class:`DatasetWriter`).

    Args:
        path: final file path (``.hdf5``); rows are staged in ``path + ".partial"``.
        obs_dim, action_dim: row widths.
        feature_names: entropy-feature names, stored as ``infos/<name>``.
        metadata: stored under ``metadata/`` as attributes (JSON for non-scalars).
        resume_rows: reopen an existing partial dataset and cut it to this many rows
            (the count saved in the checkpoint being resumed).
        chunk_rows: HDF5 chunk length of the finished file.

    ``file`` is the handle on the staged rows: ``file.flush()`` makes them durable (the runner
    calls it when it saves a checkpoint).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        obs_dim: int,
        action_dim: int,
        feature_names: tuple[str, ...],
        metadata: dict[str, Any] | None = None,
        resume_rows: int | None = None,
        chunk_rows: int = CHUNK_ROWS,
    ) -> None:
        self.path = Path(path)
        self.tmp = partial_path(self.path)
        self.feature_names = tuple(feature_names)
        self.chunk_rows = int(chunk_rows)
        spec = DatasetSpec(
            int(obs_dim),
            int(action_dim),
            self.feature_names,
            # The feature order is kept explicitly: HDF5 lists infos/* alphabetically.
            {
                "myriad_version": __version__,
                "feature_names": list(self.feature_names),
                **(metadata or {}),
            },
        )
        if resume_rows is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.file = RowSegments(self.tmp, spec, resume_rows=resume_rows)

    @property
    def spec(self) -> DatasetSpec:
        return self.file.spec

    @property
    def rows(self) -> int:
        return self.file.rows

    def append(self, rows: Rows) -> None:
        """Append ``N`` rows: ``observations [N, O]``, ..., ``member [N]``, ``features [N, p]``.

        Raises:
            DatasetWriteError: the write failed; the rows appended before are intact.
        """
        self.file.append(rows)

    def close(self, complete: bool = True) -> Path:
        """Close; when ``complete``, write the finished file and remove the staged rows.

        Raises:
            DatasetWriteError: the finished file could not be written; the staged rows are
                kept.
        """
        if not self.file:
            return self.path if complete and self.path.exists() else self.tmp
        self.file.close()
        if not complete:
            return self.tmp
        tmp = self.tmp / ".final.hdf5.tmp"
        try:
            check_free_space(self.path.parent, self.file.size_bytes)
            self._write_final(tmp)
            os.replace(tmp, self.path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DatasetWriteError(
                f"writing {self.path} failed ({exc}); all {self.rows} rows are kept in "
                f"{self.tmp}. Free disk space and finish it with D4RLWriter(..., "
                f"resume_rows={self.rows}).close()"
            ) from exc
        self.file.remove()
        return self.path

    def _write_final(self, target: Path) -> None:
        total = self.rows
        fields = self.spec.fields()
        specs = {k: fields[k] for k in CORE_KEYS}
        specs["infos/member"] = fields["member"]
        specs.update({f"infos/{name}": ((), np.dtype(np.float32)) for name in self.feature_names})
        with h5py.File(target, "w") as f:
            for key, (shape, dtype) in specs.items():
                f.create_dataset(
                    key,
                    shape=(total, *shape),
                    maxshape=(None, *shape),
                    dtype=dtype,
                    chunks=(max(1, min(self.chunk_rows, total)), *shape),
                    compression="lzf",
                )
            meta = f.create_group("metadata")
            for key, value in self.spec.metadata.items():
                meta.attrs[key] = metadata_attr(value)
            f.attrs["layout"] = "d4rl"
            f.attrs["complete"] = False
            start = 0
            for rows in self.file:
                n = len(rows["rewards"])
                for key, value in _columns(rows, self.feature_names).items():
                    f[key][start : start + n] = value
                start += n
            f.attrs["complete"] = True


class HDF5Reader:
    """Streaming reader of a finished D4RL-layout file (a :class:`DatasetReader`).

    Raises:
        IncompleteDatasetError: only the partial dataset exists, or the file is not marked
            complete.
    """

    format = "hdf5"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.exists() and partial_path(self.path).exists():
            raise IncompleteDatasetError(
                f"{self.path} was not completed: only {partial_path(self.path)} exists"
            )
        self.file = h5py.File(self.path, "r")
        if not self.file.attrs.get("complete", False):
            self.file.close()
            raise IncompleteDatasetError(
                f"{self.path} is not marked complete: its writer did not finish"
            )
        infos = self.file["infos"]
        names = tuple(k for k in infos if k != "member")
        metadata = decode_metadata(dict(self.file["metadata"].attrs))
        # The writer stores features in the order of metadata["feature_names"]; HDF5 lists
        # group members alphabetically.
        order = metadata.get("feature_names")
        if isinstance(order, list) and sorted(order) == sorted(names):
            names = tuple(order)
        self.spec = DatasetSpec(
            int(self.file["observations"].shape[1]),
            int(self.file["actions"].shape[1]),
            names,
            metadata,
        )

    @property
    def num_rows(self) -> int:
        return int(self.file["observations"].shape[0])

    def read(self, start: int, stop: int) -> Rows:
        """Rows ``[start, stop)``."""
        f = self.file
        rows = {k: f[k][start:stop] for k in CORE_KEYS}
        rows["member"] = f["infos/member"][start:stop]
        n = len(rows["observations"])
        feats = [f[f"infos/{name}"][start:stop] for name in self.spec.feature_names]
        rows["features"] = np.stack(feats, axis=1) if feats else np.zeros((n, 0), np.float32)
        return rows

    def iter_chunks(self, chunk_rows: int = CHUNK_ROWS) -> Iterator[Rows]:
        """Consecutive batches of at most ``chunk_rows`` rows, in order."""
        for start in range(0, self.num_rows, chunk_rows):
            yield self.read(start, min(start + chunk_rows, self.num_rows))

    def close(self) -> None:
        self.file.close()

    def __enter__(self) -> HDF5Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_d4rl(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a D4RL-layout file into NumPy arrays (``infos/*`` and ``metadata`` nested).

    Raises:
        ValueError: the file was not completed (a crashed or running writer).
    """
    path = Path(path)
    if not path.exists() and partial_path(path).exists():
        raise IncompleteDatasetError(f"{path} was not completed: only {partial_path(path)} exists")
    with h5py.File(path, "r") as f:
        if not f.attrs.get("complete", False):
            raise IncompleteDatasetError(
                f"{path} is not marked complete: its writer did not finish"
            )
        data: dict[str, Any] = {k: f[k][()] for k in CORE_KEYS}
        data["infos"] = {k: v[()] for k, v in f["infos"].items()}
        data["metadata"] = dict(f["metadata"].attrs)
    return data
