"""``myriad dataset verify``: every file of a run (or one dataset) read back and checked.

For a run folder: ``config.yaml`` (its digest and every key's type and range), ``summary.json``
(its digest), every checkpoint (its digest), the dataset (every chunk of every column, against
its checksums) and the staged rows of an unfinished run. For a dataset of any format: every
chunk. Each file gets one line; a bad one names its first bad chunk (or key).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py

from myriad.datasets.checksums import (
    DIGEST_FILE,
    check_block_digests,
    hdf5_checksummed,
    read_hdf5,
    read_zarr,
)
from myriad.datasets.formats import detect_format, run_dataset
from myriad.datasets.hdf5 import CORE_KEYS
from myriad.datasets.schema import CHUNK_ROWS, CorruptDatasetError, IncompleteDatasetError
from myriad.utils.checkpoint import CheckpointError, list_checkpoints, load_checkpoint
from myriad.utils.config import ConfigError, load_run_config
from myriad.utils.digest import read_summary
from myriad.utils.ownership import partial_path


@dataclass(frozen=True)
class Finding:
    """One file's verdict: ``status`` is ``"ok"``, ``"unverified"`` (no checksums to check)
    or ``"FAIL"``; ``detail`` says what was checked or what is wrong."""

    path: Path
    status: str
    detail: str


def _hdf5(path: Path) -> Finding:
    """Every chunk of every dataset of an HDF5 file."""
    try:
        f = h5py.File(path, "r")
    except OSError as exc:
        return Finding(path, "FAIL", f"not a readable HDF5 file ({exc})")
    with f:
        missing = [k for k in CORE_KEYS if k not in f]
        if missing:  # an HDF5 file, but not a dataset: nothing here to verify
            return Finding(
                path, "FAIL", f"not a D4RL-layout dataset: it has no {', '.join(missing)}"
            )
        columns: list[tuple[str, h5py.Dataset]] = []
        f.visititems(lambda k, v: columns.append((k, v)) if isinstance(v, h5py.Dataset) else None)
        unchecked = [k for k, d in columns if not hdf5_checksummed(d)]
        for key, dataset in columns:
            n = int(dataset.shape[0]) if dataset.shape else 0
            step = max(int(dataset.chunks[0]) if dataset.chunks else n, 1)
            step *= max(1, CHUNK_ROWS // step)
            try:
                for start in range(0, n, step):
                    read_hdf5(dataset, start, min(start + step, n), path, key)
            except CorruptDatasetError as exc:
                return Finding(path, "FAIL", str(exc))
            except OSError as exc:
                return Finding(path, "FAIL", f"{key} is not readable ({exc})")
        if unchecked:
            return Finding(
                path, "unverified", f"no checksums in {', '.join(unchecked[:3])} (older writer)"
            )
        return Finding(path, "ok", f"{len(columns)} columns, every chunk checked (Fletcher-32)")


def _zarr(path: Path) -> Finding:
    import zarr

    from myriad.datasets.zarr_store import checksummed, missing_chunk

    try:
        root = zarr.open_group(path, mode="r")
    except Exception as exc:  # zarr raises several kinds for an unreadable store
        return Finding(path, "FAIL", f"not a readable zarr store ({exc})")
    arrays = sorted(_zarr_arrays(root), key=lambda item: item[0])
    unchecked = []
    for name, array in arrays:
        if not checksummed(array):
            unchecked.append(name)
        n = int(array.shape[0])
        step = int(array.chunks[0])
        try:
            if checksummed(array):
                missing_chunk(path, name, array)
            for begin in range(0, n, step):
                read_zarr(array, begin, min(begin + step, n), path, name)
        except CorruptDatasetError as exc:
            return Finding(path, "FAIL", str(exc))
    if unchecked:
        return Finding(path, "unverified", f"no checksums in {', '.join(unchecked[:3])}")
    return Finding(path, "ok", f"{len(arrays)} arrays, every chunk checked (CRC32C)")


def _zarr_arrays(group: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    import zarr

    for name, node in group.members():
        if isinstance(node, zarr.Array):
            yield f"{prefix}{name}", node
        elif isinstance(node, zarr.Group):
            yield from _zarr_arrays(node, f"{prefix}{name}/")


def _minari(path: Path) -> Finding:
    folder = path.parent if path.name == "data" else path
    try:
        if not check_block_digests(folder):
            return Finding(folder, "unverified", f"no {DIGEST_FILE} (older writer or Minari)")
    except CorruptDatasetError as exc:
        return Finding(folder, "FAIL", str(exc))
    return Finding(folder, "ok", f"every block checked against {DIGEST_FILE} (SHA-256)")


def verify_dataset(path: str | os.PathLike[str]) -> Finding:
    """Check every chunk of the dataset at ``path`` (any format)."""
    path = Path(path)
    try:
        fmt = detect_format(path)
    except (IncompleteDatasetError, FileNotFoundError) as exc:
        return Finding(path, "FAIL", str(exc))
    return {"hdf5": _hdf5, "zarr": _zarr, "minari": _minari}[fmt](path)


def verify_run(run: Path) -> list[Finding]:
    """Every file of the run folder ``run`` that myriad reads back."""
    findings: list[Finding] = []
    config = run / "config.yaml"
    try:
        load_run_config(run)
        findings.append(Finding(config, "ok", "digest, types and ranges"))
    except (ConfigError, OSError) as exc:
        findings.append(Finding(config, "FAIL", str(exc).splitlines()[0]))
    summary = run / "summary.json"
    if summary.is_file():
        try:
            read_summary(summary)
            findings.append(Finding(summary, "ok", "digest"))
        except ConfigError as exc:
            findings.append(Finding(summary, "FAIL", str(exc)))
    for checkpoint in list_checkpoints(run / "checkpoints"):
        try:
            load_checkpoint(checkpoint)
            findings.append(Finding(checkpoint, "ok", "digest of every tensor and value"))
        except CheckpointError as exc:
            findings.append(Finding(checkpoint, "FAIL", str(exc)))
    try:
        dataset = run_dataset(run)
    except (ConfigError, OSError):
        dataset = run / "dataset" / "transitions.hdf5"
    if dataset.exists():
        findings.append(verify_dataset(dataset))
    staging = partial_path(dataset)
    if staging.is_dir():
        findings.extend(_hdf5(seg) for seg in sorted(staging.glob("seg_*.hdf5")))
    return findings


def verify(path: str | os.PathLike[str]) -> list[Finding]:
    """:func:`verify_run` for a run folder, else :func:`verify_dataset`."""
    path = Path(path)
    if path.is_dir() and (path / "config.yaml").is_file():
        return verify_run(path)
    return [verify_dataset(path)]


def verify_command(path: str) -> int:
    """Print one line per file; exit status 1 when any failed, else 0."""
    findings = verify(path)
    for f in findings:
        print(f"{f.status:<10} {f.path}: {f.detail}")
    bad = [f for f in findings if f.status == "FAIL"]
    unverified = sum(f.status == "unverified" for f in findings)
    print(
        f"{len(findings)} files: {len(findings) - len(bad) - unverified} verified, "
        f"{unverified} unverified, {len(bad)} bad"
    )
    return 1 if bad else 0
