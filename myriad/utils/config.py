"""Composing run configs with Hydra from the configs shipped inside the package."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf


class ConfigError(ValueError):
    """A config override or saved config is unusable; the message names the key."""


class PretrainConfigError(ConfigError):
    """A pretraining config cannot work (population layout, k); the message says what to
    change."""


def config_dir() -> Path:
    """The folder of the packaged Hydra configs (``myriad/configs``)."""
    return Path(str(resources.files("myriad") / "configs"))


def compose(name: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Compose ``configs/<name>.yaml`` with Hydra ``overrides`` into a plain, resolved dict.

    Raises:
        ConfigError: an override names an unknown key or group option (Hydra's message, plus the
            available options of config groups).
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg: DictConfig = hydra_compose(config_name=name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException) as exc:
        raise ConfigError(f"{exc}\n{group_options_hint()}") from exc
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def group_options_hint() -> str:
    """Available options of every config group, e.g. ``env: empty, maze, ...``."""
    lines = ["config groups:"]
    for group in sorted(p for p in config_dir().iterdir() if p.is_dir()):
        options = sorted(f.stem for f in group.glob("*.yaml"))
        lines.append(f"  {group.name}: {', '.join(options)}")
    return "\n".join(lines)


def load_run_config(run: str | Path) -> dict[str, Any]:
    """The resolved ``config.yaml`` of a run folder (or of the run holding a checkpoint)."""
    path = Path(run)
    for candidate in (path, path.parent, path.parent.parent):
        cfg_file = candidate / "config.yaml"
        if candidate.is_dir() and cfg_file.is_file():
            return OmegaConf.to_container(OmegaConf.load(cfg_file), resolve=True)  # type: ignore[return-value]
    raise FileNotFoundError(f"no config.yaml found for run {run}: give a run folder or checkpoint")


def resumed_config(run: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """A run's saved config with ``overrides`` applied on top; the runner then refuses overrides
    that would change the experiment (see ``RunnerBase.RESUME_IGNORED_KEYS``)."""
    saved = OmegaConf.create(load_run_config(run))
    if overrides:
        saved = OmegaConf.merge(saved, OmegaConf.from_dotlist(list(overrides)))
    return OmegaConf.to_container(saved, resolve=True)  # type: ignore[return-value]


def run_folder(path: str | Path) -> Path:
    """The run folder holding ``path`` (a run folder, its ``checkpoints/`` or a checkpoint)."""
    path = Path(path)
    while path != path.parent and not (path / "config.yaml").is_file():
        path = path.parent
    return path


def output_folder(
    kind: str,
    name: str,
    cfg: Mapping[str, Any],
    resume: str | Path | None = None,
    run_dir: str | Path | None = None,
) -> Path:
    """Where a run writes: the resumed run's folder, else ``run_dir`` (argument, then config),
    else ``runs/<kind>/<name>-<date>-<time>``."""
    if resume is not None:
        return run_folder(resume)
    if run_dir or cfg.get("run_dir"):
        return Path(run_dir or cfg["run_dir"])
    return default_run_dir(kind, name)


def default_run_dir(kind: str, env_name: str, root: str | Path = "runs") -> Path:
    """``runs/<kind>/<env>-<date>-<time>`` (unique within a second)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / kind / f"{env_name}-{stamp}"
    path, n = base, 1
    while path.exists():
        path = base.with_name(f"{base.name}-{n}")
        n += 1
    return path
