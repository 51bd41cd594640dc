"""The environment registry: ``make(name, num_envs, device, **options)``.

Entries name a factory either as a callable or as a ``"module:attribute"`` string, so listing the
registry never imports a heavy backend. Built-in families register themselves when their module is
imported; :func:`make` and :func:`names` import them on first use. Envs of other packages register
themselves when their module is imported: a run config names it as ``env.module``
(:func:`import_env_modules`), so ``myriad pretrain env=custom env.name=my-env
env.module=my_pkg.envs`` (myriad's registry) or ``env=gymnasium env.id=MyEnv-v0
env.module=my_pkg.envs`` (Gymnasium's) reach them from the command line.
"""

from __future__ import annotations

import difflib
import importlib
import inspect
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from myriad.envs.base import VecEnv

# Modules whose import registers built-in environments.
BUILTIN_MODULES: tuple[str, ...] = (
    "myriad.envs.nav",
    "myriad.envs.gymnasium",
    "myriad.envs.mujoco",
)


class EnvOptionError(TypeError):
    """An option the env does not accept; the message lists those it does."""


class EnvOptionValueError(EnvOptionError, ValueError):
    """An option value the env refused (out of range, an unknown task): still a ValueError,
    as the env raised it, and one line for the command line."""


class EnvConfigError(ValueError):
    """The env cannot be built as configured (a feature index outside the observation, no time
    limit, a module that does not import, ...); the message names the option and the fix."""


class UnknownEnvError(KeyError):
    """The requested name is not registered; the message lists what is."""

    def __str__(self) -> str:  # KeyError quotes its message; show it plainly
        return str(self.args[0])


@dataclass
class EnvEntry:
    """One registered environment.

    Attributes:
        name: registry name, e.g. ``"nav-maze"``.
        factory: callable ``(num_envs, device, **options) -> VecEnv`` or ``"module:attr"``.
        description: one line shown by ``myriad envs``.
        defaults: options passed to the factory unless overridden in :func:`make`.
        family: grouping shown by ``myriad envs`` (``"nav"``, ``"mujoco"``, ...).
    """

    name: str
    factory: Callable[..., VecEnv] | str
    description: str = ""
    defaults: dict[str, Any] = field(default_factory=dict)
    family: str = ""

    def resolve(self) -> Callable[..., VecEnv]:
        if callable(self.factory):
            return self.factory
        module, _, attr = self.factory.partition(":")
        return getattr(importlib.import_module(module), attr)


_REGISTRY: dict[str, EnvEntry] = {}
_builtins_loaded = False


def register(
    name: str,
    factory: Callable[..., VecEnv] | str,
    description: str = "",
    family: str = "",
    overwrite: bool = False,
    **defaults: Any,
) -> None:
    """Add an environment to the registry.

    Raises:
        ValueError: ``name`` is taken and ``overwrite`` is False.
    """
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"env {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = EnvEntry(name, factory, description, dict(defaults), family)


def _load_builtins() -> None:
    global _builtins_loaded
    if _builtins_loaded:
        return
    _builtins_loaded = True
    for module in BUILTIN_MODULES:
        importlib.import_module(module)


def names() -> list[str]:
    """All registered environment names, sorted."""
    _load_builtins()
    return sorted(_REGISTRY)


def entry(name: str) -> EnvEntry:
    """The registry entry for ``name``; unknown names raise :class:`UnknownEnvError`."""
    _load_builtins()
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, _REGISTRY, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise UnknownEnvError(
            f"unknown env {name!r}.{hint} Registered envs: {', '.join(sorted(_REGISTRY))}"
        )
    return _REGISTRY[name]


def option_hints(factory: Callable[..., VecEnv]) -> dict[str, Any]:
    """The type annotations of an env factory's options (its keyword parameters): the env's
    schema. Empty where they cannot be resolved."""
    target = factory.__init__ if inspect.isclass(factory) else factory
    try:
        return typing.get_type_hints(target)
    except (NameError, TypeError):
        return {}


def check_option_types(name: str, factory: Callable[..., VecEnv], options: dict[str, Any]) -> None:
    """Every option given has the type of the factory's parameter of that name.

    Raises:
        EnvOptionError: ``env 'nav-maze' option max_speed='fast' must be a number``.
    """
    from myriad.utils.settings import describe_type, value_fits

    hints = option_hints(factory)
    for key, value in options.items():
        hint = hints.get(key)
        if hint is not None and not value_fits(value, hint):
            raise EnvOptionError(
                f"env {name!r} option {key}={value!r} must be {describe_type(hint)}"
            )


def options_of(name: str) -> list[tuple[str, Any, Any]]:
    """``(option, type annotation, default)`` of every option of env ``name``: the factory's
    keyword parameters, defaults as registered (else the parameter's own)."""
    e = entry(name)
    factory = e.resolve()
    hints = option_hints(factory)
    out = []
    for p in inspect.signature(factory).parameters.values():
        if p.name in ("num_envs", "device") or p.kind is inspect.Parameter.VAR_KEYWORD:
            continue
        default = e.defaults.get(
            p.name, None if p.default is inspect.Parameter.empty else p.default
        )
        out.append((p.name, hints.get(p.name, Any), default))
    return out


