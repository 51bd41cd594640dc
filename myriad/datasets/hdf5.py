"""D4RL-layout HDF5 datasets, written in chunks while training runs.

Layout of the finished file (one row per transition, episodes contiguous):

    observations [N, O] float32      actions [N, A] float32     rewards [N] float32
    next_observations [N, O]         terminals [N] bool         timeouts [N] bool
    infos/member [N] int32           infos/<feature> [N] float32 (entropy features of
                                                                 the observation's state)
    metadata/*  attributes: env, config, myriad version, population size, seed, ...

Every dataset is chunked along rows, LZF-compressed and checksummed per chunk (Fletcher-32):
HDF5 checks a chunk each time it reads it, and a failed check names the column and chunk
(:mod:`myriad.datasets.checksums`).

Crash safety: while the writer runs, rows live in ``<path>.partial/``, a folder of write-once
segment files, one per :meth:`D4RLWriter.append`. A segment is written under a temporary name and
renamed when complete, so a process killed at any instant (even mid-append) leaves every segment
renamed before it intact; HDF5 files modified in place have no such guarantee. :meth:`close`
copies the segments, in order, into ``<path>`` (``attrs["complete"] = True``) through a temporary
file and a rename. A reader that finds only ``<path>.partial`` knows the run did not finish. A
resumed run reopens the folder and cuts it back to the row count recorded in its checkpoint, so no
row is duplicated or lost. A writer given ``base_rows`` extends the finished file already at
``<path>``: the new file holds those rows followed by the staged ones, and replaces the old one only
once it is complete.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from myriad import __version__
from myriad.datasets.checksums import hdf5_checksummed, note_unverified, read_hdf5
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
from myriad.utils.faults import fault_point

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
        base_rows: the finished file at ``path`` holds this many rows that come before the
            staged ones (a run extended after it finished); 0: the staged rows are all.
        owner: the command that writes the file (``"pretrain"`` for a run's own dataset,
            ``"export"``); only it may replace a staging folder left at ``path + ".partial"``.

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
        base_rows: int = 0,
        owner: str = "export",
    ) -> None:
        self.path = Path(path)
        self.base_rows = int(base_rows)
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
        self.file = RowSegments(self.tmp, spec, resume_rows=resume_rows, owner=owner)

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

    def close(self, complete: bool = True, run_iteration: int | None = None) -> Path:
        """Close; when ``complete``, write the finished file and remove the staged rows.

        ``run_iteration`` is stored as ``attrs["run_iteration"]``: the training iteration the
        file was finished at, by which a resumed run knows the file already holds its rows.

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
            base_bytes = self.path.stat().st_size if self.base_rows else 0
            check_free_space(self.path.parent, self.file.size_bytes + base_bytes)
            self._write_final(tmp, run_iteration)
            fault_point("dataset.final_written")
            os.replace(tmp, self.path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise DatasetWriteError(
                f"writing {self.path} failed ({exc}); all {self.rows} rows are kept in {self.tmp}"
            ) from exc
        fault_point("dataset.published")
        self.file.remove()
        return self.path

    def _base_chunks(self) -> Iterator[Rows]:
        """The first ``base_rows`` rows of the finished file being extended."""
        if not self.base_rows:
            return
        with HDF5Reader(self.path) as base:
            if base.num_rows < self.base_rows:
                raise DatasetWriteError(
                    f"{self.path} holds {base.num_rows} rows, fewer than the {self.base_rows} "
                    "this run recorded before: it was replaced; restore it"
                )
            for start in range(0, self.base_rows, self.chunk_rows):
                yield base.read(start, min(start + self.chunk_rows, self.base_rows))

    def _write_final(self, target: Path, run_iteration: int | None = None) -> None:
        total = self.base_rows + self.rows
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
                    fletcher32=True,  # a checksum per chunk, checked by every read
                )
            meta = f.create_group("metadata")
            for key, value in self.spec.metadata.items():
                meta.attrs[key] = metadata_attr(value)
            f.attrs["layout"] = "d4rl"
            f.attrs["complete"] = False
            if run_iteration is not None:
                f.attrs["run_iteration"] = int(run_iteration)
            start = 0
            for rows in itertools.chain(self._base_chunks(), self.file):
                n = len(rows["rewards"])
                for key, value in _columns(rows, self.feature_names).items():
                    f[key][start : start + n] = value
                start += n
            f.attrs["complete"] = True


def open_hdf5(path: Path | str) -> h5py.File:
    """Open an HDF5 file for reading.

    Raises:
        IncompleteDatasetError: the file is not readable HDF5 (truncated or another format).
    """
    try:
        return h5py.File(path, "r")
    except OSError as exc:
        raise IncompleteDatasetError(
            f"{path} is not a readable HDF5 file (truncated or of another format): {exc}"
        ) from exc


def is_complete(f: h5py.File) -> bool:
    """Whether a file's writer finished. myriad's writer sets ``attrs["complete"]`` False when it
    starts and True when it ends; a file without the attribute was written by another tool,
    which wrote it whole."""
    return bool(f.attrs.get("complete", True))


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
        self.file = open_hdf5(self.path)
        if not is_complete(self.file):
            self.file.close()
            raise IncompleteDatasetError(
                f"{self.path} is not marked complete: its writer did not finish"
            )
        missing = [k for k in CORE_KEYS if k not in self.file]
        if missing:
            self.file.close()
            raise IncompleteDatasetError(
                f"{self.path} is not a D4RL-layout dataset: it has no {', '.join(missing)}"
            )
        # Files written by other tools may lack infos/ and metadata/ (no members, no features).
        infos = self.file.get("infos", {})
        # Only per-row columns are features: other tools nest groups or store other shapes.
        rows_total = int(self.file["observations"].shape[0])
        names = tuple(
            k
            for k, v in infos.items()
            if k != "member" and isinstance(v, h5py.Dataset) and v.shape == (rows_total,)
        )
        meta_group = self.file.get("metadata")
        metadata = decode_metadata(dict(meta_group.attrs)) if meta_group is not None else {}
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
        #: Every column this reader reads.
        self.columns = [*CORE_KEYS, *(f"infos/{n}" for n in ("member", *names) if n in infos)]
        if not all(hdf5_checksummed(self.file[k]) for k in self.columns):
            note_unverified(
                self.path, "has no checksums (written by an older myriad or another tool)"
            )

    @property
    def num_rows(self) -> int:
        return int(self.file["observations"].shape[0])

    def read(self, start: int, stop: int) -> Rows:
        """Rows ``[start, stop)``."""
        f = self.file

        def column(key: str) -> np.ndarray:
            return read_hdf5(f[key], start, stop, self.path, key)

        rows = {k: column(k) for k in CORE_KEYS}
        n = len(rows["observations"])
        rows["member"] = column("infos/member") if "infos/member" in f else np.zeros(n, np.int32)
        feats = [column(f"infos/{name}") for name in self.spec.feature_names]
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
    with open_hdf5(path) as f:
        if not is_complete(f):
            raise IncompleteDatasetError(
                f"{path} is not marked complete: its writer did not finish"
            )
        n = int(f["observations"].shape[0])
        data: dict[str, Any] = {k: read_hdf5(f[k], 0, n, path, k) for k in CORE_KEYS}
        infos = f.get("infos", {})
        data["infos"] = {
            k: read_hdf5(v, 0, n, path, f"infos/{k}")
            for k, v in infos.items()
            if isinstance(v, h5py.Dataset)
        }
        data["metadata"] = dict(f["metadata"].attrs) if "metadata" in f else {}
    return data
