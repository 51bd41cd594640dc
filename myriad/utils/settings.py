"""Settings dataclasses as the schema of a run's config: each key defined once, in code.

A config section such as ``population``, ``ppo`` or ``algo`` holds exactly the fields of the
dataclass it builds. A field declared with :func:`setting` carries its one-line help and its
range (:class:`Check`) beside its type and default, so the dataclass is the one definition of the
key: :func:`from_config` checks keys, types and ranges from it (a mistyped key or value is one
line naming it and the choices, never a ``TypeError`` from deep inside a constructor),
:func:`describe` prints it (``myriad config``), and :func:`defaults` is what the packaged YAML
is tested equal to.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections import abc
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from myriad.utils.config import ConfigError

T = TypeVar("T")


class Check(NamedTuple):
    """A range a setting's value must lie in: ``ok(value)`` and the words for the message.
    Null values are never range-checked (null switches a feature off where the type allows)."""

    ok: Callable[[Any], bool]
    words: str
    problem: str = "is out of range"


def at_least(low: float, note: str = "") -> Check:
    """``value >= low`` (e.g. ``at_least(0, "0: off")``)."""
    return Check(lambda v: v >= low, f">= {low:g}" + (f" ({note})" if note else ""))


def positive(note: str = "") -> Check:
    """A finite ``value > 0``."""
    return Check(lambda v: v > 0 and math.isfinite(v), "> 0" + (f" ({note})" if note else ""))


def between(low: float, high: float) -> Check:
    """``low <= value <= high``."""
    return Check(lambda v: low <= v <= high, f"in [{low:g}, {high:g}]")


def one_of(*choices: Any) -> Check:
    """One of ``choices``."""
    return Check(
        lambda v: v in choices, "one of " + " | ".join(str(c) for c in choices), "is not known"
    )


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    check: Check | None = None,
    factory: Callable[[], Any] | None = None,
) -> Any:
    """A dataclass field that is a config key: its ``default`` (or ``factory``), one line of
    ``help`` and its range ``check``."""
    metadata = {"help": help, "check": check}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _section_class(hint: Any) -> type | None:
    """The dataclass a field of type ``hint`` holds (``X`` or ``X | None``), else None."""
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        return hint
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if len(args) == 1 and dataclasses.is_dataclass(args[0]) and isinstance(args[0], type):
        return args[0]
    return None


def _plain(value: Any) -> Any:
    """``value`` as YAML writes it: tuples as lists, mappings as dicts, dataclasses as dicts."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    return value


