"""Minari datasets, written with Minari's own storage API so that ``minari.load_dataset`` opens
them unchanged.

A dataset with id ``namespace/name-v0`` under a datasets root (``MINARI_DATASETS_PATH``, by
default ``~/.minari/datasets``) lives in ``<root>/namespace/name-v0/data/`` (``metadata.json`` and
``main_data.hdf5``, its arrays stored contiguous: :func:`compact_episodes`). Each of our
episodes becomes one Minari episode:

    observations [T + 1, O]   the episode's observations, then the last row's next observation
    actions [T, A], rewards [T], terminations [T] (our terminals), truncations [T] (our timeouts)
    infos/member [T] int32, infos/<feature> [T] float32: per step, like our rows (the state the
        action was taken in), so ``infos`` has ``T`` entries, not ``T + 1``

``metadata.json`` carries Minari's keys (dataset id, spaces, totals, the env's Gymnasium spec
for ``recover_environment()``: :func:`env_spec`) and ours under ``"myriad"`` (env, options,
config, feature names).

Integrity: Minari's files carry no checksums, so ``myriad-digest.json`` beside ``data/`` holds a
SHA-256 of every block of every file; :class:`MinariReader` checks them all before it reads.

Crash safety: rows are staged as segment files in the hidden folder
``<root>/namespace/.name-v0.partial`` (Minari's listing skips hidden folders); :meth:`close`
builds the Minari dataset there and renames the folder to its id's.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from myriad import __version__
from myriad.datasets.checksums import (
    DIGEST_FILE,
    check_block_digests,
    note_unverified,
    write_block_digests,
)
from myriad.datasets.schema import (
    CHUNK_ROWS,
    DatasetSpec,
    DatasetWriteError,
    IncompleteDatasetError,
    Rows,
    concat_rows,
    episode_ends,
    take_rows,
)
from myriad.datasets.segments import RowSegments, check_free_space
from myriad.utils.optional import require
from myriad.utils.ownership import PARTIAL_MARKER, make_partial

_NAMESPACE_FILE = "namespace_metadata.json"


def default_root() -> Path:
    """Minari's local datasets folder: ``$MINARI_DATASETS_PATH`` or ``~/.minari/datasets``."""
    env = os.environ.get("MINARI_DATASETS_PATH")
    return Path(env) if env else Path.home() / ".minari" / "datasets"


def _partial(folder: Path) -> Path:
    return folder.parent / f".{folder.name}.partial"


def box_spaces(spec: DatasetSpec) -> tuple[gym.spaces.Box, gym.spaces.Box]:
    """Observation and action spaces of a dataset: the env's, when its metadata names a myriad
    env that can be built, else unbounded observations and actions in ``[-1, 1]``."""
    env_cfg = spec.env_config()
    if env_cfg is not None:
        from myriad.envs import make_from_config

        try:
            env = make_from_config(env_cfg, 1, "cpu")
        except Exception:  # an env from a missing optional backend: fall back to plain boxes
            pass
        else:
            with env:
                obs = env.single_observation_space
                act = env.single_action_space
            if obs.shape == (spec.obs_dim,) and act.shape == (spec.action_dim,):
                return obs, act
    obs = gym.spaces.Box(-np.inf, np.inf, (spec.obs_dim,), np.float32)
    return obs, gym.spaces.Box(-1.0, 1.0, (spec.action_dim,), np.float32)


def env_spec(spec: DatasetSpec) -> gym.envs.registration.EnvSpec | None:
    """The Gymnasium spec that rebuilds the dataset's env (``recover_environment()``): the
    env's own spec for ``gymnasium`` envs, myriad's entry point for the others
    (:func:`myriad.envs.gymnasium.myriad_env_spec`); None when the metadata names no env or it
    cannot be built here (a missing optional backend)."""
    env_cfg = spec.env_config()
    if env_cfg is None:
        return None
    from myriad.envs.gymnasium import myriad_env_spec

    try:
        return myriad_env_spec(env_cfg)
    except Exception:  # recovering the env is optional: the dataset is written without it
        return None


