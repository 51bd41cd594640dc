"""Streaming conversion of a dataset (usually a pretraining run's HDF5) into any format.

Rows flow reader -> member filter -> optional task relabelling -> writer, ``chunk_rows`` at a
time, so memory holds a few chunks whatever the dataset's size.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from myriad.datasets.data import filter_members
from myriad.datasets.formats import FORMATS, open_reader, open_writer
from myriad.datasets.relabel import reward_note
from myriad.datasets.schema import CHUNK_ROWS, DatasetSpec
from myriad.utils.ownership import claim_output


@dataclass(frozen=True)
class ExportResult:
    """Where the export went and what it moved.

    Attributes:
        path: the finished dataset (file, store or Minari dataset folder).
        rows: rows written.
        seconds: wall time of the copy.
        max_chunk_rows: the largest batch held at once (the memory bound, in rows).
    """

    path: Path
    rows: int
    seconds: float
    max_chunk_rows: int


def default_out(source: Path, fmt: str, members: list[int] | None, task: str | None) -> Path:
    """Next to the source dataset: ``<stem>[-members][-task].export.hdf5`` or ``.zarr``."""
    stem = source.stem if source.suffix else source.name
    tag = "".join(
        [f"-m{'_'.join(map(str, members))}" if members else "", f"-{task}" if task else ""]
    )
    suffix = ".export.hdf5" if fmt == "hdf5" else ".zarr"
    return source.with_name(f"{stem}{tag}{suffix}")


def default_dataset_id(source: Path, spec: DatasetSpec) -> str:
    """``myriad/<env>/<run folder name>-v0`` (Minari ids allow letters, digits, ``-_``)."""
    run = source.parent.parent.name if source.parent.name == "dataset" else source.stem
    env = str(spec.metadata.get("env", "env"))
    clean = "".join(c if c.isalnum() or c in "-_" else "-" for c in run).strip("-") or "run"
    return f"myriad/{env}/{clean}-v0"


def export(
    source: str | os.PathLike[str],
    fmt: str,
    out: str | os.PathLike[str] | None = None,
    members: list[int] | None = None,
    dataset_id: str | None = None,
    task: str | None = None,
    goal: tuple[float, float] | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> ExportResult:
    """Copy a dataset into ``fmt``, streaming.

    Args:
        source: a pretraining run folder or any dataset :func:`myriad.datasets.load` reads.
        fmt: ``"hdf5" | "zarr" | "minari"``.
        out: the output file (hdf5) or store (zarr), or the Minari datasets root (minari; default
            ``$MINARI_DATASETS_PATH`` or ``~/.minari/datasets``). Default: next to the source.
        members: keep only these members' rows.
        dataset_id: Minari id (default ``myriad/<env>/<run>-v0``).
        task, goal: relabel rewards and terminals (see :func:`myriad.datasets.relabel`).
        chunk_rows: rows per read and per write.

    Raises:
        IncompleteDatasetError: the source was not completed.
        DatasetWriteError: writing failed (the output stays under its partial name).
        OwnershipError: the output is a file of a run, exists, or its staging folder was not
            left by an export (:mod:`myriad.utils.ownership`).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose one of {FORMATS}")
    if int(chunk_rows) < 1:
        raise ValueError(f"chunk_rows must be a positive number of rows, got {chunk_rows}")
    from myriad.datasets.relabel import relabel_stream

    t0 = time.perf_counter()
    reader = open_reader(source)
    try:
        src = Path(reader.path)
        spec = reader.spec
        # A dataset that does not record its population size accepts any member.
        if members is not None and (present := _present_members(spec)) is not None:
            unknown = sorted(set(members) - set(present))
            if unknown:
                raise ValueError(
                    f"members {unknown} are not in the dataset (population size {len(present)})"
                )
        extra: dict[str, object] = {"exported_from": str(src)}
        if members is not None:
            extra["members"] = sorted(set(members))
        if task is not None:
            extra["reward"] = reward_note(task, goal)
        out_spec = DatasetSpec(
            spec.obs_dim, spec.action_dim, spec.feature_names, {**spec.metadata, **extra}
        )
        if fmt == "minari":
            from myriad.datasets.minari_store import default_root

            target = Path(out) if out is not None else default_root()
            dataset_id = dataset_id or default_dataset_id(src, spec)
        else:
            target = Path(out) if out is not None else default_out(src, fmt, members, task)
        # Never a run's files, nor anything that exists (export has no --overwrite).
        claim_output(
            target / dataset_id if fmt == "minari" and dataset_id else target,
            "export",
            has_overwrite=False,
        )
        if target.resolve() == src.resolve():
            raise ValueError(f"the output {target} is the source dataset")
        writer = open_writer(fmt, target, out_spec, dataset_id=dataset_id, chunk_rows=chunk_rows)
        chunks = filter_members(reader.iter_chunks(chunk_rows), members)
        if task is not None:
            chunks = relabel_stream(chunks, spec, task, goal)
        largest = 0
        try:
            for rows in chunks:
                largest = max(largest, len(rows["rewards"]))
                writer.append(rows)
        except BaseException:
            writer.close(complete=False)
            raise
        written = writer.rows
        path = writer.close(complete=True)
    finally:
        reader.close()
    return ExportResult(path, written, time.perf_counter() - t0, largest)


def _present_members(spec: DatasetSpec) -> list[int] | None:
    size = spec.metadata.get("population_size")
    return list(range(int(size))) if isinstance(size, int | np.integer) else None
