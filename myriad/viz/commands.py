"""The ``myriad render`` and ``myriad report`` subcommands: their arguments and handlers.

Kept free of heavy imports at module level, so building the command-line parser stays fast.
"""

from __future__ import annotations

import argparse
from typing import Any

from myriad.utils.commandline import add_run_subcommand, device_name, positive_int


def add_render_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``render`` to the ``myriad`` subcommands (``sub`` from ``add_subparsers``)."""
    render = sub.add_parser(
        "render",
        help="videos of every member and of the whole population side by side (RUN/videos)",
    )
    render.add_argument(
        "run", metavar="RUN", help="run folder (pretrain or finetune) or checkpoint"
    )
    render.add_argument(
        "--members", nargs="+", metavar="M", help="members to record: 0 3, 0,3 or all (default)"
    )
    render.add_argument(
        "--episodes", type=positive_int, default=1, help="episodes per member (default 1)"
    )
    render.add_argument("--format", choices=["mp4", "gif"], default="mp4")
    actions = render.add_mutually_exclusive_group()
    actions.add_argument("--deterministic", action="store_true", help="act with the policy means")
    actions.add_argument(
        "--sample", action="store_true", help="sample actions, as in training (default)"
    )
    render.add_argument("--max-steps", type=positive_int, help="cut episodes after this many steps")
    render.add_argument("--seed", type=int, help="env and action seed (default: the run's)")
    render.add_argument("--out", help="output folder (default RUN/videos)")
    render.add_argument(
        "--overwrite",
        action="store_true",
        help="replace videos in --out that myriad render did not write (never a run's files)",
    )
    render.add_argument("--device", default="cpu", type=device_name)
    return render


def add_report_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``report`` to the ``myriad`` subcommands."""
    report = add_run_subcommand(
        sub,
        "report",
        "one self-contained HTML page of a run: videos, plots, summary, config (RUN/report.html)",
        "RUN",
        "run folder (pretrain or finetune)",
    )
    report.add_argument("--out", help="output file (default RUN/report.html)")
    report.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an --out that is not a myriad report (never a run's files)",
    )
    report.add_argument(
        "--no-render", action="store_true", help="do not record videos when the run has none"
    )
    report.add_argument(
        "--episodes", type=positive_int, default=1, help="episodes per member if recording"
    )
    report.add_argument(
        "--max-steps", type=positive_int, help="cut recorded episodes after this many steps"
    )
    report.add_argument("--format", choices=["mp4", "gif"], default="mp4")
    report.add_argument("--device", default="cpu", type=device_name)
    return report


def _members(values: list[str] | None) -> list[int] | str | None:
    if not values:
        return None
    items = [v.strip() for item in values for v in item.split(",") if v.strip()]
    if items == ["all"]:
        return "all"
    try:
        return [int(v) for v in items]
    except ValueError:
        from myriad.utils.config import ConfigError

        raise ConfigError(
            f"--members takes member indices (0 3 or 0,3) or all, got {' '.join(values)}"
        ) from None


def run_render(args: argparse.Namespace) -> int:
    """``myriad render``: write the videos and print where they are."""
    from myriad.viz.render import render_run

    options: dict[str, Any] = {
        "members": _members(args.members),
        "episodes": args.episodes,
        "fmt": args.format,
        "deterministic": bool(args.deterministic),
        "max_steps": args.max_steps,
        "device": args.device,
    }
    if args.seed is not None:
        options["seed"] = args.seed
    result = render_run(args.run, args.out, overwrite=bool(args.overwrite), **options)
    print(f"population  {result.grid}  ({result.frames[result.grid]} frames, {result.fps:g} fps)")
    for member, path in result.members.items():
        print(f"member {member:<3} {path}  ({result.frames[path]} frames)")
    return 0


def run_report(args: argparse.Namespace) -> int:
    """``myriad report``: write the HTML page and print where it is."""
    from myriad.viz.report import write_report

    path = write_report(
        args.run,
        args.out,
        render=not args.no_render,
        episodes=args.episodes,
        fmt=args.format,
        max_steps=args.max_steps,
        device=args.device,
        overwrite=bool(args.overwrite),
    )
    print(f"report  {path}  ({path.stat().st_size / 1e6:.1f} MB, self-contained)")
    return 0
