"""Datasets of the transitions a population collects, in layouts offline-RL users load.

Formats (one writer interface, :class:`DatasetWriter`): D4RL-layout HDF5 (:class:`D4RLWriter`),
zarr v3 replay buffers (:class:`ZarrWriter`), Minari datasets (:class:`MinariWriter`, needs the
``offline`` extra). :func:`load` reads any of them; :func:`export` converts, streaming;
:func:`relabel` computes task rewards; :func:`to_d3rlpy` hands the data to d3rlpy.
"""

from myriad.datasets.d3rlpy_adapter import import_d3rlpy, to_d3rlpy
from myriad.datasets.data import TransitionData, load, qlearning_dataset, relabel
from myriad.datasets.episodes import EpisodeAssembler, random_policy_rows
from myriad.datasets.export import ExportResult, export
from myriad.datasets.formats import FORMATS, detect_format, open_reader, open_writer
from myriad.datasets.hdf5 import D4RLWriter, HDF5Reader, read_d4rl
from myriad.datasets.inspection import ValidationReport, dataset_info, validate
from myriad.datasets.minari_store import MinariReader, MinariWriter
from myriad.datasets.relabel import NavGoalReward
from myriad.datasets.schema import (
    DatasetSpec,
    DatasetWriteError,
    DatasetWriter,
    IncompleteDatasetError,
)
from myriad.datasets.selection import (
    SelectionError,
    coverage_selection,
    final_population_rows,
    iteration_range,
)
from myriad.datasets.zarr_store import ZarrReader, ZarrWriter

__all__ = [
    "FORMATS",
    "D4RLWriter",
    "DatasetSpec",
    "DatasetWriteError",
    "DatasetWriter",
    "EpisodeAssembler",
    "ExportResult",
    "HDF5Reader",
    "IncompleteDatasetError",
    "MinariReader",
    "MinariWriter",
    "NavGoalReward",
    "SelectionError",
    "TransitionData",
    "ValidationReport",
    "ZarrReader",
    "ZarrWriter",
    "coverage_selection",
    "dataset_info",
    "detect_format",
    "export",
    "final_population_rows",
    "import_d3rlpy",
    "iteration_range",
    "load",
    "open_reader",
    "open_writer",
    "qlearning_dataset",
    "random_policy_rows",
    "read_d4rl",
    "relabel",
    "to_d3rlpy",
    "validate",
]