def defaults(cls: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The default of every field of the dataclass ``cls`` as a plain nested dict (what its
    config section holds when no key is overridden); fields without a default are left out."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        if f.default is not dataclasses.MISSING:
            out[f.name] = _plain(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = _plain(f.default_factory())
    return out


def check_fields(obj: Any) -> None:
    """Check the fields of a settings dataclass instance against their ranges (what
    ``__post_init__`` calls, so settings built in Python are checked as config keys are).

    Raises:
        ValueError: ``"<Class>.<field>=<value> must be <range>"``.
    """
    for f in dataclasses.fields(obj):
        check, value = f.metadata.get("check"), getattr(obj, f.name)
        if check is not None and value is not None and not check.ok(value):
            raise ValueError(f"{type(obj).__name__}.{f.name}={value!r} must be {check.words}")


class SettingRow(NamedTuple):
    """One config key as :func:`describe` lists it."""

    key: str
    type: str
    default: Any
    range: str
    help: str


def describe(
    cls: type,
    prefix: str = "",
    skip: tuple[str, ...] = (),
    values: Mapping[str, Any] | None = None,
) -> list[SettingRow]:
    """Every key of the dataclass ``cls`` (nested sections flattened to dotted keys), with its
    type in words, default, range and help. ``values``: the defaults to show (a section's, as
    the enclosing dataclass's factory makes it), else the fields' own."""
    hints = typing.get_type_hints(cls)
    values = defaults(cls, skip) if values is None else values
    rows: list[SettingRow] = []
    for f in dataclasses.fields(cls):
        if f.name in skip or f.name not in values:
            continue
        sub = _section_class(hints[f.name])
        if sub is not None:
            rows.extend(describe(sub, f"{prefix}{f.name}.", values=values[f.name]))
            continue
        check = f.metadata.get("check")
        rows.append(
            SettingRow(
                f"{prefix}{f.name}",
                describe_type(hints[f.name]),
                values[f.name],
                check.words if check is not None else "",
                f.metadata.get("help", ""),
            )
        )
    return rows


def check_values(
    cls: type, values: Mapping[str, Any], section: str, skip: tuple[str, ...] = ()
) -> None:
    """Check a config section against the dataclass ``cls``: every key is a field, every value
    has the field's type and lies in its range; nested sections are checked against their own
    dataclasses. ``section`` is the section's dotted name in messages ("" at the top level).

    Raises:
        ConfigError: naming the key and what it must be.
    """
    hints = typing.get_type_hints(cls)
    checks = {f.name: f.metadata.get("check") for f in dataclasses.fields(cls)}
    allowed = [name for name in field_names(cls) if name not in skip]
    for key, value in values.items():
        name = f"{section}.{key}" if section else key
        if key not in allowed:
            where = section or "the config"
            raise ConfigError(f"{where} has no key {key!r}; its keys: {', '.join(allowed)}")
        sub = _section_class(hints[key])
        if sub is not None and isinstance(value, Mapping):
            check_values(sub, value, name)
            continue
        if not value_fits(value, hints[key]):
            raise ConfigError(f"{name}={value!r} must be {describe_type(hints[key])}")
        check = checks[key]
        if check is not None and value is not None and not check.ok(value):
            raise ConfigError(f"{name}={value!r} {check.problem}: it must be {check.words}")


def field_names(cls: type) -> tuple[str, ...]:
    """The field names of the dataclass ``cls``, in declaration order."""
    return tuple(f.name for f in dataclasses.fields(cls))


_WORDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_PLURALS = {bool: "true/false values", int: "integers", float: "numbers", str: "strings"}


def describe_type(hint: Any, plural: bool = False) -> str:
    """``hint`` in words, e.g. ``"a list of integers"``."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_type(a, plural) for a in args)
    if hint is type(None):
        return "null"
    lists = "lists of" if plural else "a list of"
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
        return f"{lists} {len(args)} {describe_type(args[0], plural=True)}"
    if origin in (tuple, list, typing.Sequence, abc.Sequence):
        return f"{lists} {describe_type(args[0], plural=True)}" if args else lists.rstrip(" of")
    if origin in (dict, Mapping) or hint in (dict, Mapping):
        return "mappings" if plural else "a mapping"
    words = _PLURALS if plural else _WORDS
    return words.get(hint, getattr(hint, "__name__", str(hint)))


def value_fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` (as YAML or the command line gives it) can fill a field of type
    ``hint``; annotations it does not know accept anything (the dataclass checks them)."""
    if hint is Any:
        return True
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(value_fits(value, a) for a in args)
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
    if origin in (tuple, list, typing.Sequence, abc.Sequence):
        if not isinstance(value, list | tuple):
            return False
        if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):
            return len(value) == len(args) and all(value_fits(v, a) for v, a in zip(value, args))
        return not args or all(value_fits(v, args[0]) for v in value)
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
            the wrong type (naming the type) or out of its range, or a value the dataclass
            refuses (its message). Nested sections are built into their own dataclasses.
    """
    check_values(cls, values, section, skip=tuple(fixed))  # nested sections included
    return _build(cls, values, section, fixed)


def _build(cls: type[T], values: Mapping[str, Any], section: str, fixed: Mapping[str, Any]) -> T:
    """:func:`from_config` after its check: nested sections become their dataclasses."""
    hints = typing.get_type_hints(cls)
    built = {
        key: _build(sub, value, f"{section}.{key}", {})
        if (sub := _section_class(hints[key])) is not None and isinstance(value, Mapping)
        else value
        for key, value in values.items()
    }
    try:
        return cls(**fixed, **built)
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ConfigError):
            raise
        raise ConfigError(f"{section}: {exc}") from exc
