"""The ``myriad`` command. Thin: parses arguments and hands over to library code.

myriad envs                      list registered environments, spaces and entropy features
myriad envs check NAME [...]     verify the VecEnv contract of an environment
myriad bench envs|knn [...]      throughput benchmarks (JSON + table)
myriad doctor                    installed components, faiss CPU/GPU, CUDA
myriad export RUN --format F     convert a run's dataset (hdf5 | zarr | minari), streaming
myriad dataset info|validate P   summarise or check a dataset of any format
myriad dataset verify RUN        check every checksum of a run (or dataset); names the bad chunk
myriad render RUN [--members]    videos of every member and of the population (RUN/videos)
myriad report RUN                one self-contained HTML page of a run (RUN/report.html)
myriad eval RUN [--members ...]  per-member return, success, length with 95% CIs (RUN/eval.json)
myriad export-policy RUN         a deployable policy (ONNX | TorchScript) with its metadata
myriad sweep summarize|resume S  a sweep's table, or finish it (pretrain/finetune -m a=1,2 ...)
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable
from typing import Any

from myriad.utils.commandline import ArgumentParser, device_name, positive_int

# The process settings (OpenMP wait policy) were applied when the myriad package was imported,
# before torch (myriad.utils.process): the same for every command, torchrun rank and program.

BENCHMARKS = {"envs": "myriad.bench.envs", "knn": "myriad.bench.knn", "gpu": "myriad.bench.gpu"}


def _env_option(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` of ``myriad envs --option``, the value read as YAML (``[0, 1]``, ``3``)."""
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(
            f"--option {text!r} is not KEY=VALUE: give e.g. --option env_id=Hopper-v5"
        )
    try:
        return key, yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise argparse.ArgumentTypeError(f"--option {text!r}: {exc}") from exc


def _cmd_envs(args: argparse.Namespace) -> int:
    from myriad.envs import import_env_modules, make, names
    from myriad.envs.registry import entry

    import_env_modules(args.module)
    if args.action == "check":
        return _check_envs(args)
    from myriad.bench.common import print_table

    rows: list[list[Any]] = []
    for name in names():
        e = entry(name)
        try:
            env = make(name, 1, "cpu", **dict(args.option))
        except Exception as exc:  # an env whose optional backend is missing is still listed
            rows.append([name, e.family, "-", "-", f"unavailable: {exc}".split("\n")[0], "-"])
            continue
        with env:
            feats = ", ".join(env.features.names)
            if len(feats) > 40:
                feats = feats[:37] + "..."
            rows.append([name, e.family, env.obs_dim, env.action_dim, feats, env.max_episode_steps])
    print_table(
        "myriad environments (make(name, num_envs, device, **options))",
        ["name", "family", "obs", "act", "entropy features", "time limit"],
        rows,
    )
    return 0


def _check_envs(args: argparse.Namespace) -> int:
    from rich.console import Console

    from myriad.envs import make, names
    from myriad.envs.checker import run_checks

    console = Console()
    targets = names() if args.all else args.names
    if not targets:
        console.print("give env names or --all")
        return 2
    status = 0
    for name in targets:
        env = make(name, args.num_envs, args.device, **dict(args.option))
        with env:
            report = run_checks(env, steps=args.steps, seed=args.seed)
        mark = "[green]ok[/green]" if report.ok else "[red]FAILED[/red]"
        console.print(f"{name}: {mark}")
        for check, ok, detail in report.rows:
            console.print(f"  {'✓' if ok else '✗'} {check}" + ("" if ok else f": {detail}"))
        status |= 0 if report.ok else 1
    return status


