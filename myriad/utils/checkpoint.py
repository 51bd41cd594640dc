"""Checkpoint files: atomic writes, library versions, RNG states and config comparison.

A checkpoint is a dict saved with ``torch.save`` whose content loads with
``torch.load(weights_only=True)``: tensors, numbers, strings and containers only (the NumPy RNG
state is stored as a tensor for that reason), so loading a checkpoint runs no pickled code.
"""

from __future__ import annotations

import fnmatch
import io
import os
import pickle
import platform
import re
import sys
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myriad.utils.seeding import rng_state, set_rng_state

#: 2: a ``digest`` of the content (:func:`myriad.utils.digest.payload_digest`), checked on load.
FORMAT_VERSION = 2
CHECKPOINT_PATTERN = re.compile(r"^iter_(\d+)\.pt$")


class ConfigMismatchError(ValueError):
    """A run is resumed with a config that differs from the checkpoint's."""


class CheckpointError(ValueError):
    """A file is not a usable myriad checkpoint (truncated, foreign, of another runner)."""


def library_versions() -> dict[str, str]:
    """Versions of Python, myriad and the libraries whose numerics a run depends on."""
    out = {"python": platform.python_version(), "torch": str(torch.__version__)}
    for dist, key in (("myriad-rl", "myriad"), ("numpy", "numpy")):
        try:
            out[key] = version(dist)
        except PackageNotFoundError:
            out[key] = "not installed"
    out["cuda"] = str(torch.version.cuda) if torch.version.cuda else "none"
    return out


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename,
    so readers (and a crash mid-write) never see a partial file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror, str(path)) from exc
    try:
        # mkstemp creates the file private (0600); the result gets the permissions any new
        # file of this process gets, so a shared run folder stays readable to its group.
        os.fchmod(fd, 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        # A failed write names the file it was for, not the temporary one (or none at all).
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """:func:`atomic_write_bytes` for UTF-8 text."""
    return atomic_write_bytes(path, text.encode("utf-8"))


def save_checkpoint(path: str | os.PathLike[str], payload: Mapping[str, Any]) -> Path:
    """Atomically save ``payload`` with ``format``, ``versions`` and ``digest`` entries added
    (the digest covers every tensor's bytes and every other value)."""
    from myriad.utils.digest import payload_digest

    content = {"format": FORMAT_VERSION, "versions": library_versions(), **payload}
    content["digest"] = payload_digest(content)
    buffer = io.BytesIO()
    torch.save(content, buffer)
    return atomic_write_bytes(path, buffer.getvalue())


def load_checkpoint(
    path: str | os.PathLike[str], map_location: torch.device | str = "cpu"
) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save_checkpoint` (no pickled code is executed).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointError: the file is truncated, not a checkpoint, holds Python objects that a
            safe load refuses, was written by a newer checkpoint format, or fails its digest
            check (its bytes changed after it was written).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    if not zipfile.is_zipfile(path):  # torch.save writes a zip archive
        raise CheckpointError(
            f"{path} is not a readable checkpoint (truncated or another kind of file): give a "
            "checkpoints/iter_NNNNNN.pt file written by myriad pretrain or myriad finetune"
        )
    try:
        payload = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        # torch's message suggests weights_only=False, which would run code from the file:
        # it is not repeated.
        raise CheckpointError(
            f"{path} is not a myriad checkpoint: it holds Python objects that myriad does not "
            "load, since loading them could run code from the file"
        ) from exc
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as exc:
        raise CheckpointError(
            f"{path} is not a readable checkpoint (truncated or another kind of file): "
            f"{_first_line(exc)}"
        ) from exc
    if not isinstance(payload, dict) or "config" not in payload or "state" not in payload:
        raise CheckpointError(
            f"{path} is not a myriad checkpoint (no config and state): give a file written by "
            "myriad pretrain or myriad finetune (checkpoints/iter_NNNNNN.pt)"
        )
    fmt = payload.get("format", 0)
    if fmt > FORMAT_VERSION:
        raise CheckpointError(
            f"{path} has checkpoint format {fmt}; this myriad reads up to {FORMAT_VERSION}: "
            "upgrade myriad"
        )
    from myriad.utils.digest import payload_digest

    digest = payload.pop("digest", None)
    if digest is None:
        _note_unverified(path)
    elif digest != payload_digest(payload):
        raise CheckpointError(
            f"{path} failed its digest check: its bytes changed after it was written (a disk "
            "or copy error); use an earlier checkpoint of the run (checkpoints/iter_NNNNNN.pt)"
        )
    from myriad.utils.migrations import migrate_checkpoint

    return migrate_checkpoint(payload)


_unverified_noted: set[str] = set()


def _note_unverified(path: Path) -> None:
    """One line per file and process: a checkpoint of an older myriad has no digest."""
    key = str(path.resolve())
    if key not in _unverified_noted:
        _unverified_noted.add(key)
        print(
            f"myriad: note: {path} has no digest (written by an older myriad): loaded unverified",
            file=sys.stderr,
        )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def load_latest_checkpoint(
    path: str | os.PathLike[str], map_location: torch.device | str = "cpu"
) -> tuple[Path, dict[str, Any]]:
    """The newest readable checkpoint of a run folder or ``checkpoints/`` folder (or the file
    ``path``), with its payload. An unreadable newer checkpoint (a disk error, a truncated copy)
    is reported in one warning line on stderr and skipped for the previous one.

    Raises:
        FileNotFoundError: nothing resumable at ``path``.
        CheckpointError: ``path`` is a file that is not a usable checkpoint, or no checkpoint of
            the folder is readable.
    """
    path = Path(path)
    if path.is_file():
        return path, load_checkpoint(path, map_location)
    candidates = list_checkpoints(path / "checkpoints") or list_checkpoints(path)
    if not candidates:
        resolve_checkpoint(path)  # raises FileNotFoundError with where it looked
    errors = []
    for candidate in reversed(candidates):
        try:
            payload = load_checkpoint(candidate, map_location)
        except CheckpointError as exc:
            errors.append(str(exc))
            continue
        if errors:
            print(
                f"myriad: warning: skipped {len(errors)} unreadable checkpoint(s) "
                f"({errors[0]}); resuming from {candidate}",
                file=sys.stderr,
            )
        return candidate, payload
    raise CheckpointError(f"no readable checkpoint in {path}: {errors[0]}")


def remove_partial_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files of checkpoint writes that were killed midway (they are never
    read); returns what was removed. Only the run's own writer calls this."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    stale = [p for p in directory.glob(".iter_*.pt.*.tmp") if p.is_file()]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


def checkpoint_path(directory: str | os.PathLike[str], iteration: int) -> Path:
    """``directory/iter_{iteration:06d}.pt``."""
    return Path(directory) / f"iter_{iteration:06d}.pt"


def list_checkpoints(directory: str | os.PathLike[str]) -> list[Path]:
    """Checkpoints in ``directory`` ordered by iteration."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in directory.iterdir() if (m := CHECKPOINT_PATTERN.match(p.name))
    ]
    return [p for _, p in sorted(found)]


def latest_checkpoint(directory: str | os.PathLike[str]) -> Path | None:
    """The checkpoint with the highest iteration in ``directory``, or None."""
    found = list_checkpoints(directory)
    return found[-1] if found else None


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """A checkpoint file from a file, a ``checkpoints/`` directory or a run directory.

    Raises:
        FileNotFoundError: nothing resumable there (the message says where it looked).
    """
    path = Path(path)
    if path.is_file():
        return path
    for directory in (path / "checkpoints", path):
        found = latest_checkpoint(directory)
        if found is not None:
            return found
    raise FileNotFoundError(
        f"no checkpoint at {path}: expected a .pt file, a run directory with checkpoints/, "
        f"or a checkpoints directory holding iter_NNNNNN.pt files"
    )


def capture_rng_state() -> dict[str, Any]:
    """:func:`myriad.utils.seeding.rng_state` in a ``weights_only``-loadable form."""
    state = rng_state()
    name, keys, pos, has_gauss, cached = state["numpy"]
    state["numpy"] = {
        "name": name,
        "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Restore a state captured by :func:`capture_rng_state`."""
    state = dict(state)
    np_state = state["numpy"]
    state["numpy"] = (
        np_state["name"],
        np_state["keys"].numpy().astype(np.uint32),
        np_state["pos"],
        np_state["has_gauss"],
        np_state["cached_gaussian"],
    )
    set_rng_state(state)


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as one dict with dotted keys (``{"a": {"b": 1}} -> {"a.b": 1}``)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(flatten_config(value, f"{name}."))
        else:
            out[name] = value
    return out


def config_diff(
    saved: Mapping[str, Any], current: Mapping[str, Any], ignore: Iterable[str] = ()
) -> list[tuple[str, Any, Any]]:
    """``(key, saved value, current value)`` for every dotted key that differs.

    A key missing on one side shows as ``"<absent>"``. Keys matching any ``fnmatch`` pattern in
    ``ignore`` are skipped.
    """
    a, b = flatten_config(saved), flatten_config(current)
    patterns = list(ignore)
    missing = "<absent>"
    out = []
    for key in sorted(set(a) | set(b)):
        if any(fnmatch.fnmatchcase(key, p) for p in patterns):
            continue
        va, vb = a.get(key, missing), b.get(key, missing)
        if va != vb:
            out.append((key, va, vb))
    return out


def check_resume_config(
    saved: Mapping[str, Any],
    current: Mapping[str, Any],
    ignore: Iterable[str],
    source: str | os.PathLike[str],
) -> None:
    """Raise :class:`ConfigMismatchError` listing each differing key, unless none differ."""
    ignore = list(ignore)
    diff = config_diff(saved, current, ignore)
    if not diff:
        return
    lines = [f"  {key}: checkpoint={old!r}, now={new!r}" for key, old, new in diff]
    raise ConfigMismatchError(
        f"cannot resume from {source}: the config differs from the checkpoint's in "
        f"{len(diff)} key(s):\n"
        + "\n".join(lines)
        + "\nStart a new run for a different config. Keys allowed to change on resume: "
        + ", ".join(ignore)
    )
