"""``myriad config``: every key of a command with its type, default, range and help, from the
settings dataclasses that define them (:mod:`myriad.utils.settings`).

``myriad config finetune --algo cpo`` lists the finetuning keys of CPO; ``--markdown`` writes a
Markdown table. ``docs/config.md`` is :func:`page` (``python -m myriad.tools.config_schema >
docs/config.md``; a test checks it is current).
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``config`` to the ``myriad`` subcommands."""
    p = sub.add_parser(
        "config",
        help="every config key of a command: type, default, range, help (the schema)",
    )
    p.add_argument("kind", choices=["pretrain", "finetune"])
    p.add_argument("--algo", default="cpo", help="finetune: cpo | sapg | ppo | pbt (default cpo)")
    p.add_argument(
        "--objective",
        default="knn_reward",
        help="pretrain: knn_reward | mepol (default knn_reward)",
    )
    p.add_argument(
        "--env", help="also list this env's options (env.options.*), e.g. nav-maze (myriad envs)"
    )
    p.add_argument("--markdown", action="store_true", help="a Markdown table")
    return p


def env_rows(name: str) -> list[Any]:
    """The options of env ``name`` as :class:`~myriad.utils.settings.SettingRow`: the keyword
    parameters of its factory (their annotations are its schema, checked by
    :func:`myriad.envs.registry.make`), with the registered defaults and the help of its
    docstring's ``Args``."""
    import inspect
    import re

    from myriad.envs.registry import entry, options_of
    from myriad.utils.settings import SettingRow, describe_type

    factory = entry(name).resolve()
    doc = inspect.getdoc(factory) or ""
    helps = dict(re.findall(r"^\s*(\w+):\s+(.+)$", doc.partition("Args:")[2], re.MULTILINE))
    return [
        SettingRow(f"env.options.{option}", describe_type(hint), default, "", helps.get(option, ""))
        for option, hint, default in options_of(name)
    ]


def rows(kind: str, algo: str = "cpo", objective: str = "knn_reward") -> list[Any]:
    """The :class:`~myriad.utils.settings.SettingRow` of every key of ``kind``."""
    if kind == "pretrain":
        from myriad.pretrain.settings import describe_pretrain

        return describe_pretrain(objective)
    from myriad.finetune.settings import describe_finetune

    return describe_finetune(algo)


def _value(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else value


def render(
    kind: str,
    algo: str = "cpo",
    objective: str = "knn_reward",
    markdown: bool = False,
    env: str | None = None,
) -> str:
    """The schema of ``kind`` (and of env ``env``'s options) as aligned text or a Markdown
    table."""
    table = rows(kind, algo, objective) + (env_rows(env) if env else [])
    if markdown:
        lines = ["| key | type | default | range | help |", "|---|---|---|---|---|"]
        for r in table:
            cells = (f"`{r.key}`", r.type, f"`{_value(r.default)}`", r.range, r.help)
            lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
        return "\n".join(lines)
    width = max(len(r.key) for r in table)
    lines = []
    for r in table:
        bounds = f"  [{r.range}]" if r.range else ""
        lines.append(f"{r.key:<{width}}  {_value(r.default)}  ({r.type}){bounds}  {r.help}")
    return "\n".join(lines)


def run(args: argparse.Namespace, rest: list[str]) -> int:
    """``myriad config``: print the schema."""
    from myriad.utils.config import ConfigError

    if rest:
        raise ConfigError(f"myriad config takes no overrides, got {' '.join(rest)}")
    print(render(args.kind, args.algo, args.objective, args.markdown, args.env))
    return 0


_PAGE_HEAD = """# Configuration reference

Every key of `myriad pretrain` and `myriad finetune`, with its type, default, range and help. The
settings dataclasses in the code define each key once (`myriad.utils.settings.setting`); the
packaged YAML under `myriad/configs/` holds exactly these defaults (checked by
`tests/test_settings_schema.py`), the command line, the Python API and `--resume` build the same
objects from them, and a key that is unknown, of the wrong type or out of range is refused with one
line naming it. `myriad config pretrain|finetune [--algo NAME] [--objective NAME]` prints the same
table. This page is written by `python -m myriad.tools.config_schema > docs/config.md`.

How to set a key: `myriad finetune --algo cpo ppo.epochs=8 algo.kl_target=0.5`. A key means the
same whatever else is typed: with CPO's KL set point on (the default, `algo.kl_target=0.3`),
`algo.kl_preset`, `algo.kl_coef` and `algo.adversarial_coef` are the values the set point starts
from; `algo.kl_target=null` selects fixed coefficients.

The `env` section's options are the keyword parameters of the env's class, whose annotations are
their schema: an option that is unknown or of the wrong type is refused in one line, and
`myriad config pretrain --env nav-maze` lists them with the env's defaults and help (docs/envs.md).
The `task` group sets env options; `distributed` holds the Ray settings (docs/distributed.md).
"""


def page() -> str:
    """``docs/config.md``: the schema of both commands (pretraining with each objective,
    finetuning with each algorithm)."""
    from myriad.finetune.algorithms import ALGORITHMS
    from myriad.pretrain.settings import OBJECTIVES

    parts = [_PAGE_HEAD]
    for objective in OBJECTIVES:
        parts.append(f"## myriad pretrain objective={objective}\n")
        parts.append(render("pretrain", objective=objective, markdown=True) + "\n")
    for algo in ALGORITHMS:
        parts.append(f"## myriad finetune --algo {algo}\n")
        parts.append(render("finetune", algo=algo, markdown=True) + "\n")
    return "\n".join(parts)


if __name__ == "__main__":
    print(page(), end="")
