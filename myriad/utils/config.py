"""Composing run configs with Hydra from the configs shipped inside the package."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, ListConfig, OmegaConf

#: The lock file of a run folder (see :mod:`myriad.utils.runlock`).
LOCK_NAME = ".myriad.lock"


class ConfigError(ValueError):
    """A config override or saved config is unusable; the message names the key."""


def config_dir() -> Path:
    """The folder of the packaged Hydra configs (``myriad/configs``)."""
    return Path(str(resources.files("myriad") / "configs"))


class RunFolderError(ConfigError):
    """The run folder cannot be used as asked (it holds another run, or is not a run)."""


def compose(name: str, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Compose ``configs/<name>.yaml`` with Hydra ``overrides`` into a plain, resolved dict,
    and check it (every key's type against the packaged default, ranges, the device).

    Raises:
        ConfigError: an override names an unknown key or group option (Hydra's message, plus the
            available options of config groups), or a value of the wrong type or range.
    """
    from myriad.utils.validation import check_config

    cfg = _compose(name, overrides)
    groups = {p.name for p in config_dir().iterdir() if p.is_dir()}
    choices = [o for o in overrides if o.partition("=")[0].lstrip("+~") in groups]
    check_config(cfg, _compose(name, choices) if len(choices) < len(overrides) else cfg)
    return cfg


def _compose(name: str, overrides: Sequence[str]) -> dict[str, Any]:
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3"):
            cfg: DictConfig = hydra_compose(config_name=name, overrides=list(overrides))
    except (HydraException, OmegaConfBaseException, ValueError) as exc:
        # ValueError: Hydra's word for a group option that is not a name (env=5).
        raise ConfigError(f"{exc}\n{group_options_hint()}") from exc
    resolved = _resolved_mapping(cfg)
    assert resolved is not None  # hydra composes a mapping
    return resolved


def _resolved_mapping(cfg: DictConfig | ListConfig) -> dict[str, Any] | None:
    """``cfg`` resolved into plain dicts and lists; None when it is not a mapping.

    OmegaConf types the result as any container; the keys of myriad's configs are strings.
    """
    container = OmegaConf.to_container(cfg, resolve=True)
    return cast("dict[str, Any]", container) if isinstance(container, dict) else None


def group_options_hint() -> str:
    """Available options of every config group, e.g. ``env: empty, maze, ...``."""
    lines = ["config groups:"]
    for group in sorted(p for p in config_dir().iterdir() if p.is_dir()):
        options = sorted(f.stem for f in group.glob("*.yaml"))
        lines.append(f"  {group.name}: {', '.join(options)}")
    return "\n".join(lines)


def load_run_config(run: str | Path) -> dict[str, Any]:
    """The resolved ``config.yaml`` of a run folder (or of the run holding a checkpoint)."""
    from omegaconf.errors import OmegaConfBaseException
    from yaml import YAMLError

    path = Path(run)
    for candidate in (path, path.parent, path.parent.parent):
        cfg_file = candidate / "config.yaml"
        if candidate.is_dir() and cfg_file.is_file():
            from myriad.utils.digest import read_config_text

            text = read_config_text(cfg_file)
            try:
                loaded = _resolved_mapping(OmegaConf.create(text))
            except (YAMLError, OmegaConfBaseException, UnicodeDecodeError, ValueError) as exc:
                raise ConfigError(
                    f"{cfg_file} is not a readable run config ({str(exc).splitlines()[0]}): "
                    "restore it from the run's checkpoint or start a new run"
                ) from exc
            if loaded is None or "env" not in loaded:
                raise ConfigError(
                    f"{cfg_file} is not a myriad run config (no env section): restore it or "
                    "start a new run"
                )
            from myriad.utils.migrations import migrate_config
            from myriad.utils.validation import check_saved_config

            migrate_config(loaded)

            kind = next((k for k, marker in _KIND_MARKERS.items() if marker in loaded), None)
            if kind is not None:
                check_saved_config(loaded, kind, str(cfg_file))
            return loaded
    if vacant(path):
        raise FileNotFoundError(
            f"{path} holds no run yet (it was stopped before writing its config.yaml): start it "
            f"again with the same command and --run-dir {path}"
        )
    raise FileNotFoundError(f"no config.yaml found for run {run}: give a run folder or checkpoint")


#: The config section that only runs of each command have.
_KIND_MARKERS = {"pretrain": "objective", "finetune": "algo"}