class MinariWriter:
    """Append-only, crash-safe writer of a Minari dataset (a :class:`DatasetWriter`).

    Args:
        dataset_id: Minari id, ``(namespace/)name-v<version>``.
        spec: row schema and metadata.
        root: Minari datasets folder (default :func:`default_root`).
        observation_space, action_space: default :func:`box_spaces`.
        flush_rows: whole episodes are handed to Minari in batches of about this many rows.
        compact: rewrite the episodes contiguously (:func:`compact_episodes`); False keeps
            Minari's chunked layout (benchmarks/minari_size.py compares the two).

    Appended rows are staged as segment files (:class:`RowSegments`) in the partial folder;
    :meth:`close` builds the Minari dataset from them with Minari's storage API, one batch of
    episodes at a time, and renames the folder. A failed append leaves the staged rows intact.
    """

    def __init__(
        self,
        dataset_id: str,
        spec: DatasetSpec,
        root: str | os.PathLike[str] | None = None,
        observation_space: gym.Space | None = None,
        action_space: gym.Space | None = None,
        flush_rows: int = CHUNK_ROWS,
        compact: bool = True,
    ) -> None:
        require("minari", extra="offline")
        from minari.dataset.minari_dataset import parse_dataset_id

        parse_dataset_id(dataset_id)  # a malformed id raises here, before anything is written
        self.dataset_id = dataset_id
        self.spec = spec
        self.root = Path(root) if root is not None else default_root()
        self.path = self.root / dataset_id
        self.tmp = _partial(self.path)
        if self.path.exists():
            raise FileExistsError(
                f"Minari dataset {dataset_id} already exists at {self.path}; delete it "
                "(minari.delete_dataset) or choose another id"
            )
        make_partial(self.tmp, "export")  # replaces only a folder an earlier export left
        self.spaces = (observation_space, action_space)
        self.flush_rows = int(flush_rows)
        self.compact = bool(compact)
        self.segments = RowSegments(self.tmp / ".rows", spec)

    @property
    def rows(self) -> int:
        return self.segments.rows

    def append(self, rows: Rows) -> None:
        """Append a batch of rows (schema in :mod:`myriad.datasets.schema`).

        Raises:
            DatasetWriteError: the write failed; the rows appended before are intact.
        """
        self.segments.append(rows)

    def close(self, complete: bool = True) -> Path:
        """Close; when ``complete``, build the Minari dataset and publish it under its id.

        Raises:
            ValueError: ``complete`` while the last rows end inside an episode.
            DatasetWriteError: building the dataset failed; the staged rows are kept.
        """
        if not self.segments:
            return self.path if complete and self.path.exists() else self.tmp
        self.segments.close()
        if not complete:
            return self.tmp
        try:
            # Minari stores arrays uncompressed: about the staged size, plus metadata; the
            # compaction holds a second copy until it replaces the first.
            check_free_space(self.root, 3 * self.segments.size_bytes + 2**20)
            self._build()
            if self.compact:
                compact_episodes(self.tmp / "data" / "main_data.hdf5")
        except OSError as exc:
            shutil.rmtree(self.tmp / "data", ignore_errors=True)
            raise DatasetWriteError(
                f"building the Minari dataset in {self.tmp} failed ({exc}); the {self.rows} "
                f"rows appended are kept in {self.segments.folder}"
            ) from exc
        self.segments.remove()
        write_block_digests(self.tmp)
        self._write_namespaces()
        (self.tmp / PARTIAL_MARKER).unlink(missing_ok=True)
        os.replace(self.tmp, self.path)
        return self.path

    def _build(self) -> None:
        minari = require("minari", extra="offline")
        from minari.dataset.minari_storage import MinariStorage

        obs_space, act_space = box_spaces(self.spec)
        storage = MinariStorage.new(
            self.tmp / "data",
            observation_space=self.spaces[0] or obs_space,
            action_space=self.spaces[1] or act_space,
            env_spec=env_spec(self.spec),
            data_format="hdf5",
        )
        spec = self.spec
        storage.update_metadata(
            {
                "dataset_id": self.dataset_id,
                "minari_version": minari.__version__,
                "algorithm_name": str(spec.metadata.get("algorithm", "myriad")),
                "description": str(
                    spec.metadata.get(
                        "description",
                        f"transitions collected in {spec.metadata.get('env', 'an env')} "
                        "by a myriad population",
                    )
                ),
                "myriad": {
                    "myriad_version": __version__,
                    "feature_names": list(spec.feature_names),
                    **spec.metadata,
                },
            }
        )
        batch: list[Rows] = []
        batch_rows = 0
        for episode in _episodes(self.segments, spec):
            batch.append(episode)
            batch_rows += len(episode["rewards"])
            if batch_rows >= self.flush_rows:
                storage.update_episodes([self._buffer(e) for e in batch])
                batch, batch_rows = [], 0
        if batch:
            storage.update_episodes([self._buffer(e) for e in batch])

    def _buffer(self, episode: Rows) -> Any:
        from minari.data_collector import EpisodeBuffer

        infos: dict[str, np.ndarray] = {"member": episode["member"]}
        for i, name in enumerate(self.spec.feature_names):
            infos[name] = np.ascontiguousarray(episode["features"][:, i])
        return EpisodeBuffer(
            observations=np.concatenate(
                [episode["observations"], episode["next_observations"][-1:]]
            ),
            actions=episode["actions"],
            rewards=episode["rewards"],
            terminations=episode["terminals"],
            truncations=episode["timeouts"],
            infos=infos,
        )

    def _write_namespaces(self) -> None:
        """Namespace metadata files, as ``minari.create_namespace`` writes them."""
        parts = self.dataset_id.split("/")[:-1]
        for depth in range(1, len(parts) + 1):
            marker = self.root.joinpath(*parts[:depth]) / _NAMESPACE_FILE
            if not marker.exists():
                marker.parent.mkdir(parents=True, exist_ok=True)
                marker.write_text(json.dumps({}))


