"""Checking a run config before anything is built: every key's type, and the range of the keys
whose bad values would otherwise fail late, deep in a library, or run a wrong experiment.

Types come from the packaged configs themselves: a key whose default is an integer must stay an
integer, and so on, so every key of every config group is checked without a second schema to keep
in step. Ranges are the table :data:`RANGES`.
"""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable, Mapping
from typing import Any

from myriad.utils.checkpoint import flatten_config
from myriad.utils.config import ConfigError


def _kind(value: Any) -> str | None:
    """The type class a value must keep: ``bool``, ``int``, ``number``, ``str``, ``list``,
    ``mapping`` (None: no constraint, e.g. a null default)."""
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
    for key, default in flatten_config(reference).items():
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


def _at_least(low: float) -> Callable[[Any], bool]:
    return lambda v: v >= low


def _positive(v: Any) -> bool:
    return v > 0 and math.isfinite(v)


def _unit(v: Any) -> bool:
    return 0.0 <= v <= 1.0


#: ``(dotted key pattern, predicate, what it must be)``; None values are not range-checked.
RANGES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("seed", _at_least(0), "an integer >= 0"),
    ("num_envs", _at_least(1), "at least 1"),
    ("num_steps", _at_least(1), "at least 1"),
    ("iterations", _at_least(1), "at least 1"),
    ("checkpoint_every", _at_least(0), ">= 0 (0: only when the run ends)"),
    ("keep_checkpoints", _at_least(1), "at least 1, or null to keep all"),
    ("torch_threads", _at_least(0), ">= 0 (0: torch's default)"),
    ("population.size", _at_least(1), "at least 1"),
    ("objective.k", _at_least(1), "at least 1"),
    ("objective.beta", _unit, "in [0, 1]"),
    ("objective.c", _positive, "> 0"),
    ("objective.min_distance", _positive, "> 0"),
    ("objective.kl_threshold", _positive, "> 0"),
    ("objective.inner_steps", _at_least(1), "at least 1"),
    ("objective.lr", _positive, "> 0"),
    ("ppo.epochs", _at_least(1), "at least 1"),
    ("ppo.minibatches", _at_least(1), "at least 1"),
    ("ppo.lr", _positive, "> 0"),
    ("ppo.max_lr", _positive, "> 0"),
    ("ppo.clip", _positive, "> 0"),
    ("ppo.gamma", _unit, "in [0, 1]"),
    ("ppo.lam", _unit, "in [0, 1]"),
    ("ppo.value_coef", _at_least(0), ">= 0"),
    ("ppo.entropy_coef", _at_least(0), ">= 0"),
    ("ppo.max_grad_norm", _positive, "> 0"),
    ("ppo.desired_kl", _positive, "> 0, or null for a fixed learning rate"),
    ("init.episodes", _at_least(1), "at least 1"),
    ("init.critic_warmup", _at_least(0), ">= 0"),
    ("eval.every", _at_least(0), ">= 0 (0: only at the end)"),
    ("eval.episodes", _at_least(1), "at least 1"),
    ("eval.final_episodes", _at_least(1), "at least 1"),
    ("diagnostics.states_per_member", _at_least(1), "at least 1"),
    ("algo.*_coef", _at_least(0), ">= 0"),
    ("algo.kl_target", _positive, "> 0 nats, or null for fixed coefficients"),
)


def check_ranges(config: Mapping[str, Any]) -> None:
    """Raise :class:`ConfigError` for the first key of :data:`RANGES` out of its range."""
    flat = flatten_config(config)
    for pattern, ok, wanted in RANGES:
        for key in fnmatch.filter(flat, pattern):
            value = flat[key]
            if value is None or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            if not ok(value):
                raise ConfigError(f"{key}={value!r} is out of range: it must be {wanted}")


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
    """Types against ``reference``, ranges, and the device: every check that needs nothing
    built. Raises :class:`ConfigError` naming the key and the fix."""
    check_types(config, reference)
    check_ranges(config)
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
    key the packaged configs know keeps one of their types, every section stays a mapping, and
    ranges hold. Messages name ``source`` and the key.

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
    try:
        check_ranges(config)
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}; fix the key in the file, or start a new run") from exc