def _cmd_stage(kind: str, args: argparse.Namespace, overrides: list[str]) -> int:
    """``myriad pretrain|finetune``: a sweep or the config (:mod:`myriad.tools.sweep`), or one
    run with the collaborators the command chooses: on a torchrun rank its share of the run
    (:mod:`myriad.distributed.torchdist`), and Ray workers for a config's ``distributed`` envs."""
    if args.multirun or args.cfg or args.jobs != 1:
        from myriad.tools.sweep import launch

        return launch(kind, args, overrides)
    from myriad.distributed import make_distributed, torchdist

    options: dict[str, Any] = {
        "resume": args.resume,
        "run_dir": args.run_dir,
        "overwrite": args.overwrite,
        "remote_envs": make_distributed,
    }
    if kind == "pretrain":
        from myriad.pretrain.api import pretrain

        pretrain(overrides, ranks=torchdist.pretrain_on_ranks, **options)
    else:
        from myriad.finetune.api import finetune

        finetune(args.algo, overrides, init=args.init, ranks=torchdist.finetune_on_ranks, **options)
    return 0


def _cmd_bench(args: argparse.Namespace, rest: list[str]) -> int:
    module = importlib.import_module(BENCHMARKS[args.which])
    return int(module.main(rest))


def _cmd_doctor(args: argparse.Namespace) -> int:
    from myriad.utils.doctor import report

    text, ok = report()
    print(text)
    return 0 if ok else 1