def resumed_config(
    run: str | Path,
    overrides: Sequence[str] = (),
    kind: str | None = None,
    schema: Callable[[Mapping[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """A run's saved config with ``overrides`` applied on top; the runner then refuses overrides
    that would change the experiment (see ``RunnerBase.RESUME_IGNORED_KEYS``).

    Args:
        schema: the command's schema check (e.g.
            :func:`myriad.finetune.settings.check_finetune_config`), applied to the saved
            config (messages then name the file) and to the result.

    Raises:
        ConfigError: the run is not of ``kind`` (``"pretrain"`` or ``"finetune"``), the saved
            config or an override has the wrong type or range.
    """
    from omegaconf.errors import OmegaConfBaseException

    from myriad.utils.validation import check_config

    original = load_run_config(run)
    if kind is not None and _KIND_MARKERS[kind] not in original:
        other = next(k for k, marker in _KIND_MARKERS.items() if marker in original)
        hint = " (or start finetuning from it with --init)" if other == "pretrain" else ""
        raise ConfigError(
            f"{run} is a run of myriad {other}, not {kind}: resume it with "
            f"myriad {other} --resume {run}{hint}"
        )
    if schema is not None:
        try:
            schema(original)
        except ConfigError as exc:
            raise ConfigError(
                f"{run_folder(run) / 'config.yaml'}: {exc}; fix the key in the file, or start a "
                "new run"
            ) from exc
    saved: DictConfig | ListConfig = OmegaConf.create(original)
    if overrides:
        try:
            saved = OmegaConf.merge(saved, OmegaConf.from_dotlist(list(overrides)))
        except OmegaConfBaseException as exc:
            raise ConfigError(f"cannot apply {list(overrides)}: {exc}") from exc
    cfg = _resolved_mapping(saved)
    assert cfg is not None  # a mapping merged with dotted overrides stays a mapping
    check_config(cfg, original)
    if schema is not None:
        schema(cfg)
    return cfg


def run_folder(path: str | os.PathLike[str]) -> Path:
    """The run folder holding ``path`` (a run folder, its ``checkpoints/`` or a checkpoint)."""
    path = Path(path)
    while path != path.parent and not (path / "config.yaml").is_file():
        path = path.parent
    return path


def output_folder(
    kind: str,
    name: str,
    cfg: Mapping[str, Any],
    resume: str | os.PathLike[str] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
) -> Path:
    """Claim the folder a run writes to: the resumed run's folder, else ``run_dir`` (argument,
    then config), else a new ``runs/<kind>/<name>-<date>-<time>``. A new run's folder exists
    when this returns and belongs to it alone.

    Raises:
        RunFolderError: ``run_dir`` already holds files and ``overwrite`` is false, or
            ``overwrite`` is asked for a non-empty folder that is not a myriad run.
        ConfigError: two paths of the run collide, or one leaves the run folder
            (:func:`myriad.utils.ownership.check_run_paths`).
    """
    from myriad.utils.ownership import check_run_paths

    # Before anything is created: a refused layout leaves no folder behind.
    check_run_paths(
        run_folder(resume) if resume is not None else Path(run_dir or cfg.get("run_dir") or "run"),
        cfg,
    )
    if resume is not None:
        return run_folder(resume)
    if run_dir or cfg.get("run_dir"):
        return claim_folder(Path(run_dir or cfg["run_dir"]), overwrite)
    return default_run_dir(kind, name)


def claim_folder(path: Path, overwrite: bool = False) -> Path:
    """Create ``path`` for a new run; an existing non-empty folder is refused unless
    ``overwrite`` (then it must be a myriad run folder, and its content is deleted)."""
    import shutil

    from myriad.utils.ownership import check_new_run_dir

    check_new_run_dir(path)
    if path.exists() and not vacant(path):
        from myriad.utils.runlock import check_not_in_use

        check_not_in_use(path)  # a run in progress: say who holds it, not "use --resume"
        if not overwrite:
            raise RunFolderError(
                f"{path} already holds a run or other files: continue it with --resume {path}, "
                "choose another --run-dir, or pass --overwrite to replace it"
            )
        if not (path / "config.yaml").is_file():
            raise RunFolderError(
                f"--overwrite replaces only myriad run folders, and {path} has no config.yaml: "
                "choose another --run-dir"
            )
        from myriad.utils.runlock import RunLock

        with RunLock(path, "overwrite"):  # never the folder of a run in progress
            shutil.rmtree(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise RunFolderError(
            f"cannot create the run folder {path}: {exc.strerror or exc}; choose a --run-dir "
            "in a folder you can write to"
        ) from exc
    return path


def vacant(path: Path) -> bool:
    """Whether ``path`` is a folder without any file but a run's lock file (in empty
    folders): what a run stopped before writing its config leaves, and what a new run may use."""
    return path.is_dir() and not any(p.is_file() and p != path / LOCK_NAME for p in path.rglob("*"))


def release_folder(path: Path) -> None:
    """Remove a run folder that a failed start left without any file (:func:`vacant`)."""
    if not vacant(path):
        return
    for sub in sorted(path.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        sub.unlink() if sub.is_file() else sub.rmdir()
    path.rmdir()


def default_run_dir(kind: str, env_name: str, root: str | Path = "runs") -> Path:
    """Create and return ``runs/<kind>/<env>-<date>-<time>`` (``-N`` appended when taken). The
    folder is created here, atomically, so two processes never get the same one."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(root) / kind / f"{env_name}-{stamp}"
    base.parent.mkdir(parents=True, exist_ok=True)
    path, n = base, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            path = base.with_name(f"{base.name}-{n}")
            n += 1