def compact_episodes(path: Path) -> None:
    """Rewrite Minari's ``main_data.hdf5`` with contiguous datasets, the same groups, arrays and
    attributes, so ``minari.load_dataset`` reads it unchanged.

    Minari writes each episode's arrays as chunked datasets, whose chunk index costs about
    23 KB per episode: more than the rows themselves for episodes of a few hundred steps.
    Contiguous datasets cost about 3 KB per episode (``benchmarks/minari_size.py``).
    """
    import h5py

    def copy(src: h5py.Group, dst: h5py.Group) -> None:
        dst.attrs.update(src.attrs)
        for key, item in src.items():
            if isinstance(item, h5py.Group):
                copy(item, dst.create_group(key, track_order=True))
            else:  # one episode's column: small, read whole
                dst.create_dataset(key, data=item[()]).attrs.update(item.attrs)

    tmp = path.with_name(f".{path.name}.compact")
    with h5py.File(path, "r") as src, h5py.File(tmp, "w", track_order=True) as dst:
        copy(src, dst)
    os.replace(tmp, path)


def _episodes(segments: RowSegments, spec: DatasetSpec) -> Iterator[Rows]:
    """Whole episodes from staged rows (an episode may span segments).

    Raises:
        ValueError: the rows end inside an episode.
    """
    carry: list[Rows] = []
    for rows in segments:
        start = 0
        for end in episode_ends(rows["terminals"], rows["timeouts"]):
            carry.append(take_rows(rows, slice(start, int(end))))
            yield concat_rows(carry, spec)
            carry = []
            start = int(end)
        if start < len(rows["rewards"]):
            carry.append(take_rows(rows, slice(start, None)))
    if carry:
        open_rows = sum(len(r["rewards"]) for r in carry)
        raise ValueError(
            f"the last {open_rows} rows end inside an episode (no terminal or timeout): "
            "a Minari episode needs its last step"
        )


class MinariReader:
    """Streaming reader of a Minari dataset folder (a :class:`DatasetReader`).

    Args:
        path: the dataset's folder (``<root>/<dataset_id>``) or its ``data/`` folder.

    Datasets written by other tools load too, with ``member`` 0 and no features unless their
    ``infos`` hold them.
    """

    format = "minari"

    def __init__(self, path: str | os.PathLike[str]) -> None:
        require("minari", extra="offline")
        from minari import MinariDataset

        path = Path(path)
        if path.name == "data" and (path / "metadata.json").exists():
            path = path.parent
        self.path = path
        if not path.exists() and _partial(path).exists():
            raise IncompleteDatasetError(f"{path} was not completed: only {_partial(path)} exists")
        if not (path / "data" / "metadata.json").exists():
            raise FileNotFoundError(f"{path} is not a Minari dataset (no data/metadata.json)")
        # Every byte is checked before any is read: Minari's files carry no checksums.
        if not check_block_digests(path):
            note_unverified(path, f"has no {DIGEST_FILE} (written by an older myriad or Minari)")
        self.dataset = MinariDataset(path / "data")
        meta = json.loads((path / "data" / "metadata.json").read_text())
        ours = dict(meta.get("myriad") or {})
        names = tuple(ours.pop("feature_names", ()))
        ours.pop("myriad_version", None)
        obs_space, act_space = self.dataset.observation_space, self.dataset.action_space
        self.spec = DatasetSpec(
            int(np.prod(obs_space.shape)),
            int(np.prod(act_space.shape)),
            names,
            {"minari_dataset_id": meta.get("dataset_id"), **ours},
        )

    @property
    def num_rows(self) -> int:
        return int(self.dataset.total_steps)

    def _rows(self, episode: Any) -> Rows:
        obs = np.asarray(episode.observations, dtype=np.float32).reshape(len(episode) + 1, -1)
        n = len(episode)
        infos = episode.infos or {}
        member = np.asarray(infos.get("member", np.zeros(n)), dtype=np.int32)
        feats = [np.asarray(infos[name], np.float32) for name in self.spec.feature_names]
        return {
            "observations": obs[:-1],
            "actions": np.asarray(episode.actions, np.float32).reshape(n, -1),
            "rewards": np.asarray(episode.rewards, np.float32),
            "next_observations": obs[1:],
            "terminals": np.asarray(episode.terminations, bool),
            "timeouts": np.asarray(episode.truncations, bool),
            "member": member,
            "features": np.stack(feats, 1) if feats else np.zeros((n, 0), np.float32),
        }

    def iter_chunks(self, chunk_rows: int = CHUNK_ROWS) -> Iterator[Rows]:
        """Whole episodes, batched to about ``chunk_rows`` rows (one long episode may exceed
        it)."""
        batch: list[Rows] = []
        count = 0
        for episode in self.dataset.iterate_episodes():
            rows = self._rows(episode)
            batch.append(rows)
            count += len(rows["rewards"])
            if count >= chunk_rows:
                yield concat_rows(batch, self.spec)
                batch, count = [], 0
        if batch:
            yield concat_rows(batch, self.spec)

    def close(self) -> None:
        """Nothing to release (Minari opens its file per read)."""

    def __enter__(self) -> MinariReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
