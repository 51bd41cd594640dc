"""The argument parser every ``myriad`` command uses: usage errors on one line of stderr."""

from __future__ import annotations

import argparse
import sys
from typing import Any, NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse with usage errors on one line (the usage itself is one ``--help`` away).

    Subparsers made by :meth:`add_subparsers` are of this class too.
    """

    def error(self, message: str) -> NoReturn:
        if message.endswith("expected one argument"):
            # argparse reads a value such as "-4,4" (a negative coordinate) as an option.
            option = message.split(":")[0].removeprefix("argument ").split("/")[-1]
            message += f"; a value that starts with '-' goes after '=': {option}=-4,4"
        print(f"myriad: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def positive_int(text: str) -> int:
    """An argparse ``type`` for counts (``--episodes``, ``--chunk-rows``): an integer >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def device_name(text: str) -> str:
    """An argparse ``type`` for ``--device``: a torch device this machine has (cpu, cuda,
    cuda:N)."""
    from myriad.utils.config import ConfigError
    from myriad.utils.validation import check_device

    try:
        check_device(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def add_run_subcommand(
    sub: Any,
    name: str,
    help: str,
    metavar: str = "RUN_OR_CHECKPOINT",
    run_help: str = "run folder or checkpoint file",
) -> argparse.ArgumentParser:
    """Add the ``myriad`` subcommand ``name`` whose first argument is a run (``metavar``)."""
    parser: argparse.ArgumentParser = sub.add_parser(name, help=help)
    parser.add_argument("run", metavar=metavar, help=run_help)
    return parser
