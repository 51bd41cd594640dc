"""Digests that make every file a run writes verifiable when it is read.

- Checkpoints: :func:`payload_digest`, a SHA-256 over the checkpoint's content (every tensor's
  dtype, shape and bytes, every key, number and string, in a fixed order), stored in the
  checkpoint itself and recomputed by every load (:func:`myriad.utils.checkpoint.load_checkpoint`).
- ``config.yaml``: its first line is a YAML comment ``# myriad-digest sha256:<hex>`` of the
  bytes after it (:func:`write_config_file`, :func:`read_config_text`).
- ``summary.json``: a ``"digest"`` key holding the SHA-256 of the other keys in canonical JSON
  (:func:`summary_text`, :func:`read_summary`).

Files without a digest (written by an older myriad) are read as before.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from myriad.utils.config import ConfigError

CONFIG_PREFIX = "# myriad-digest sha256:"


class DigestError(ConfigError):
    """A file's content does not match the digest written with it (its bytes changed)."""


def _feed(h: Any, obj: Any) -> None:
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)};".encode())
        h.update(t.view(torch.uint8).numpy())
    elif isinstance(obj, Mapping):
        h.update(f"D{len(obj)};".encode())
        for key in sorted(obj, key=repr):
            _feed(h, key)
            _feed(h, obj[key])
    elif isinstance(obj, (list, tuple)):
        h.update(f"{'L' if isinstance(obj, list) else 'U'}{len(obj)};".encode())
        for item in obj:
            _feed(h, item)
    elif isinstance(obj, str):
        data = obj.encode("utf-8", "surrogatepass")
        h.update(f"S{len(data)};".encode())
        h.update(data)
    elif isinstance(obj, bytes):
        h.update(f"B{len(obj)};".encode())
        h.update(obj)
    else:  # numbers, bools, None, dtypes, devices: their repr is exact and stable
        h.update(f"{type(obj).__name__}:{obj!r};".encode())


def payload_digest(payload: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of a checkpoint payload (the ``digest`` key itself left out)."""
    h = hashlib.sha256()
    _feed(h, {k: v for k, v in payload.items() if k != "digest"})
    return f"sha256:{h.hexdigest()}"


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def config_text(body: str) -> str:
    """``body`` (YAML) with its digest line first."""
    return f"{CONFIG_PREFIX}{_text_digest(body)}\n{body}"


def write_config_file(path: str | os.PathLike[str], config: Mapping[str, Any]) -> Path:
    """Atomically write ``config`` as YAML with its digest line."""
    from omegaconf import OmegaConf

    from myriad.utils.checkpoint import atomic_write_text

    return atomic_write_text(path, config_text(OmegaConf.to_yaml(dict(config))))


def read_config_text(path: str | os.PathLike[str]) -> str:
    """The text of a run's ``config.yaml``, checked against its digest line when it has one.

    Raises:
        DigestError: the content differs from what the run wrote.
    """
    path = Path(path)
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DigestError(
            f"{path} is not a readable run config (bytes changed after the run wrote it: "
            f"{exc}): restore it from a copy or start a new run"
        ) from exc
    first, _, body = text.partition("\n")
    if first.startswith(CONFIG_PREFIX) and first[len(CONFIG_PREFIX) :].strip() != _text_digest(
        body
    ):
        raise DigestError(
            f"{path} was changed after the run wrote it (its digest line does not match): "
            "restore it from a copy, or start a new run"
        )
    return text


def summary_text(summary: Mapping[str, Any]) -> str:
    """``summary`` as indented JSON with a ``"digest"`` of its canonical form."""
    # Through JSON once, so the digest is of what a reader gets back (integer keys become
    # strings, tuples lists).
    body = json.loads(json.dumps({k: v for k, v in summary.items() if k != "digest"}, default=str))
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    digest = f"sha256:{_text_digest(canonical)}"
    return json.dumps({**body, "digest": digest}, indent=2, sort_keys=True, default=str) + "\n"


def read_summary(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A run's ``summary.json``, checked against its digest when it has one.

    Raises:
        DigestError: the file is not JSON, or its content differs from what the run wrote.
    """
    path = Path(path)
    try:
        loaded = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise DigestError(
            f"{path} is not readable JSON ({str(exc).splitlines()[0]}): its bytes changed after "
            "the run wrote it; resume the run to write it again (--resume RUN)"
        ) from exc
    if not isinstance(loaded, dict):
        raise DigestError(f"{path} is not a run summary (not a JSON object)")
    digest = loaded.pop("digest", None)
    if digest is not None:
        canonical = json.dumps(loaded, sort_keys=True, separators=(",", ":"), default=str)
        if digest != f"sha256:{_text_digest(canonical)}":
            raise DigestError(
                f"{path} was changed after the run wrote it (its digest does not match): "
                "resume the run to write it again (--resume RUN)"
            )
    return loaded
