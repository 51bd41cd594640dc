"""One entry point per direction: :func:`open_reader` detects a dataset's format, and
:func:`open_writer` builds the writer of a format. Every reader streams rows in chunks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

from omegaconf import OmegaConf

from myriad.datasets.hdf5 import D4RLWriter, HDF5Reader, partial_path
from myriad.datasets.schema import (
    CHUNK_ROWS,
    DatasetSpec,
    DatasetWriter,
    IncompleteDatasetError,
    Rows,
)

FORMATS = ("hdf5", "zarr", "minari")


class DatasetReader(Protocol):
    """Streaming access to a finished dataset."""

    format: str
    path: Path
    spec: DatasetSpec

    @property
    def num_rows(self) -> int: ...

    def iter_chunks(self, chunk_rows: int = CHUNK_ROWS) -> Iterator[Rows]:
        """Consecutive batches of rows, in order, about ``chunk_rows`` at a time."""
        ...

    def close(self) -> None: ...


def run_dataset(run: Path) -> Path:
    """The dataset file of a pretraining run folder (``dataset.path`` of its config)."""
    rel = "dataset/transitions.hdf5"
    config = run / "config.yaml"
    if config.is_file():
        from myriad.utils.digest import read_config_text

        cfg = OmegaConf.create(read_config_text(config))
        rel = str(OmegaConf.select(cfg, "dataset.path", default=None) or rel)
    return run / rel


def detect_format(path: str | os.PathLike[str]) -> str:
    """``"hdf5"``, ``"zarr"`` or ``"minari"`` from what is on disk at ``path``.

    Raises:
        IncompleteDatasetError: only the partial data of an unfinished writer exists.
        FileNotFoundError: nothing recognisable at ``path``.
    """
    path = Path(path)
    if path.is_file():
        return "hdf5"
    if path.is_dir():
        if (path / "zarr.json").is_file():
            return "zarr"
        if (path / "data" / "metadata.json").is_file() or (path / "metadata.json").is_file():
            return "minari"
    for partial in (partial_path(path), path.parent / f".{path.name}.partial"):
        if partial.exists():
            raise IncompleteDatasetError(f"{path} was not completed: only {partial} exists")
    raise FileNotFoundError(
        f"no dataset at {path}: expected a D4RL-layout .hdf5 file, a zarr store, a Minari "
        "dataset folder or a pretraining run folder"
    )


def open_reader(path: str | os.PathLike[str]) -> DatasetReader:
    """A streaming reader of the dataset at ``path`` (any format, or a pretraining run folder).

    Raises:
        IncompleteDatasetError: the dataset's writer did not finish.
        FileNotFoundError: nothing recognisable at ``path``.
    """
    path = Path(path)
    if path.is_dir() and (path / "config.yaml").is_file() and not (path / "zarr.json").exists():
        path = run_dataset(path)
    fmt = detect_format(path)
    if fmt == "hdf5":
        return HDF5Reader(path)
    if fmt == "zarr":
        from myriad.datasets.zarr_store import ZarrReader

        return ZarrReader(path)
    from myriad.datasets.minari_store import MinariReader

    return MinariReader(path)


def open_writer(
    fmt: str,
    path: str | os.PathLike[str],
    spec: DatasetSpec,
    *,
    dataset_id: str | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> DatasetWriter:
    """A writer of ``fmt`` at ``path``.

    Args:
        fmt: ``"hdf5" | "zarr" | "minari"``.
        path: the file (hdf5), the store folder (zarr) or the Minari datasets root (minari).
        spec: row schema and metadata.
        dataset_id: Minari id (required for ``"minari"``).
        chunk_rows: chunk length of the stored arrays.
    """
    if fmt == "hdf5":
        if Path(path).exists():
            raise FileExistsError(f"{path} exists; remove it or choose another --out")
        return D4RLWriter(
            path,
            spec.obs_dim,
            spec.action_dim,
            spec.feature_names,
            metadata=spec.metadata,
            chunk_rows=chunk_rows,
        )
    if fmt == "zarr":
        from myriad.datasets.zarr_store import ZarrWriter

        return ZarrWriter(path, spec, chunk_rows=chunk_rows)
    if fmt == "minari":
        from myriad.datasets.minari_store import MinariWriter

        if not dataset_id:
            raise ValueError("a Minari dataset needs an id, e.g. myriad/nav-maze/kmyriad-v0")
        return MinariWriter(dataset_id, spec, root=path, flush_rows=chunk_rows)
    raise ValueError(f"unknown format {fmt!r}; choose one of {FORMATS}")
