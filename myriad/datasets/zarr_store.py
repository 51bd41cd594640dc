"""Zarr v3 datasets in the replay-buffer layout of diffusion-policy code.

Layout (a zarr v3 group; every array chunked along rows, Blosc/zstd-compressed and each chunk
checksummed with CRC32C):

    data/observations [N, O] float32      data/actions [N, A] float32    data/rewards [N] float32
    data/next_observations [N, O]         data/terminals [N] bool        data/timeouts [N] bool
    data/member [N] int32                 data/features [N, p] float32 (attrs: names)
    meta/episode_ends [K] int64           exclusive end row of each episode, increasing;
                                          episode k is rows [episode_ends[k-1], episode_ends[k])
    meta/member [K] int32                 the member that collected episode k
    attrs: layout, complete, feature_names, metadata

Crash safety: the store is written as ``<path>.partial`` and renamed to ``<path>`` by
:meth:`ZarrWriter.close` after ``attrs["complete"]`` is set; readers refuse anything else.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.codecs import BloscCodec, Crc32cCodec
from zarr.core.array_spec import ArrayConfig

from myriad import __version__
from myriad.datasets.checksums import note_unverified, read_zarr
from myriad.datasets.schema import (
    CHUNK_ROWS,
    ROW_KEYS,
    CorruptDatasetError,
    DatasetSpec,
    DatasetWriteError,
    IncompleteDatasetError,
    Rows,
    episode_ends,
    partial_path,
)
from myriad.datasets.segments import conform
from myriad.utils.ownership import PARTIAL_MARKER, make_partial

LAYOUT = "myriad-replay-buffer"


def _compressors() -> tuple[BloscCodec | Crc32cCodec, ...]:
    """Blosc/zstd, then a CRC32C of each compressed chunk: a chunk whose bytes change fails its
    checksum when read, before it is decompressed."""
    return (BloscCodec(cname="zstd", clevel=3, shuffle="bitshuffle"), Crc32cCodec())


#: Every chunk is stored, even one that holds only the fill value (zarr skips those by
#: default), so a missing chunk file is a lost chunk, never zeros read as data.
_STORED = ArrayConfig(order="C", write_empty_chunks=True)


def _array(group: zarr.Group, key: str, path: Path) -> zarr.Array:
    """The array ``group[key]``: zarr types a group's member as an array or a group.

    Raises:
        IncompleteDatasetError: ``key`` is missing or not an array (the store is not in this
            layout).
    """
    node = group.get(key)
    if not isinstance(node, zarr.Array):
        raise IncompleteDatasetError(f"{path} is not a {LAYOUT} store: it has no array {key}")
    return node


def _rows(array: zarr.Array, start: int | None = None, stop: int | None = None) -> np.ndarray:
    """Rows ``[start, stop)`` of ``array`` (zarr types a read as a scalar or an array); a chunk
    that fails its CRC32C check raises :class:`CorruptDatasetError` naming it."""
    return read_zarr(array, start, stop, str(array.store_path), array.path)


def missing_chunk(path: Path, name: str, array: zarr.Array) -> None:
    """Raise :class:`CorruptDatasetError` for the first chunk file of ``array`` (stored at
    ``path / name``) that is missing: every chunk is written (:data:`_STORED`), and zarr would
    read a missing one as fill values."""
    rows = int(array.shape[0])
    step = int(array.chunks[0])
    if 0 in array.shape[1:]:  # rows of width 0 (no features): zarr stores no chunk
        return
    folder = path / name / "c"
    stored = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
    for index in range(-(-rows // step)):
        if str(index) not in stored:
            last = min((index + 1) * step, rows) - 1
            raise CorruptDatasetError(
                f"{path}: {name} chunk {index} (rows {index * step}-{last}) is missing; restore "
                "the store from a copy, or export it again"
            )


def checksummed(array: zarr.Array) -> bool:
    """Whether the chunks of ``array`` carry CRC32C checksums."""
    return any(isinstance(c, Crc32cCodec) for c in array.compressors)


class ZarrWriter:
    """Append-only, crash-safe writer of a zarr v3 replay buffer (a :class:`DatasetWriter`).

    Args:
        path: the store's final folder (conventionally ``*.zarr``).
        spec: row schema and metadata.
        chunk_rows: rows per chunk.

    Rows may end inside an episode; the episode is recorded in ``meta/`` when its last row
    arrives. :meth:`close` with ``complete=True`` refuses rows that end inside an episode, since
    the layout has no place for them.
    """

    def __init__(
        self, path: str | os.PathLike[str], spec: DatasetSpec, chunk_rows: int = CHUNK_ROWS
    ) -> None:
        self.path = Path(path)
        self.tmp = partial_path(self.path)
        self.spec = spec
        if self.path.exists():
            raise FileExistsError(f"{self.path} exists; remove it or choose another --out")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        make_partial(self.tmp, "export")  # replaces only a store an earlier export left
        self.root = zarr.open_group(self.tmp, mode="a", zarr_format=3)
        data, meta = self.root.create_group("data"), self.root.create_group("meta")
        self.arrays: dict[str, Any] = {}
        for key, (shape, dtype) in spec.fields().items():
            self.arrays[key] = data.create_array(
                key,
                shape=(0, *shape),
                chunks=(chunk_rows, *shape),
                dtype=dtype,
                compressors=_compressors(),
                config=_STORED,
            )
        self.arrays["features"].attrs["names"] = list(spec.feature_names)
        self.ends = meta.create_array(
            "episode_ends",
            shape=(0,),
            chunks=(chunk_rows,),
            dtype="int64",
            compressors=_compressors(),
            config=_STORED,
        )
        self.episode_member = meta.create_array(
            "member",
            shape=(0,),
            chunks=(chunk_rows,),
            dtype="int32",
            compressors=_compressors(),
            config=_STORED,
        )
        self.root.attrs.update(
            {
                "layout": LAYOUT,
                "complete": False,
                "feature_names": list(spec.feature_names),
                "metadata": {"myriad_version": __version__, **spec.metadata},
            }
        )
        self._rows = 0
        self._episodes = 0
        self._open = True

    @property
    def rows(self) -> int:
        return self._rows

    def append(self, rows: Rows) -> None:
        """Append a batch of rows (schema in :mod:`myriad.datasets.schema`).

        Raises:
            DatasetWriteError: the write failed; every array is cut back to the rows and episodes
                appended before, which stay intact.
        """
        if not self._open:
            raise ValueError(f"the writer of {self.path} is closed")
        rows, n = conform(rows, self.spec)
        if n == 0:
            return
        start, episodes = self._rows, self._episodes
        local_ends = episode_ends(rows["terminals"], rows["timeouts"])
        try:
            for key in ROW_KEYS:
                self.arrays[key].append(rows[key], axis=0)
            if len(local_ends):
                self.ends.append(local_ends + start)
                self.episode_member.append(rows["member"][local_ends - 1].astype(np.int32))
        except OSError as exc:
            self._rollback(start, episodes)
            raise DatasetWriteError(
                f"writing {n} rows to {self.tmp} failed ({exc}); the {start} rows written before "
                "are intact."
            ) from exc
        self._rows, self._episodes = start + n, episodes + len(local_ends)

    def _rollback(self, rows: int, episodes: int) -> None:
        for array in self.arrays.values():
            array.resize((rows, *array.shape[1:]))
        self.ends.resize((episodes,))
        self.episode_member.resize((episodes,))

    def close(self, complete: bool = True) -> Path:
        """Close; when ``complete``, mark the store and move it to its final name.

        Raises:
            ValueError: ``complete`` while the last rows end inside an episode.
        """
        if not self._open:
            return self.path if complete and self.path.exists() else self.tmp
        if complete:
            last_end = int(_rows(self.ends, -1)[0]) if self._episodes else 0
            if last_end != self._rows:
                raise ValueError(
                    f"the last {self._rows - last_end} rows end inside an episode (no terminal "
                    "or timeout): the replay-buffer layout needs whole episodes"
                )
            self.root.attrs["complete"] = True
        self._open = False
        if complete:
            (self.tmp / PARTIAL_MARKER).unlink(missing_ok=True)
            os.replace(self.tmp, self.path)
            return self.path
        return self.tmp


class ZarrReader:
    """Streaming reader of a finished zarr replay buffer (a :class:`DatasetReader`).

    Raises:
        IncompleteDatasetError: only the partial store exists, or it is not marked complete.
    """

    format = "zarr"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.exists() and partial_path(self.path).exists():
            raise IncompleteDatasetError(
                f"{self.path} was not completed: only {partial_path(self.path)} exists"
            )
        try:
            self.root = zarr.open_group(self.path, mode="r")
        except (ValueError, KeyError, TypeError) as exc:  # zarr's errors are ValueErrors
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise CorruptDatasetError(
                f"{self.path} is not a readable zarr store ({reason}): export it again from its "
                "source (myriad export RUN --format zarr) or restore it from a copy"
            ) from exc
        attrs = self.root.attrs.asdict()
        if not attrs.get("complete", False):
            raise IncompleteDatasetError(
                f"{self.path} is not marked complete: its writer did not finish"
            )
        data = self.root.get("data")
        if not isinstance(data, zarr.Group):
            raise IncompleteDatasetError(f"{self.path} is not a {LAYOUT} store: it has no data/")
        self.arrays = {k: _array(data, k, self.path) for k in ROW_KEYS}
        if not all(checksummed(a) for a in self.arrays.values()):
            note_unverified(self.path, "has no chunk checksums (written by an older myriad)")
        else:
            for key, array in self.arrays.items():
                missing_chunk(self.path, f"data/{key}", array)
        feature_names = attrs.get("feature_names", [])
        metadata = attrs.get("metadata", {})
        if not isinstance(feature_names, list) or not isinstance(metadata, dict):
            raise IncompleteDatasetError(
                f"{self.path} is not a {LAYOUT} store: its attributes feature_names and metadata "
                "are not a list and an object"
            )
        self.spec = DatasetSpec(
            int(self.arrays["observations"].shape[1]),
            int(self.arrays["actions"].shape[1]),
            tuple(str(name) for name in feature_names),
            dict(metadata),
        )

    @property
    def num_rows(self) -> int:
        return int(self.arrays["observations"].shape[0])

    def episode_ends(self) -> np.ndarray:
        """``meta/episode_ends``, ``[K]`` int64."""
        return _rows(_array(self.root, "meta/episode_ends", self.path))

    def read(self, start: int, stop: int) -> Rows:
        """Rows ``[start, stop)``."""
        return {
            k: read_zarr(a, start, stop, self.path, f"data/{k}") for k, a in self.arrays.items()
        }

    def iter_chunks(self, chunk_rows: int = CHUNK_ROWS) -> Iterator[Rows]:
        for start in range(0, self.num_rows, chunk_rows):
            yield self.read(start, min(start + chunk_rows, self.num_rows))

    def close(self) -> None:
        """Nothing to release (zarr reads files on demand)."""

    def __enter__(self) -> ZarrReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
