"""The transition-row schema shared by every dataset format, and the writer interface.

A *row* is one transition. A batch of ``N`` rows is a dict of arrays:

    observations [N, O] float32       actions [N, A] float32       rewards [N] float32
    next_observations [N, O] float32  terminals [N] bool           timeouts [N] bool
    member [N] int32 (the policy that acted)
    features [N, p] float32 (entropy features of the observation's state, named by the spec)

Rows are episode-contiguous: an episode's transitions follow each other in time order, and its
last row has ``terminals`` or ``timeouts`` set. Inside an episode,
``next_observations[i] == observations[i + 1]``.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

Rows = dict[str, np.ndarray]
ROW_KEYS = (
    "observations",
    "actions",
    "rewards",
    "next_observations",
    "terminals",
    "timeouts",
    "member",
    "features",
)
# Rows read or written per step of a streaming copy: bounded memory whatever the dataset size.
CHUNK_ROWS = 16384


class DatasetWriteError(OSError):
    """Writing the dataset failed (e.g. a full disk); rows written so far stay readable."""


class CorruptDatasetError(ValueError):
    """A chunk of a dataset failed its checksum: its bytes changed after it was written. The
    message names the file, the column and the chunk."""


class IncompleteDatasetError(ValueError):
    """The dataset's writer did not finish (it crashed or is still running)."""


@dataclass(frozen=True)
class DatasetSpec:
    """What every row of a dataset looks like, plus free-form metadata.

    Attributes:
        obs_dim: ``O``.
        action_dim: ``A``.
        feature_names: names of the ``p`` entropy features (e.g. ``("x", "y")``).
        metadata: env name and options, config, population size, seed, ... (JSON-serialisable).
    """

    obs_dim: int
    action_dim: int
    feature_names: tuple[str, ...]
    metadata: dict[str, Any] = field(default_factory=dict)

    def fields(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """``key -> (trailing shape, dtype)`` of every row key."""
        return row_fields(self.obs_dim, self.action_dim, len(self.feature_names))

    def empty(self) -> Rows:
        """Zero rows with the right shapes and dtypes."""
        return {k: np.zeros((0, *shape), dtype) for k, (shape, dtype) in self.fields().items()}

    def env_config(self) -> dict[str, Any] | None:
        """The run-config ``env`` section of the env that collected the rows (name, options and
        the module that registers it), or None when the metadata names no env."""
        name = self.metadata.get("env")
        if not isinstance(name, str):
            return None
        config = self.metadata.get("config")
        saved = config.get("env") if isinstance(config, dict) else None
        module = saved.get("module") if isinstance(saved, dict) else None
        options = dict(self.metadata.get("env_options") or {})
        return {"name": name, "options": options, "module": module}


def row_fields(
    obs_dim: int, action_dim: int, num_features: int
) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """``key -> (trailing shape, dtype)`` of the row schema."""
    f32, flag = np.dtype(np.float32), np.dtype(np.bool_)
    return {
        "observations": ((obs_dim,), f32),
        "actions": ((action_dim,), f32),
        "rewards": ((), f32),
        "next_observations": ((obs_dim,), f32),
        "terminals": ((), flag),
        "timeouts": ((), flag),
        "member": ((), np.dtype(np.int32)),
        "features": ((num_features,), f32),
    }


def concat_rows(parts: list[Rows], spec: DatasetSpec) -> Rows:
    """Concatenate batches (an empty list gives zero rows)."""
    if not parts:
        return spec.empty()
    return {k: np.concatenate([p[k] for p in parts]) for k in ROW_KEYS}


def take_rows(rows: Rows, index: slice | np.ndarray) -> Rows:
    """The rows selected by a slice, a bool mask or indices."""
    return {k: v[index] for k, v in rows.items()}


def episode_ends(terminals: np.ndarray, timeouts: np.ndarray) -> np.ndarray:
    """Exclusive end index of every episode that ends in these rows, ``[K]`` int64.

    Args:
        terminals, timeouts: ``[N]`` bool.
    """
    return np.flatnonzero(terminals | timeouts).astype(np.int64) + 1


@runtime_checkable
class DatasetWriter(Protocol):
    """Append-only, crash-safe writer of one dataset.

    Rows go to a temporary location; :meth:`close` with ``complete=True`` publishes the dataset
    under its final name. A failed write raises :class:`DatasetWriteError` and leaves every row
    appended before it intact.
    """

    path: Path

    @property
    def spec(self) -> DatasetSpec:
        """Row schema and metadata (read-only: a writer may derive it from its own state)."""
        ...

    @property
    def rows(self) -> int:
        """Rows appended so far."""
        ...

    def append(self, rows: Rows) -> None:
        """Append a batch of rows (see the module docstring for the schema)."""
        ...

    def close(self, complete: bool = True) -> Path:
        """Finish: publish (``complete``) or leave the partial data; returns where it is."""
        ...


def metadata_attr(value: Any) -> Any:
    """A metadata value as an HDF5 / zarr attribute: scalars as they are, the rest as JSON."""
    if isinstance(value, bool | int | float | str | np.integer | np.floating):
        return value.item() if isinstance(value, np.generic) else value
    return json.dumps(value)


def decode_metadata(attrs: dict[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`metadata_attr`: JSON strings of containers back to containers."""
    out: dict[str, Any] = {}
    for key, value in attrs.items():
        if isinstance(value, bytes):
            value = value.decode()
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, str) and value[:1] in "[{":
            with contextlib.suppress(json.JSONDecodeError):
                value = json.loads(value)
        out[key] = value
    return out


def partial_path(path: str | os.PathLike[str]) -> Path:
    """Where an unfinished dataset's rows live: ``<path>.partial``."""
    return Path(str(path) + ".partial")


def disk_size(path: str | os.PathLike[str]) -> int:
    """Bytes on disk of a file or of every file under a folder."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
