"""``myriad export-policy``: the command's arguments and handler (the export itself is
:mod:`myriad.tools.deploy`). Kept free of heavy imports, so building the parser stays fast."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from myriad.utils.commandline import add_run_subcommand

# ------------------------------------------------------------------------------ command


#: ``myriad export-policy`` in the list of subcommands.
HELP = (
    "deployable policies (ONNX | TorchScript) with the observation normaliser folded in, and "
    "policy.json (RUN/policy/FORMAT)"
)


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``export-policy`` to the ``myriad`` subcommands."""
    p = add_run_subcommand(sub, "export-policy", HELP)
    p.add_argument("--format", required=True, choices=["onnx", "torchscript"])
    p.add_argument(
        "--member",
        default="leader",
        help="a member index, leader (default; member 0 of a pretraining run) or all "
        "(one file per member)",
    )
    p.add_argument("--out", help="output folder (default RUN/policy/FORMAT)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export")
    return p


def run(args: argparse.Namespace, rest: list[str]) -> int:
    """``myriad export-policy``: export and print where the files are."""
    from myriad.tools.deploy import METADATA, export_policy
    from myriad.utils.config import ConfigError

    member: list[int] | str
    if args.member in ("leader", "all"):
        member = args.member
    else:
        try:
            member = [int(args.member)]
        except ValueError:
            raise ConfigError(
                f"--member takes a member index, leader or all, got {args.member!r}"
            ) from None
    meta = export_policy(
        args.run, args.format, members=member, out=args.out, overwrite=args.overwrite
    )
    folder = Path(meta["folder"])
    for m, name in meta["files"].items():
        tag = " (leader)" if meta["leader"] is not None and int(m) == meta["leader"] else ""
        print(f"member {m}{tag}  {folder / name}")
    print(f"metadata  {folder / METADATA}")
    return 0
