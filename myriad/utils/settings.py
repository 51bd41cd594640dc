"""Building a settings dataclass from a config section whose keys are the dataclass's fields.

A config group such as ``population`` or ``algo`` holds exactly the fields of the dataclass it
builds, so the dataclass is made with ``cls(**section)``; :func:`from_config` checks the keys and
the value types first, so that a mistyped key or value is one line naming it and the choices
instead of a ``TypeError`` from deep inside the constructor.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from myriad.utils.config import ConfigError

T = TypeVar("T")


def field_names(cls: type) -> tuple[str, ...]:
    """The field names of the dataclass ``cls``, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(cls))


_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURALS = {bool: "true/false values", int: "integers", float: "numbers", str: "strings"}


def _describe(hint: Any, plural: bool = False) -> str:
    """``hint`` in words, e.g. ``"a list of integers"``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a, plural) for a in args)
    if hint is type(None):
        return "null"
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        return f"a list of {len(args)} {_describe(args[0], plural=True)}"
    if origin in (tuple, list, typing.Sequence):
        return f"a list of {_describe(args[0], plural=True)}" if args else "a list"
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return "mappings" if plural else "a mapping"
    words = _PLURALS if plural else _WORDS
    return words.get(hint, getattr(hint, "__name__", str(hint)))


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` (as YAML or the command line gives it) can fill a field of type
    ``hint``; annotations it does not know accept anything (the dataclass checks them)."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is str:
        return isinstance(value, str)
    if origin in (tuple, list, typing.Sequence):
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return len(value) == len(args) and all(_fits(v, a) for v, a in zip(value, args))
        return not args or all(_fits(v, args[0]) for v in value)
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return isinstance(value, Mapping)
    return True


def from_config(cls: type[T], values: Mapping[str, Any], section: str, **fixed: Any) -> T:
    """``cls(**fixed, **values)``, the dataclass ``cls`` built from the config ``section``.

    Args:
        cls: a dataclass.
        values: the section's keys and values; every key must be a field of ``cls``.
        section: the section's dotted name in messages, e.g. ``"population"``.
        **fixed: fields that do not come from the config (e.g. sizes read from the env).

    Raises:
        ConfigError: a key that is not a field (the message lists the keys allowed), a value of
            the wrong type (naming the type), or a value the dataclass refuses (its message).
    """
    hints = typing.get_type_hints(cls)
    allowed = [name for name in field_names(cls) if name not in fixed]
    for key, value in values.items():
        if key not in allowed:
            raise ConfigError(f"{section} has no key {key!r}; its keys: {', '.join(allowed)}")
        if not _fits(value, hints[key]):
            raise ConfigError(f"{section}.{key}={value!r} must be {_describe(hints[key])}")
    try:
        return cls(**fixed, **values)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{section}: {exc}") from exc
