"""What a pretraining runner receives instead of building: its dataset sink and its measurement.

:class:`~myriad.pretrain.runner.PretrainRunner` asks two factories for them once its envs and
population exist (both need their sizes). The defaults are what ``myriad pretrain`` runs:

- :func:`recorder_sink`: the writer's :class:`~myriad.datasets.recorder.DatasetRecorder`, the
  run's HDF5 dataset (``dataset.enabled``, ``dataset.path``).
- :func:`knn_measurement`: the k-NN :class:`~myriad.pretrain.objectives.EntropyMeasurement` of the
  objective's settings, and a :class:`~myriad.entropy.CoverageTracker` on envs with a grid.

Another sink (rows kept in memory, sent elsewhere, or none) or measurement (another k-NN backend,
no coverage) is a factory with the same signature, passed to the runner.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from myriad.datasets.recorder import DatasetRecorder, dataset_location, dataset_metadata
from myriad.entropy import CoverageTracker
from myriad.envs import VecEnv
from myriad.pretrain.objectives import EntropyMeasurement


class DatasetSink(Protocol):
    """Where the writer sends the rows of every rollout (see :class:`DatasetRecorder`)."""

    @property
    def path(self) -> Path | None:
        """Where the rows go, named in the runner's status line (None: nowhere on disk)."""
        ...

    def record(self, steps: Mapping[str, torch.Tensor]) -> None:
        """One rollout's rows: ``observations``, ``next_observations [T, E, O]``, ``actions
        [T, E, A]``, ``rewards``, ``terminals``, ``timeouts``, ``member [T, E]``, ``features
        [T, E, p]``."""
        ...

    def finish(self, iteration: int) -> Path | None:
        """The run ended after ``iteration`` iterations; returns the published dataset."""
        ...

    def cut_episodes(self) -> int:
        """End the unfinished episodes as truncated (the envs restart from a reset); returns
        how many there were."""
        ...

    def close(self) -> None:
        """Release files (an unfinished dataset stays resumable)."""
        ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any], iteration: int) -> None:
        """Restore the state of a checkpoint taken after ``iteration`` iterations."""
        ...


@dataclass(frozen=True)
class RunShape:
    """What a collaborator factory is told about the run.

    Attributes:
        config: the resolved run config.
        run_dir: the run folder.
        env: this process's envs (their spaces, features and time limit).
        num_envs: ``E``, every env of the run (the rows the writer receives per step).
        num_members: the population size ``M``.
    """

    config: Mapping[str, Any]
    run_dir: Path
    env: VecEnv
    num_envs: int
    num_members: int


#: Builds the writer's sink (None: the rows go nowhere).
SinkFactory = Callable[[RunShape], "DatasetSink | None"]


def recorder_sink(run: RunShape) -> DatasetRecorder:
    """The run's HDF5 dataset at ``dataset.path`` in the run folder (the default)."""
    cfg, env = run.config, run.env
    return DatasetRecorder(
        dataset_location(run.run_dir, str(cfg["dataset"]["path"])),
        env.obs_dim,
        env.action_dim,
        env.features.names,
        run.num_envs,
        env.max_episode_steps,
        dataset_metadata(cfg, run.num_members, env.features.names),
    )


@dataclass
class PopulationMeasurement:
    """What the runner measures of each rollout and of the final population.

    Attributes:
        entropy: the k-NN measurement of the features the objective learns from (on a rank of a
            ``torchrun`` launch, the role wraps it to measure every rank's features).
        coverage: the visited share of the env's grid (None: not measured).
    """

    entropy: EntropyMeasurement
    coverage: CoverageTracker | None


#: Builds the measurement of a run.
MeasurementFactory = Callable[[RunShape], PopulationMeasurement]


def knn_measurement(run: RunShape) -> PopulationMeasurement:
    """The objective's k-NN measurement (``objective.k``, ``backend``, ``min_distance``) and,
    where the env's features have a grid, its coverage (the default)."""
    obj_cfg, env = run.config["objective"], run.env
    entropy = EntropyMeasurement(
        int(obj_cfg["k"]),
        run.num_members,
        env.features.dim,
        backend=str(obj_cfg.get("backend", "auto")),
        min_distance=float(obj_cfg.get("min_distance", 1e-3)),
    )
    coverage = (
        CoverageTracker(env.features, run.num_members, env.device) if env.features.cells else None
    )
    return PopulationMeasurement(entropy, coverage)
