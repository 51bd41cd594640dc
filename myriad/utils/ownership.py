"""Which command owns which file: the one rule every writer of myriad follows.

Three promises, each kept by one function here:

- **A run's paths never collide.** :func:`check_run_paths` lists every path a run writes (its
  config, summary, checkpoints, lock, plots, videos, TensorBoard events and, when configured, its
  dataset and the dataset's staging folder) and refuses, before the run starts, two that are the
  same or one inside another, and any that leaves the run folder.
- **An output never replaces a run's file, nor a file its command did not make.**
  :func:`claim_output` is called by every command that takes ``--out`` (export, report, render):
  a path that is (or lies inside) a file or folder of a run is refused whatever the flags; an
  existing file the command did not write is refused unless ``--overwrite`` is given.
- **A staging folder is removed only by the command that made it.** :func:`make_partial` writes a
  marker file naming its command into each ``.partial`` folder; :func:`remove_partial` deletes a
  folder only when its marker names the same command.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from myriad.utils.config import LOCK_NAME, ConfigError

#: The marker file of a staging folder: ``{"command": ..., "pid": ...}``.
PARTIAL_MARKER = ".myriad-partial.json"
#: The name prefix of TensorBoard event files, written into the run folder itself.
EVENTS_PREFIX = "events.out.tfevents"

#: The roles of a run's files that no command other than the run itself may replace.
PROTECTED_ROLES = ("config", "summary", "checkpoints", "lock", "dataset", "dataset staging")


class OwnershipError(ConfigError):
    """A path belongs to something the command did not create; the message names the owner."""


def partial_path(path: Path) -> Path:
    """``<path>.partial``: where a writer stages the data of ``path``."""
    return path.with_name(path.name + ".partial")


def run_paths(run_dir: str | os.PathLike[str], config: Mapping[str, Any]) -> dict[str, Path]:
    """Every path a run of ``config`` writes in ``run_dir``, by role.

    Raises:
        ConfigError: ``dataset.path`` is absolute or climbs out of the run folder.
    """
    run = Path(run_dir)
    paths = {
        "config": run / "config.yaml",
        "summary": run / "summary.json",
        "checkpoints": run / "checkpoints",
        "lock": run / LOCK_NAME,
        "plots": run / "plots",
        "videos": run / "videos",
    }
    dataset = config.get("dataset")
    if isinstance(dataset, Mapping) and dataset.get("enabled"):
        if not dataset.get("path"):
            raise ConfigError(
                "dataset.path is empty: give a file name inside the run folder (for example "
                "dataset/transitions.hdf5), or dataset.enabled=false for no dataset"
            )
        rel = str(dataset["path"])
        target = (run.resolve() / rel).resolve()
        if Path(rel).is_absolute() or not target.is_relative_to(run.resolve()):
            raise ConfigError(
                f"dataset.path={rel!r} must be a file name inside the run folder (for example "
                "dataset/transitions.hdf5); a run writes only inside its own folder"
            )
        paths["dataset"] = run / rel
        paths["dataset staging"] = partial_path(run / rel)
    return paths


def _overlap(a: Path, b: Path) -> bool:
    return a == b or a.is_relative_to(b) or b.is_relative_to(a)


def check_run_paths(run_dir: str | os.PathLike[str], config: Mapping[str, Any]) -> dict[str, Path]:
    """:func:`run_paths`, refused in one line when two of them collide (the same path, or one
    inside the other), when one is the run folder itself, or when one would be taken for a
    TensorBoard event file. Called before a run writes anything.

    Raises:
        ConfigError: naming the configurable key, the two roles and the fix.
    """
    run = Path(run_dir).resolve()
    paths = run_paths(run_dir, config)
    if "dataset" not in paths:
        return paths
    resolved = {role: p.resolve() for role, p in paths.items()}
    key = f"dataset.path={config['dataset']['path']!r}"
    ours = ("dataset", "dataset staging")
    for mine in ours:
        p = resolved[mine]
        if p == run:
            raise ConfigError(f"{key} is the run folder itself: give a file name inside it")
        if p.parent == run and p.name.startswith(EVENTS_PREFIX):
            raise ConfigError(
                f"{key} would be taken for the run's TensorBoard events: choose another name "
                "(for example dataset/transitions.hdf5)"
            )
        for role, q in resolved.items():
            if role not in ours and _overlap(p, q):
                raise ConfigError(
                    f"{key} collides with the run's {role} ({paths[role]}): every file of a run "
                    "needs its own path; choose another name (for example "
                    "dataset/transitions.hdf5)"
                )
    return paths


def _run_of(path: Path) -> Path | None:
    for folder in (path, *path.parents):
        if (folder / "config.yaml").is_file():
            return folder
    return None


def _saved_config(run: Path) -> Mapping[str, Any]:
    """The run's config as far as ownership needs it (its dataset path); a config that cannot
    be read still protects the fixed files."""
    from omegaconf import OmegaConf

    try:
        loaded = OmegaConf.to_container(OmegaConf.load(run / "config.yaml"), resolve=False)
    except Exception:  # an unreadable config: keep the default dataset path
        loaded = None
    if isinstance(loaded, dict):
        return {str(k): v for k, v in loaded.items()}
    return {"dataset": {"enabled": True, "path": "dataset/transitions.hdf5"}}


def run_file_role(path: str | os.PathLike[str]) -> tuple[Path, str] | None:
    """``(run folder, role)`` when ``path`` is, or lies inside, a protected file or folder of
    a run (:data:`PROTECTED_ROLES`), else None."""
    target = Path(path).resolve()
    # Every run folder above the path (runs made before nesting was refused may nest).
    runs: list[Path] = []
    while (found := _run_of(runs[-1].parent if runs else target)) is not None:
        runs.append(found)
        if found == found.parent:
            break
    for run in runs:
        try:
            paths = run_paths(run, _saved_config(run))
        except ConfigError:
            paths = run_paths(run, {})
        for role in PROTECTED_ROLES:
            owned = paths.get(role)
            if owned is not None and target.is_relative_to(owned.resolve()):
                return run, role
        if target.parent == run.resolve() and target.name.startswith(EVENTS_PREFIX):
            return run, "TensorBoard events"
    return None


def check_new_run_dir(path: str | os.PathLike[str]) -> None:
    """Refuse a new run's folder that lies inside another run's folder (its files would mix
    with that run's, and ``--overwrite`` of either would take the other with it).

    Raises:
        OwnershipError: naming the run that holds ``path``.
    """
    target = Path(path).resolve()
    run = _run_of(target.parent)
    if run is not None:
        raise OwnershipError(
            f"{path} is inside the run {run}: a run folder never goes inside another run; "
            "choose a --run-dir outside it"
        )


def claim_output(
    path: str | os.PathLike[str],
    command: str,
    *,
    overwrite: bool = False,
    has_overwrite: bool = True,
    made_by_command: Callable[[Path], bool] | None = None,
) -> Path:
    """Check that ``command`` may write ``path`` (a file or folder given with ``--out``).

    Args:
        path: the output.
        command: the command's name in messages (``"report"``, ``"export"``, ...).
        overwrite: ``--overwrite`` was given: an existing output not made by ``command`` may be
            replaced (a run's files never may).
        has_overwrite: whether the command has ``--overwrite`` (for the message).
        made_by_command: whether an existing ``path`` was written by ``command`` (and so may be
            replaced without ``--overwrite``); None: nothing existing may be replaced.

    Raises:
        OwnershipError: ``path`` belongs to a run, or exists and was not made by ``command``.
    """
    target = Path(path)
    owner = run_file_role(target)
    if owner is not None:
        run, role = owner
        raise OwnershipError(
            f"{target} is the {role} of the run {run}: myriad {command} never writes over a "
            "run's files; choose another --out"
        )
    if target.exists() or target.is_symlink():
        mine = made_by_command is not None and made_by_command(target)
        if not mine and not overwrite:
            fix = " or pass --overwrite to replace it" if has_overwrite else ""
            raise OwnershipError(
                f"{target} exists and was not written by myriad {command}: choose another "
                f"--out{fix}"
            )
    return target


def make_partial(
    folder: str | os.PathLike[str],
    command: str,
    legacy: Callable[[Path], bool] | None = None,
) -> Path:
    """Create the staging folder ``folder`` with the marker naming ``command``, replacing one
    that ``command`` left (``legacy``: as in :func:`remove_partial`).

    Raises:
        OwnershipError: ``folder`` exists and was not made by ``command`` (see
            :func:`remove_partial`).
    """
    folder = Path(folder)
    remove_partial(folder, command, legacy)
    folder.mkdir(parents=True)
    mark_partial(folder, command)
    return folder


def mark_partial(folder: Path, command: str) -> None:
    """Write the marker of ``command`` into the existing staging folder ``folder``."""
    marker = folder / PARTIAL_MARKER
    marker.write_text(json.dumps({"command": command, "pid": os.getpid()}))


def partial_owner(folder: Path) -> str | None:
    """The command named by ``folder``'s marker, or None (no readable marker)."""
    try:
        data = json.loads((folder / PARTIAL_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return str(data.get("command")) if isinstance(data, dict) else None


def remove_partial(
    folder: str | os.PathLike[str],
    command: str,
    legacy: Callable[[Path], bool] | None = None,
) -> bool:
    """Delete the staging folder ``folder`` if ``command`` made it; returns whether it existed.

    Args:
        legacy: accepts a folder without a marker that an older myriad's ``command`` wrote.

    Raises:
        OwnershipError: ``folder`` exists and its marker names no command, or another one.
    """
    folder = Path(folder)
    if not folder.exists() and not folder.is_symlink():
        return False
    owner = partial_owner(folder) if folder.is_dir() and not folder.is_symlink() else None
    if owner != command and not (owner is None and legacy is not None and legacy(folder)):
        made = f"was made by myriad {owner}" if owner else "was not made by myriad " + command
        raise OwnershipError(
            f"{folder} exists and {made}: myriad removes only the staging folders it made; "
            "move it away (or delete it yourself) and run again"
        )
    shutil.rmtree(folder)
    return True
