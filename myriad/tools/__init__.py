"""Commands that work on finished runs: evaluation (``myriad eval``), policy export
(``myriad export-policy``), sweeps (``myriad pretrain -m``, ``myriad sweep``) and the config
schema (``myriad config``).

Each module adds its subcommand's arguments (``add_parser``) and runs it (``run``); its module
level stays free of heavy imports, so building the ``myriad`` parser stays fast.
"""

from __future__ import annotations

import argparse
import importlib
from typing import Any

#: Subcommand -> module; each module defines ``add_parser(sub)`` and ``run(args, rest) -> int``.
COMMANDS: dict[str, str] = {
    "eval": "myriad.tools.evaluate",
    "export-policy": "myriad.tools.export_policy",
    "sweep": "myriad.tools.sweep",
    "config": "myriad.tools.config_schema",
}
#: Subcommands whose extra arguments are overrides (``key=value``) rather than errors.
TAKES_OVERRIDES: tuple[str, ...] = ("eval",)


def add_parsers(sub: Any) -> None:
    """Add every subcommand of :data:`COMMANDS` to the ``myriad`` subparsers ``sub``."""
    for module in COMMANDS.values():
        importlib.import_module(module).add_parser(sub)


def run(command: str, args: argparse.Namespace, rest: list[str]) -> int:
    """Run ``command`` with its parsed arguments and extra ``rest`` arguments."""
    return int(importlib.import_module(COMMANDS[command]).run(args, rest))
