"""Recording a training run's transitions as a D4RL-layout dataset that no crash can damage.

:class:`DatasetRecorder` turns each rollout (``[T, E]`` tensors) into episode-contiguous rows,
stages them with :class:`~myriad.datasets.hdf5.D4RLWriter` and publishes the finished file when
the run ends. Its checkpoint state says exactly which rows exist, so a run killed at any moment
and resumed writes every row once:

- while training, new rows live in ``<dataset>.partial/``; a resume cuts it back to the row
  count of the checkpoint it continues from;
- publishing is one ``os.replace`` of a complete file; the file records the run iteration it
  was published at (``attrs["run_iteration"]``), so a run killed after publishing but before its
  final checkpoint is recognised as finished on resume, and its staged rows are not used twice;
- extending a finished run (``--resume RUN iterations=N``) stages the new rows and publishes the
  old file's rows followed by them: the published file only ever grows.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import h5py
import torch

from myriad.datasets.episodes import EpisodeAssembler
from myriad.datasets.hdf5 import D4RLWriter
from myriad.datasets.schema import partial_path, row_fields
from myriad.datasets.segments import legacy_staging
from myriad.utils.faults import fault_point
from myriad.utils.ownership import check_run_paths, remove_partial


class DatasetStateError(ValueError):
    """The dataset on disk does not match the checkpoint being resumed."""


def published_rows(path: Path) -> tuple[int, int | None] | None:
    """``(rows, run_iteration)`` of a complete dataset file at ``path``, or None if there is
    none (``run_iteration`` is None for files written before it was recorded)."""
    if not path.is_file():
        return None
    try:
        with h5py.File(path, "r") as f:
            if not f.attrs.get("complete", False):
                return None
            iteration = f.attrs.get("run_iteration")
            return int(f["observations"].shape[0]), None if iteration is None else int(iteration)
    except (OSError, KeyError) as exc:
        raise DatasetStateError(
            f"{path} is not a readable dataset ({exc}); move it away or restore it"
        ) from exc


def dataset_location(run_dir: Path, relative: str) -> Path:
    """``run_dir / relative``, refusing paths that leave the run folder or collide with another
    file of the run (:func:`myriad.utils.ownership.check_run_paths`).

    Raises:
        ConfigError: ``relative`` is absolute, climbs out of ``run_dir`` (``..``), or names
            another file of the run.
    """
    return check_run_paths(run_dir, {"dataset": {"enabled": True, "path": relative}})["dataset"]


class DatasetRecorder:
    """Records the transitions of every env of a run (a :class:`D4RLWriter` behind it).

    Args:
        path: the published file (``.hdf5``), inside the run folder.
        obs_dim, action_dim: row widths.
        feature_names: entropy-feature names (``p`` of them).
        num_envs: ``E``.
        max_episode_steps: the env's time limit (bounds the staged episode length).
        metadata: stored in the file's ``metadata/`` group.
    """

    def __init__(
        self,
        path: Path,
        obs_dim: int,
        action_dim: int,
        feature_names: tuple[str, ...],
        num_envs: int,
        max_episode_steps: int,
        metadata: Mapping[str, Any],
    ) -> None:
        self.path = Path(path)
        self.dims = (int(obs_dim), int(action_dim))
        self.feature_names = tuple(feature_names)
        self.metadata = dict(metadata)
        self.assembler = EpisodeAssembler(
            num_envs, max_episode_steps, row_fields(obs_dim, action_dim, len(feature_names))
        )
        self.writer: D4RLWriter | None = None  # opened at the first rows (or by a resume)
        self.base_rows = 0  # rows of the published file that come before the staged ones
        # Rows recorded after each iteration (cumulative); None for a run resumed from a
        # checkpoint that predates it. Published as metadata["iteration_rows"] (selection by
        # iteration, myriad.datasets.selection).
        self.iteration_rows: list[int] | None = []

    def _open_writer(self, resume_rows: int | None) -> D4RLWriter:
        return D4RLWriter(
            self.path,
            *self.dims,
            self.feature_names,
            metadata=self.metadata,
            resume_rows=resume_rows,
            base_rows=self.base_rows,
            owner="pretrain",
        )

    def record(self, steps: Mapping[str, torch.Tensor]) -> None:
        """Append the episodes that ended in this rollout.

        Args:
            steps: ``observations``, ``next_observations [T, E, O]``, ``actions [T, E, A]``,
                ``rewards``, ``terminals``, ``timeouts [T, E]``, ``member [T, E]``,
                ``features [T, E, p]`` (copied to the host once per rollout).
        """
        host = {k: v.detach().cpu().numpy() for k, v in steps.items()}
        rows = self.assembler.add(host, host["terminals"] | host["timeouts"])
        if self.writer is None:
            self.writer = self._open_writer(resume_rows=None)
        self.writer.append(rows)
        if self.iteration_rows is not None:
            self.iteration_rows.append(self.rows)

    @property
    def rows(self) -> int:
        """Rows recorded so far (published and staged)."""
        return self.base_rows + (self.writer.rows if self.writer is not None else 0)

    def finish(self, iteration: int) -> Path | None:
        """Publish the dataset: the unfinished episodes are cut (their last row flagged as a
        timeout) and every row goes into ``path``. Returns the path, or None if nothing was
        ever recorded. Idempotent: a second call without new rows changes nothing."""
        if self.writer is None:
            return self.path if self.base_rows else None
        rows, last = self.assembler.flush()
        rows["timeouts"] = rows["timeouts"] | last
        self.writer.append(rows)
        if self.iteration_rows:
            # The cut episodes belong to the last iteration.
            self.iteration_rows[-1] = self.rows
            spec = self.writer.spec
            self.writer.file.spec = replace(
                spec, metadata={**spec.metadata, "iteration_rows": list(self.iteration_rows)}
            )
        path = self.writer.close(complete=True, run_iteration=iteration)
        self.base_rows += self.writer.rows
        self.writer = None
        return path

    def cut_episodes(self) -> int:
        """End every unfinished episode here, as a truncation (its last row flagged as a
        timeout, as :meth:`finish` does), and stage its rows; returns how many were cut.

        A resume whose envs could not be restored exactly (they restart from a reset) calls
        this: the saved partial episodes have no continuation, and appending the new episodes
        to them would join two unrelated trajectories. Their rows count to the iteration they
        were collected in.
        """
        if self.writer is None:
            return 0  # nothing staged: a fresh run, or one already published at this point
        rows, last = self.assembler.flush()
        rows["timeouts"] = rows["timeouts"] | last
        self.writer.append(rows)
        if self.iteration_rows:
            self.iteration_rows[-1] = self.rows
        return int(last.sum())

    def close(self) -> None:
        """Release the file; staged rows stay in ``<path>.partial`` for a resume."""
        if self.writer is not None:
            self.writer.close(complete=False)
            self.writer = None

    # -- checkpoint state ------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Row counts and unfinished episodes as tensors (checkpoints load ``weights_only``)."""
        state: dict[str, Any] = {"rows": None, "base_rows": self.base_rows}
        if self.iteration_rows is not None:
            state["iteration_rows"] = torch.tensor(self.iteration_rows, dtype=torch.int64)
        if self.writer is None:
            return state
        self.writer.file.flush()
        episodes = self.assembler.state_dict()
        state["rows"] = self.writer.rows
        state["length"] = torch.from_numpy(episodes["length"])
        state["staging"] = {k: torch.from_numpy(v) for k, v in episodes["staging"].items()}
        return state

    def load_state_dict(self, state: Mapping[str, Any], iteration: int) -> None:
        """Restore the dataset of the checkpoint of run iteration ``iteration``.

        The published file's rows are never removed: when it was published after this
        checkpoint (the newest checkpoint was unreadable, or an earlier one was chosen), its
        first rows are exactly the rows this checkpoint had recorded, so they become the base
        and the rows after them are recorded again, identically, as the run continues.

        Raises:
            DatasetStateError: the published file is missing or shorter than the checkpoint
                recorded (it was replaced or truncated by hand).
        """
        self.close()
        counts = state.get("iteration_rows")
        self.iteration_rows = None if counts is None else [int(c) for c in counts.tolist()]
        published = published_rows(self.path)
        staged = state.get("rows")
        if state["base_rows"] is not None:
            base = int(state["base_rows"])
        else:  # a checkpoint that predates base_rows (myriad.utils.migrations, change 7)
            base = published[0] if published is not None and staged is None else 0
        expected = base + int(staged or 0)
        later = (
            staged is not None
            and published is not None
            and published[1] is not None
            and published[1] >= iteration
        )
        required = expected if later else base
        if required and (published is None or published[0] < required):
            found = "the file is missing" if published is None else f"it has {published[0]}"
            raise DatasetStateError(
                f"the checkpoint of iteration {iteration} expects {required} rows in "
                f"{self.path}, but {found}: restore the dataset file, or start a new run"
            )
        if later:
            assert published is not None  # a later publication is a published file
            self._discard_staging()
            if published[1] == iteration:
                # Killed after publishing, before the final checkpoint replaced this one: the
                # file already holds the staged rows and the cut episodes.
                self.base_rows = published[0]
                return
            self.base_rows = expected
            self.writer = self._open_writer(resume_rows=None)
        else:
            self.base_rows = base
            if staged is None:
                self._discard_staging()  # rows no checkpoint recorded: recorded again
                return
            self.writer = self._open_writer(resume_rows=int(staged))
        self.assembler.load_state_dict(
            {
                "length": state["length"].numpy(),
                "staging": {k: v.numpy() for k, v in state["staging"].items()},
            }
        )

    def _discard_staging(self) -> None:
        """Delete ``<path>.partial``: rows that no checkpoint recorded, or that the published
        file already holds."""
        remove_partial(partial_path(self.path), "pretrain", legacy=legacy_staging)
        fault_point("dataset.staging_discarded")


def dataset_metadata(
    config: Mapping[str, Any], num_members: int, feature_names: tuple[str, ...]
) -> dict[str, Any]:
    """The metadata a training run stores with its dataset."""
    return {
        "env": config["env"]["name"],
        "env_options": config["env"].get("options") or {},
        "config": dict(config),
        "population_size": int(num_members),
        "seed": int(config["seed"]),
        "reward": "intrinsic k-NN reward of the pretraining objective",
        "feature_names": list(feature_names),
    }


__all__ = [
    "DatasetRecorder",
    "DatasetStateError",
    "dataset_location",
    "dataset_metadata",
    "published_rows",
]