def make(
    name: str, num_envs: int = 1, device: torch.device | str = "cpu", **options: Any
) -> VecEnv:
    """Build ``num_envs`` copies of the environment ``name`` on ``device``.

    Args:
        name: a registered name (see ``myriad envs`` or :func:`names`).
        num_envs: number of parallel environments.
        device: torch device for every tensor the env returns.
        **options: env-specific options overriding the registered defaults.

    Raises:
        UnknownEnvError: ``name`` is not registered (the message lists registered names).
        EnvOptionError: an option is not accepted by the env (the message lists accepted
            options).
    """
    e = entry(name)
    factory = e.resolve()
    kwargs = {**e.defaults, **options}
    params = inspect.signature(factory).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    if not takes_any:
        accepted = [p for p in params if p not in ("num_envs", "device")]
        unknown = sorted(set(kwargs) - set(accepted))
        if unknown:
            hint = (
                "; it has no goal tasks: finetune it on its own reward with task=native"
                if "task" in unknown
                else ""
            )
            raise EnvOptionError(
                f"env {name!r} does not accept option(s) {unknown}; accepted: {accepted}{hint}"
            )
    check_option_types(name, factory, options)
    try:
        env = factory(num_envs=num_envs, device=device, **kwargs)
    except ValueError as exc:
        # The env's own check of its options' values (a range, a task name): say which env and
        # where the value came from, in one line.
        if not kwargs:
            raise
        raise EnvOptionValueError(
            f"env {name!r} rejected its options {kwargs}: {str(exc).strip()}; fix that option"
        ) from exc
    env.name = name
    return env


def import_env_modules(modules: str | list[str] | tuple[str, ...] | None) -> None:
    """Import the module(s) that register envs (``env.module`` of a run config): their import
    calls :func:`register` (myriad's registry) or ``gymnasium.register``.

    Raises:
        EnvConfigError: a module does not import (the message gives its error and the fix).
    """
    if not modules:
        return
    for module in [modules] if isinstance(modules, str) else list(modules):
        try:
            importlib.import_module(str(module))
        except Exception as exc:  # any failure of the user's module is a config problem here
            reason = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"
            raise EnvConfigError(
                f"env.module={module!r} does not import ({reason}): give the dotted name of an "
                "importable module (install its package or add its folder to PYTHONPATH)"
            ) from exc


class RemoteEnvFactory(typing.Protocol):
    """Builds the envs of a run config with a ``distributed`` entry (envs in other processes or
    machines behind the VecEnv interface). The command layer chooses it (``myriad pretrain`` and
    ``myriad finetune`` pass :func:`myriad.distributed.make_distributed`, the Ray workers) and
    hands it down to :func:`make_from_config`; the envs layer never imports the package that
    provides it."""

    def __call__(
        self,
        name: str,
        num_envs: int,
        distributed: dict[str, Any] | str,
        device: torch.device | str,
        options: dict[str, Any],
    ) -> VecEnv: ...


def make_from_config(
    env_cfg: dict[str, Any],
    num_envs: int,
    device: torch.device | str = "cpu",
    distributed: dict[str, Any] | str | None = None,
    remote: RemoteEnvFactory | None = None,
) -> VecEnv:
    """Build the env of a run config: ``env_cfg = {"name": ..., "options": {...}}``, after
    importing ``env_cfg["module"]`` (if any: the module that registers the env).

    With ``distributed`` (a ``configs/distributed`` preset name or its mapping), the envs run in
    other processes behind the same VecEnv interface (the learner computes the actions), built
    by ``remote`` (the caller's :class:`RemoteEnvFactory`); otherwise locally with :func:`make`.

    Raises:
        EnvConfigError: ``distributed`` without a ``remote`` factory to build it.
    """
    missing = [k for k in ("name", "module") if env_cfg.get(k) == "???"]
    if missing:  # env=custom leaves both to the user (Hydra's mandatory value)
        raise EnvConfigError(
            f"env {' and '.join(missing)} not given: env=custom needs env.name=NAME (the name "
            "your module registers) and env.module=MODULE (the module that registers it)"
        )
    import_env_modules(env_cfg.get("module"))
    name, options = str(env_cfg["name"]), dict(env_cfg.get("options") or {})
    if distributed:
        if remote is None:
            raise EnvConfigError(
                f"distributed={distributed!r} runs the envs on workers, and no factory of "
                "remote envs was given: run it with `myriad pretrain|finetune`, or pass "
                "remote_envs=myriad.distributed.make_distributed to pretrain()/finetune()"
            )
        env = remote(name, num_envs, distributed, device, options)
        env.name = name
        return env
    return make(name, num_envs, device, **options)
