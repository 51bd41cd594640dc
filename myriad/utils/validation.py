"""Checking a run config before anything is built: every key's type, and the range of the keys
whose bad values would otherwise fail late, deep in a library, or run a wrong experiment.

Types come from the packaged configs themselves: a key whose default is an integer must stay an
integer, and so on, so every key of every config group is checked without a second schema to keep
in step. Ranges, and the keys of the sections with a schema, are each command's schema
(``myriad.pretrain.settings``, ``myriad.finetune.settings``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from myriad.utils.checkpoint import flatten_config
from myriad.utils.config import ConfigError


def _kind(value: Any) -> str | None:
    """The type class a value must keep: ``bool``, ``int``, ``number``, ``str``, ``list``,
    ``mapping`` (None: no constraint, e.g. a null default or an interpolation such as
    ``${..id}``, whose type is the one of the key it copies)."""
    if isinstance(value, str) and value.startswith("${"):
        return None
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "str"
    if isinstance(value, list | tuple):
        return "list"
    if isinstance(value, Mapping):
        return "mapping"
    return None


_KIND_WORDS = {
    "bool": "true or false",
    "int": "an integer",
    "number": "a number",
    "str": "a string",
    "list": "a list like [1, 2]",
    "mapping": "a mapping like {a: 1}",
}


def _fits(kind: str, value: Any) -> bool:
    if value is None:
        return True  # null switches a feature off where the code allows it; ranges decide
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return _kind(value) == kind


def check_types(config: Mapping[str, Any], reference: Mapping[str, Any]) -> None:
    """Every key of ``config`` that ``reference`` (the packaged default) also has keeps the
    default's type.

    Raises:
        ConfigError: naming the key, the value given, the type wanted and the default.
    """
    given = flatten_config(config)
    expected = flatten_config(reference)
    # A section replaced by a scalar (ppo=5) flattens to a key the reference nests under.
    for key in expected:
        parts = key.split(".")
        for depth in range(1, len(parts)):
            section = ".".join(parts[:depth])
            if section in given:
                raise ConfigError(
                    f"{section}={given[section]!r} must be {_KIND_WORDS['mapping']} (set one "
                    f"of its keys instead, e.g. {key}={expected[key]!r})"
                )
    for key, default in expected.items():
        kind = _kind(default)
        if kind is None or key not in given:
            continue
        value = given[key]
        if isinstance(value, Mapping) and not value and kind == "mapping":
            continue
        if not _fits(kind, value):
            raise ConfigError(
                f"{key}={value!r} must be {_KIND_WORDS[kind]} (the default is {key}={default!r})"
            )


def check_device(device: str) -> None:
    """Raise :class:`ConfigError` if ``device`` is not a torch device this machine has."""
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(
            f"device={device!r} is not a device name: use cpu, cuda or cuda:N"
        ) from exc
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(
                f"device={device} but this machine has no usable CUDA GPU (or torch is a CPU "
                "build): use device=cpu, or install a CUDA build of torch"
            )
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(
                f"device={device} but this machine has {torch.cuda.device_count()} GPU(s)"
            )
    elif dev.type != "cpu":
        raise ConfigError(f"device={device!r} is not supported: use cpu or cuda[:N]")


def check_config(config: Mapping[str, Any], reference: Mapping[str, Any]) -> None:
    """Types against ``reference`` and the device: the checks that need no schema (each
    command then checks its schema: ``myriad.<command>.settings``). Raises
    :class:`ConfigError` naming the key and the fix."""
    check_types(config, reference)
    check_device(str(config.get("device", "cpu")))


def _packaged_kinds(kind: str) -> dict[str, set[str]]:
    """Every dotted key of ``configs/<kind>.yaml`` and of every option of its config groups,
    with the types their packaged values have (a key may differ between options, e.g. an env's
    options)."""
    from omegaconf import OmegaConf

    from myriad.utils.config import config_dir

    root = config_dir()
    kinds: dict[str, set[str]] = {}

    def add(mapping: Any, prefix: str = "") -> None:
        if not isinstance(mapping, Mapping):
            return
        for key, value in flatten_config(mapping).items():
            name = f"{prefix}{key}"
            found = _kind(value)
            if found is not None:
                kinds.setdefault(name, set()).add(found)
            # Every section above a key must stay a mapping.
            parts = name.split(".")
            for depth in range(1, len(parts)):
                kinds.setdefault(".".join(parts[:depth]), set()).add("mapping")

    main = OmegaConf.to_container(OmegaConf.load(root / f"{kind}.yaml"), resolve=False)
    if isinstance(main, dict):
        main.pop("defaults", None)
        add(main)
    for group in sorted(p for p in root.iterdir() if p.is_dir()):
        for option in sorted(group.glob("*.yaml")):
            text = option.read_text()
            loaded = OmegaConf.to_container(OmegaConf.create(text), resolve=False)
            add(loaded, "" if "@package _global_" in text else f"{group.name}.")
    return kinds


_KINDS_CACHE: dict[str, dict[str, set[str]]] = {}


def check_saved_config(config: Mapping[str, Any], kind: str, source: str) -> None:
    """Check a config read from disk (a run's ``config.yaml``) as overrides are checked: every
    key the packaged configs know keeps one of their types and every section stays a mapping
    (the command's schema checks ranges on resume). Messages name ``source`` and the key.

    Raises:
        ConfigError: ``"<source>: <key>=<value> must be ..."``.
    """
    if kind not in _KINDS_CACHE:
        _KINDS_CACHE[kind] = _packaged_kinds(kind)
    kinds = _KINDS_CACHE[kind]
    flat = flatten_config(config)
    # Sections replaced by a scalar show up as a flat key that the packaged configs nest under.
    for key, value in flat.items():
        allowed = kinds.get(key)
        if not allowed or (value is None and "mapping" not in allowed):
            continue
        if isinstance(value, Mapping) and not value and "mapping" in allowed:
            continue
        if not any(_fits(k, value) for k in allowed):
            wanted = " or ".join(sorted(_KIND_WORDS[k] for k in allowed))
            raise ConfigError(
                f"{source}: {key}={value!r} must be {wanted}; fix the key in the file, or start "
                "a new run"
            )
