"""D4RL-layout HDF5 datasets, written in chunks while training runs.

Layout (one row per transition, episodes contiguous):

    observations [N, O] float32      actions [N, A] float32     rewards [N] float32
    next_observations [N, O]         terminals [N] bool         timeouts [N] bool
    infos/member [N] int32           infos/<feature> [N] float32 (entropy features of
                                                                 the observation's state)
    metadata/*  attributes: env, config, myriad version, population size, seed, ...

Crash safety: rows go to ``<path>.partial``; :meth:`D4RLWriter.close` marks the file complete
(``attrs["complete"] = True``) and renames it to ``<path>``. A reader that finds only the
``.partial`` file knows the run did not finish. A resumed run reopens the partial file and cuts it
back to the row count recorded in its checkpoint, so no row is duplicated or lost.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from myriad import __version__

CHUNK_ROWS = 16384
CORE_KEYS = ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts")


class DatasetWriteError(OSError):
    """Writing the dataset failed (e.g. a full disk); rows written so far stay readable."""


def partial_path(path: str | os.PathLike[str]) -> Path:
    return Path(str(path) + ".partial")


class D4RLWriter:
    """Append-only writer of a D4RL-layout HDF5 file.

    Args:
        path: final file path (``.hdf5``); rows are written to ``path + ".partial"``.
        obs_dim, action_dim: row widths.
        feature_names: entropy-feature names, stored as ``infos/<name>``.
        metadata: stored under ``metadata/`` as attributes (JSON for non-scalars).
        resume_rows: reopen an existing partial file and cut it to this many rows
            (the count saved in the checkpoint being resumed).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        obs_dim: int,
        action_dim: int,
        feature_names: tuple[str, ...],
        metadata: dict[str, Any] | None = None,
        resume_rows: int | None = None,
    ) -> None:
        self.path = Path(path)
        self.tmp = partial_path(self.path)
        self.feature_names = tuple(feature_names)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_rows is not None:
            if not self.tmp.exists():
                raise FileNotFoundError(
                    f"cannot resume the dataset: {self.tmp} is missing (was the run folder moved "
                    "or the dataset already finalised?)"
                )
            self.file = h5py.File(self.tmp, "a")
            self._truncate(int(resume_rows))
            return
        self.file = h5py.File(self.tmp, "w")
        specs = {
            "observations": ((obs_dim,), np.float32),
            "next_observations": ((obs_dim,), np.float32),
            "actions": ((action_dim,), np.float32),
            "rewards": ((), np.float32),
            "terminals": ((), np.bool_),
            "timeouts": ((), np.bool_),
            "infos/member": ((), np.int32),
        }
        specs.update({f"infos/{name}": ((), np.float32) for name in self.feature_names})
        for key, (shape, dtype) in specs.items():
            self.file.create_dataset(
                key,
                shape=(0, *shape),
                maxshape=(None, *shape),
                dtype=dtype,
                chunks=(CHUNK_ROWS, *shape),
                compression="lzf",
            )
        meta = self.file.create_group("metadata")
        for key, value in {"myriad_version": __version__, **(metadata or {})}.items():
            meta.attrs[key] = value if isinstance(value, int | float | str) else json.dumps(value)
        self.file.attrs["complete"] = False
        self.file.attrs["layout"] = "d4rl"

    @property
    def rows(self) -> int:
        return int(self.file["observations"].shape[0])

    def _truncate(self, rows: int) -> None:
        if rows > self.rows:
            raise ValueError(
                f"dataset {self.tmp} has {self.rows} rows but the checkpoint recorded {rows}: "
                "the file does not belong to this checkpoint"
            )
        for key in self._keys():
            self.file[key].resize(rows, axis=0)

    def _keys(self) -> list[str]:
        keys: list[str] = []
        self.file.visititems(lambda k, v: keys.append(k) if isinstance(v, h5py.Dataset) else None)
        return keys

    def append(self, rows: dict[str, np.ndarray]) -> None:
        """Append ``N`` rows: ``observations [N, O]``, ..., ``member [N]``, ``features [N, p]``."""
        n = len(rows["observations"])
        if n == 0:
            return
        columns = {k: rows[k] for k in CORE_KEYS}
        columns["infos/member"] = rows["member"]
        for i, name in enumerate(self.feature_names):
            columns[f"infos/{name}"] = rows["features"][:, i]
        start = self.rows
        try:
            for key, value in columns.items():
                ds = self.file[key]
                ds.resize(start + n, axis=0)
                ds[start:] = value
            self.file.flush()
        except OSError as exc:
            # Leave every column at the last complete row count so the file stays consistent.
            self._truncate(start)
            raise DatasetWriteError(
                f"writing {n} rows to {self.tmp} failed ({exc}); the {start} rows written before "
                "are intact. Free disk space and resume the run from its last checkpoint."
            ) from exc

    def close(self, complete: bool = True) -> Path:
        """Close the file; when ``complete``, mark it and move it to its final name."""
        if not self.file:
            return self.path if complete else self.tmp
        if complete:
            self.file.attrs["complete"] = True
        self.file.close()
        if complete:
            self.tmp.replace(self.path)
            return self.path
        return self.tmp


def read_d4rl(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Load a D4RL-layout file into NumPy arrays (``infos/*`` and ``metadata`` nested).

    Raises:
        ValueError: the file was not completed (a crashed or running writer).
    """
    path = Path(path)
    if not path.exists() and partial_path(path).exists():
        raise ValueError(f"{path} was not completed: only {partial_path(path)} exists")
    with h5py.File(path, "r") as f:
        if not f.attrs.get("complete", False):
            raise ValueError(f"{path} is not marked complete: its writer did not finish")
        data: dict[str, Any] = {k: f[k][()] for k in CORE_KEYS}
        data["infos"] = {k: v[()] for k, v in f["infos"].items()}
        data["metadata"] = dict(f["metadata"].attrs)
    return data
