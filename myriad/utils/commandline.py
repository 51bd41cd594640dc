"""The argument parser every ``myriad`` command uses: usage errors on one line of stderr."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse with usage errors on one line (the usage itself is one ``--help`` away).

    Subparsers made by :meth:`add_subparsers` are of this class too.
    """

    def error(self, message: str) -> NoReturn:
        print(f"myriad: error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)
