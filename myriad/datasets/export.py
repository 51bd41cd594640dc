"""Streaming conversion of a dataset (usually a pretraining run's HDF5) into any format.

Rows flow reader -> member filter -> optional task relabelling -> writer, ``chunk_rows`` at a
time, so memory holds a few chunks whatever the dataset's size.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def default_out(
    source: Path, fmt: str, members: list[int] | None, task: str | None, selection: str = ""
) -> Path:
    """Next to the source dataset: ``<stem>[-members][-selection][-task].export.hdf5`` or
    ``.zarr``."""
    stem = source.stem if source.suffix else source.name
    tag = "".join(
        [
            f"-m{'_'.join(map(str, members))}" if members else "",
            selection,
            f"-{task}" if task else "",
        ]
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
    final_population: int | None = None,
    iterations: tuple[int | None, int | None] | None = None,
    budget: int | None = None,
    seed: int = 0,
) -> ExportResult:
    """Copy a dataset into ``fmt``, streaming, optionally choosing which rows
    (:mod:`myriad.datasets.selection`; default: every row).

    Args:
        source: a pretraining run folder or any dataset :func:`myriad.datasets.load` reads.
        fmt: ``"hdf5" | "zarr" | "minari"``.
        out: the output file (hdf5) or store (zarr), or the Minari datasets root (minari; default
            ``$MINARI_DATASETS_PATH`` or ``~/.minari/datasets``). Default: next to the source.
        members: keep only these members' rows.
        dataset_id: Minari id (default ``myriad/<env>/<run>-v0``).
        task, goal: relabel rewards and terminals (see :func:`myriad.datasets.relabel`).
        chunk_rows: rows per read and per write.
        final_population: instead of the recorded rows, this many fresh transitions of the
            run's final population (``source`` must be a run folder or checkpoint).
        iterations: ``(start, stop)``: only the episodes that ended in these pretraining
            iterations (Python-slice semantics).
        budget: at most this many transitions, whole episodes chosen greedily for new grid
            cells (after the member and iteration filters; reads the source twice).
        seed: seed of the ``final_population`` rollouts.

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
    from myriad.datasets.selection import (
        SelectionError,
        coverage_selection,
        episode_stream,
        final_population_rows,
        iteration_range,
        row_range_stream,
    )

    if final_population is not None and (iterations is not None or budget is not None):
        raise SelectionError(
            "--final-population makes fresh rows of the final policies: it does not combine "
            "with --iterations or --budget, which choose among the recorded rows"
        )
    reader = None if final_population is not None else open_reader(source)
    try:
        if reader is None:
            assert final_population is not None
            spec, fresh = final_population_rows(source, final_population, seed=seed)
            src = Path(source)
        else:
            src = Path(reader.path)
            spec = reader.spec
        # A dataset that does not record its population size accepts any member.
        if members is not None and (present := _present_members(spec)) is not None:
            unknown = sorted(set(members) - set(present))
            if unknown:
                raise ValueError(
                    f"members {unknown} are not in the dataset (population size {len(present)})"
                )
        rows_range = iteration_range(spec, *iterations) if iterations is not None else None

        def candidates() -> Any:
            assert reader is not None
            chunks = reader.iter_chunks(chunk_rows)
            if rows_range is not None:
                chunks = row_range_stream(chunks, *rows_range)
            return filter_members(chunks, members)

        selection: dict[str, object] = {}
        tag = ""
        if final_population is not None:
            selection = dict(spec.metadata.get("selection") or {})
            tag = f"-final{final_population}"
        if iterations is not None:
            selection = {"rule": "iterations", "iterations": list(iterations)}
            tag += f"-it{iterations[0] if iterations[0] is not None else ''}_" + (
                f"{iterations[1]}" if iterations[1] is not None else ""
            )
        chosen = None
        if budget is not None:
            from myriad.datasets.inspection import env_grid

            chosen = coverage_selection(candidates(), env_grid(spec), budget)
            selection = {
                **({"iterations": list(iterations)} if iterations is not None else {}),
                "rule": "coverage_budget",
                "budget": int(budget),
                "episodes_chosen": len(chosen["chosen"]),
                "episodes_available": chosen["episodes"],
            }
            tag += f"-budget{budget}"
        extra: dict[str, object] = {"exported_from": str(src)}
        if members is not None:
            extra["members"] = sorted(set(members))
        if task is not None:
            extra["reward"] = reward_note(task, goal)
        if selection:
            extra["selection"] = selection
        metadata = {**spec.metadata, **extra}
        if members is not None or selection:
            # The per-iteration row counts describe the run's rows, not a selection of them.
            metadata.pop("iteration_rows", None)
        out_spec = DatasetSpec(spec.obs_dim, spec.action_dim, spec.feature_names, metadata)
        if fmt == "minari":
            from myriad.datasets.minari_store import default_root

            target = Path(out) if out is not None else default_root()
            dataset_id = dataset_id or default_dataset_id(src, spec)
        else:
            target = Path(out) if out is not None else default_out(src, fmt, members, task, tag)
        # Never a run's files, nor anything that exists (export has no --overwrite).
        claim_output(
            target / dataset_id if fmt == "minari" and dataset_id else target,
            "export",
            has_overwrite=False,
        )
        if target.resolve() == src.resolve():
            raise ValueError(f"the output {target} is the source dataset")
        if reader is None:
            chunks = filter_members(fresh, members)
        elif chosen is not None:
            chunks = episode_stream(
                candidates(), chosen["chosen"], chosen["last"], chosen["last_rows"]
            )
        else:
            chunks = candidates()
        if task is not None:
            chunks = relabel_stream(chunks, spec, task, goal)
        writer = open_writer(fmt, target, out_spec, dataset_id=dataset_id, chunk_rows=chunk_rows)
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
        if reader is not None:
            reader.close()
    return ExportResult(path, written, time.perf_counter() - t0, largest)


def _present_members(spec: DatasetSpec) -> list[int] | None:
    size = spec.metadata.get("population_size")
    return list(range(int(size))) if isinstance(size, int | np.integer) else None