def _parse_goal(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    import math

    parts = [p for p in text.replace(",", " ").split() if p]
    try:
        x, y = (float(p) for p in parts)
    except ValueError:  # not two parts, or not numbers
        raise argparse.ArgumentTypeError(f"--goal takes X,Y (two numbers), got {text!r}") from None
    if not (math.isfinite(x) and math.isfinite(y)):
        raise argparse.ArgumentTypeError(f"--goal takes two finite numbers, got {text!r}")
    return x, y


def _parse_members(values: list[str] | None) -> list[int] | None:
    if not values:
        return None
    try:
        members = [int(v) for item in values for v in item.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(
            f"--members takes member indices (0 3 or 0,3), got {' '.join(values)!r}"
        ) from exc
    if any(m < 0 for m in members):
        raise argparse.ArgumentTypeError(f"--members must be >= 0, got {members}")
    return members


def _parse_iterations(text: str | None) -> tuple[int | None, int | None] | None:
    """``A:B`` (either side may be empty or negative, as a Python slice) or ``A``."""
    if text is None:
        return None
    parts = text.split(":")
    try:
        if len(parts) == 1:
            first = int(parts[0])
            return first, (first + 1) or None
        if len(parts) == 2:
            return tuple(int(p) if p.strip() else None for p in parts)  # type: ignore[return-value]
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(
        f"--iterations takes START:STOP (0-based, STOP excluded, negatives count from the end, "
        f"e.g. -10: for the last ten), got {text!r}"
    )


def _cmd_export(args: argparse.Namespace) -> int:
    from myriad.datasets import export

    try:
        result = export(
            args.run,
            args.format,
            out=args.out,
            members=_parse_members(args.members),
            dataset_id=args.dataset_id,
            task=args.task,
            goal=_parse_goal(args.goal),
            chunk_rows=args.chunk_rows,
            final_population=args.final_population,
            iterations=_parse_iterations(args.iterations),
            budget=args.budget,
            seed=args.seed,
        )
    except (ValueError, argparse.ArgumentTypeError, FileExistsError) as exc:
        # Incomplete sources, unknown members, existing outputs: one line, not a traceback.
        return _error(exc)
    rate = result.rows / max(result.seconds, 1e-9)
    print(
        f"exported {result.rows:,} rows to {result.path} ({args.format}) in "
        f"{result.seconds:.1f} s ({rate:,.0f} rows/s)"
    )
    return 0


def _cmd_dataset(args: argparse.Namespace) -> int:
    import json

    from myriad.datasets import dataset_info, validate
    from myriad.datasets.inspection import info_text

    if args.action == "verify":
        from myriad.datasets.verify import verify_command

        return verify_command(args.path)
    if args.action == "info":
        try:
            info = dataset_info(args.path, goal=_parse_goal(args.goal))
        except (
            ValueError,
            argparse.ArgumentTypeError,
        ) as exc:  # an incomplete or unreadable dataset: say so and fail
            return _error(exc, status=1)
        print(json.dumps(info, indent=2) if args.json else info_text(info))
        return 0
    report = validate(args.path)
    print(report.text())
    return 0 if report.ok else 1


def _viz_command(name: str, args: argparse.Namespace) -> int:
    from myriad.viz import commands

    return int(getattr(commands, name)(args))


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="myriad", description="Populations of policies at scale (K-Myriad, CPO)."
    )
    from myriad import __version__

    parser.add_argument("--version", action="version", version=f"myriad {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help="show tracebacks (also MYRIAD_DEBUG=1)"
    )
    sub = parser.add_subparsers(dest="command", required=True)

    envs = sub.add_parser("envs", help="list environments or check their contract")
    envs.add_argument("action", nargs="?", choices=["list", "check"], default="list")
    envs.add_argument("names", nargs="*", help="env names to check")
    envs.add_argument("--all", action="store_true", help="check every registered env")
    envs.add_argument("--num-envs", type=positive_int, default=8)
    envs.add_argument("--device", default="cpu", type=device_name)
    envs.add_argument("--steps", type=positive_int, default=64)
    envs.add_argument("--seed", type=int, default=0)
    envs.add_argument(
        "--module",
        action="append",
        default=[],
        help="import this module first (it registers your envs); repeatable",
    )
    envs.add_argument(
        "--option",
        action="append",
        default=[],
        type=_env_option,
        metavar="KEY=VALUE",
        help="an env option (YAML value), e.g. env_id=Hopper-v5; repeatable",
    )

    from myriad.tools.sweep import add_run_options, config_help

    pre = sub.add_parser(
        "pretrain",
        help="K-Myriad pretraining; arguments are Hydra overrides (population.size=16 ...)",
        epilog=config_help("pretrain"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_options(pre)
    pre.add_argument("--resume", metavar="RUN", help="run folder or checkpoint to continue")
    pre.add_argument("--run-dir", help="run folder (default runs/pretrain/<env>-<time>)")
    pre.add_argument(
        "--overwrite", action="store_true", help="replace the run already in --run-dir"
    )

    fine = sub.add_parser(
        "finetune",
        help="finetune a leader and followers on a task reward (cpo, sapg, ppo, pbt); "
        "arguments are Hydra overrides (task=dense algo.kl_preset=high ...)",
        epilog=config_help("finetune"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_run_options(fine)
    fine.add_argument(
        "--algo",
        help="cpo | sapg | ppo | pbt, or a preset such as cpo_paper (default: cpo)",
    )
    fine.add_argument(
        "--init", metavar="RUN_OR_CHECKPOINT", help="start from a pretrained population"
    )
    fine.add_argument("--resume", metavar="RUN", help="run folder or checkpoint to continue")
    fine.add_argument("--run-dir", help="run folder (default runs/finetune/<algo>-<env>-<time>)")
    fine.add_argument(
        "--overwrite", action="store_true", help="replace the run already in --run-dir"
    )

    # No -h of its own: `myriad bench knn --help` shows the benchmark's options.
    bench = sub.add_parser(
        "bench", help="benchmarks; extra flags go to the benchmark", add_help=False
    )
    bench.add_argument("which", choices=sorted(BENCHMARKS))

    export = sub.add_parser(
        "export", help="convert a pretraining run's dataset to hdf5 | zarr | minari, streaming"
    )
    export.add_argument("run", metavar="RUN", help="run folder or dataset (any format)")
    export.add_argument("--format", required=True, choices=["hdf5", "zarr", "minari"])
    export.add_argument(
        "--members", nargs="+", metavar="M", help="keep these members only (0 3 or 0,3)"
    )
    export.add_argument(
        "--out",
        help="output file (hdf5) or store (zarr), or the Minari datasets root (minari; default "
        "$MINARI_DATASETS_PATH or ~/.minari/datasets); default: next to the source",
    )
    export.add_argument("--dataset-id", help="Minari dataset id (default myriad/<env>/<run>-v0)")
    export.add_argument(
        "--task", choices=["sparse", "dense"], help="relabel rewards with this nav task"
    )
    export.add_argument("--goal", metavar="X,Y", help="the task's goal (default: the env's)")
    export.add_argument(
        "--chunk-rows", type=positive_int, default=16384, help="rows per read/write (>= 1)"
    )
    pick = export.add_argument_group(
        "choosing the data (default: every row of the run; docs/datasets.md)"
    )
    pick.add_argument(
        "--final-population",
        type=positive_int,
        metavar="N",
        help="N fresh transitions of the run's final population (its last checkpoint)",
    )
    pick.add_argument(
        "--iterations",
        metavar="A:B",
        help="episodes that ended in pretraining iterations A..B-1 (--iterations=-10: the last 10)",
    )
    pick.add_argument(
        "--budget",
        type=positive_int,
        metavar="N",
        help="at most N transitions, whole episodes chosen greedily for new grid cells",
    )
    pick.add_argument("--seed", type=int, default=0, help="seed of the --final-population rollouts")

    data = sub.add_parser(
        "dataset",
        help="summarise (info) or check (validate) a dataset; verify every checksum of a run",
    )
    data.add_argument("action", choices=["info", "validate", "verify"])
    data.add_argument("path", metavar="PATH", help="dataset (hdf5 | zarr | minari) or run folder")
    data.add_argument("--json", action="store_true", help="info as JSON")
    data.add_argument(
        "--goal", metavar="X,Y", help="info: also count the transitions that reach this goal"
    )

    sub.add_parser("doctor", help="report installed components (faiss CPU/GPU, CUDA, extras)")
    from myriad.viz.commands import add_render_parser, add_report_parser

    add_render_parser(sub)
    add_report_parser(sub)
    from myriad.tools import add_parsers

    add_parsers(sub)  # eval, export-policy, sweep (myriad.tools)
    return parser


def _user_errors() -> tuple[type[BaseException], ...]:
    """Errors caused by what the user asked for or gave: one line that names the fix."""
    from myriad.datasets.recorder import DatasetStateError
    from myriad.datasets.schema import CorruptDatasetError, IncompleteDatasetError
    from myriad.envs.base import ActionError
    from myriad.envs.layout import LayoutError
    from myriad.envs.registry import EnvConfigError, EnvOptionError, UnknownEnvError
    from myriad.rl.runner import RunWriteError
    from myriad.utils.checkpoint import CheckpointError, ConfigMismatchError
    from myriad.utils.config import ConfigError
    from myriad.utils.optional import MissingDependencyError

    return (
        UnknownEnvError,
        EnvOptionError,
        EnvConfigError,
        LayoutError,
        ActionError,
        MissingDependencyError,
        FileNotFoundError,
        FileExistsError,
        ConfigError,
        ConfigMismatchError,
        CheckpointError,
        DatasetStateError,
        IncompleteDatasetError,
        CorruptDatasetError,
        RunWriteError,
        argparse.ArgumentTypeError,
    )


def _error(exc: BaseException | str, status: int = 2) -> int:
    """Print ``exc`` on one line of stderr (a message of several lines joined with "; ")."""
    text = "; ".join(line.strip() for line in str(exc).splitlines() if line.strip())
    text = text or type(exc).__name__
    print(f"myriad: error: {text}", file=sys.stderr)
    return status


def _os_error(exc: OSError, argv: list[str]) -> str:
    """A failed read or write in words: what, where, what to do and the command to run next
    (the same command again: training runs name their ``--resume`` command themselves)."""
    import errno
    import shlex

    # A DatasetWriteError names its file in its message; its cause holds the errno.
    cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
    code = exc.errno if exc.errno is not None else cause.errno
    where = f" {exc.filename}" if exc.filename else ""
    reason = exc.strerror or str(exc)
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        fix = "free disk space (or raise the limit)"
    elif code in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "choose a folder you can write to or fix its permissions"
    else:
        fix = "check the path and the disk"
    again = shlex.join(["myriad", *argv])
    if not exc.filename and exc.errno is None and str(exc).strip():
        # A DatasetWriteError: its message already says which write failed and what survived.
        return f"{str(exc).strip().rstrip('.')}; {fix}, then run: {again}"
    return f"cannot read or write{where}: {reason}; {fix}, then run: {again}"


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in args or os.environ.get("MYRIAD_DEBUG", "") not in ("", "0")
    args = [a for a in args if a != "--debug"]
    if debug:
        return _dispatch(args)
    return _end_failed_rank(_run_reporting_errors(args))


def _end_failed_rank(status: int) -> int:
    """``status``; a rank of a torchrun launch that failed with its process group still open
    ends here, its output flushed, without the interpreter's shutdown: there, the group's gloo
    threads, blocked on a peer that has gone, abort the process ("terminate called without an
    active exception" on stderr after the rank's one-line message). Everything of the run was
    closed on the way out (``run_to_completion`` closes the runner whatever happens)."""
    from myriad.utils.launch import on_torchrun_rank

    dist = sys.modules.get("torch.distributed")
    group_open = dist is not None and dist.is_available() and dist.is_initialized()
    if status and group_open and on_torchrun_rank():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    return status


def _run_reporting_errors(args: list[str]) -> int:
    """``myriad ARGS``; a user's error, or an internal one, becomes one line on stderr."""
    try:
        return _dispatch(args)
    except _user_errors() as exc:
        return _error(exc)
    except BrokenPipeError:
        # The reader of our output went away (`myriad dataset validate RUN | head -1`): stop
        # quietly, and keep Python from complaining again when it flushes stdout at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print(
            "myriad: interrupted; a run continues from its last checkpoint with --resume",
            file=sys.stderr,
        )
        return 130
    except OSError as exc:
        return _error(_os_error(exc, args), status=1)
    except Exception as exc:  # an internal error: one line, the traceback on request
        from myriad.utils.launch import launch_rank, lost_in_collective

        if lost_in_collective(exc):
            # Another rank of the torchrun launch ended: it printed the cause (rank 0 prints
            # what every rank hit alike), so the other ranks stay quiet.
            if launch_rank() != 0:
                return 1
            # gloo's text: "[.../pair.cc:537] Read error [host]:port: Connection reset by peer.
            # This is typically caused by ..." -> the part between the location and the advice.
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            reason = reason.split("] ", 1)[1] if reason.startswith("[") else reason
            return _error(
                f"another rank of this torchrun launch stopped during a collective "
                f"({reason.split('. ')[0].rstrip('.')}): its message, or torchrun's report of "
                "how it ended, names the cause",
                status=1,
            )
        return _error(
            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            " (run again with --debug or MYRIAD_DEBUG=1 for the traceback)",
            status=1,
        )


def _dispatch(argv: list[str]) -> int:
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    handlers: dict[str, Callable[[], int]] = {
        "envs": lambda: _cmd_envs(args),
        "bench": lambda: _cmd_bench(args, rest),
        "pretrain": lambda: _cmd_stage("pretrain", args, rest),
        "finetune": lambda: _cmd_stage("finetune", args, rest),
        "doctor": lambda: _cmd_doctor(args),
        "export": lambda: _cmd_export(args),
        "dataset": lambda: _cmd_dataset(args),
        "render": lambda: _viz_command("run_render", args),
        "report": lambda: _viz_command("run_report", args),
    }
    from myriad.tools import COMMANDS, TAKES_OVERRIDES
    from myriad.tools import run as run_tool

    for name in COMMANDS:
        handlers[name] = lambda name=name: run_tool(name, args, rest)  # type: ignore[misc]
    if rest and args.command not in ("bench", "pretrain", "finetune", *TAKES_OVERRIDES):
        parser.error(f"unrecognised arguments: {' '.join(rest)}")
    return handlers[args.command]()


if __name__ == "__main__":
    raise SystemExit(main())
