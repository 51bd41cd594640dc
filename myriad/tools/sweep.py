"""Sweeps: ``myriad pretrain -m seed=0,1 objective.beta=0.5,1`` (and ``finetune``), their
summary table (``myriad sweep summarize SWEEP``) and ``--cfg job``.

A sweep override uses Hydra's syntax (``key=a,b``, ``key=range(0,3)``, ``key=choice(a,b)``);
every combination is one run, run one after the other in this process, each in its own folder
under the sweep folder (``runs/sweeps/<command>-<date>-<time>`` or ``--run-dir``):
``000_seed=0,objective.beta=0.5`` and so on. ``sweep.json`` lists the command, the
combinations, each run's folder and state (``pending``, ``running``, ``done``, ``failed``) and
is rewritten as the sweep goes. Every combination's config is composed and checked before the
first run starts, so a bad value stops the sweep before anything trains.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: The sweep's own file in its folder.
SWEEP_FILE = "sweep.json"
#: Overrides that make repetitions rather than settings: runs that differ only in them form one
#: setting of the summary (mean and interval over them).
REPETITION_KEYS = ("seed",)

#: Final figures of the summary table per command: (label, where in summary.json).
PRETRAIN_FIGURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("union coverage (final population)", ("eval_coverage_union",)),
    ("union coverage (all visited)", ("scalars", "coverage/cumulative_union")),
    ("collective entropy", ("eval_entropy_collective",)),
    ("diversity", ("eval_entropy_diversity",)),
    ("steps/s", ("steps_per_second",)),
)
FINETUNE_FIGURES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("leader success", ("final_eval", "eval/leader_success")),
    ("leader return", ("final_eval", "eval/leader_return")),
    ("best member success", ("final_eval", "eval/population_success")),
    ("distinct solutions", ("solutions", "count")),
    ("steps/s", ("steps_per_second",)),
)


def expand(overrides: Sequence[str]) -> list[list[str]]:
    """Every combination of the sweep overrides of ``overrides`` (Hydra's syntax), the others
    kept in each: ``["seed=0,1", "env=maze"]`` -> ``[["seed=0", "env=maze"], ["seed=1",
    "env=maze"]]``. The first override varies slowest.

    Raises:
        ConfigError: an override Hydra cannot parse, or a glob sweep.
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    from myriad.utils.config import ConfigError

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
    except HydraException as exc:
        raise ConfigError(str(exc).splitlines()[0]) from exc
    choices: list[list[str]] = []
    for o in parsed:
        if not o.is_sweep_override():
            choices.append([o.input_line or ""])
            continue
        try:
            values = list(o.sweep_string_iterator())
        except HydraException:
            raise ConfigError(
                f"{o.input_line}: glob sweeps are not supported; list the options (env=maze,empty)"
            ) from None
        choices.append([f"{o.get_key_element()}={v}" for v in values])
    return [list(combo) for combo in itertools.product(*choices)]


def swept_keys(overrides: Sequence[str]) -> list[str]:
    """The keys that ``overrides`` sweep over (``["seed", "objective.beta"]``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(list(overrides))
    return [o.get_key_element().lstrip("+~") for o in parsed if o.is_sweep_override()]


def _key(override: str) -> str:
    return override.partition("=")[0].lstrip("+~")


def run_name(index: int, combo: Sequence[str], keys: Sequence[str]) -> str:
    """The folder name of a sweep's run: its index and the values of the swept keys."""
    parts = [o for o in combo if _key(o) in keys]
    text = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", ",".join(p.lstrip("+~") for p in parts))
    return f"{index:03d}_{text}"[:120] if text else f"{index:03d}"


def compose_run(kind: str, combo: Sequence[str], algo: str | None, init: str | None) -> Any:
    """The resolved config of one run of a sweep (what the run will use)."""
    if kind == "pretrain":
        from myriad.pretrain.api import resolve_config

        return resolve_config(combo)
    from myriad.finetune.api import resolve_config as resolve_finetune

    return resolve_finetune(algo, combo, init)


def _write(folder: Path, state: Mapping[str, Any]) -> None:
    from myriad.utils.checkpoint import atomic_write_text

    atomic_write_text(folder / SWEEP_FILE, json.dumps(state, indent=2) + "\n")


def run_sweep(
    kind: str,
    overrides: Sequence[str],
    *,
    algo: str | None = None,
    init: str | None = None,
    sweep_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    jobs: int = 1,
) -> Path:
    """Run every combination of ``overrides`` with ``myriad pretrain`` or ``myriad finetune``,
    one after the other in this process, or with ``jobs > 1`` up to ``jobs`` at once, each in
    a process of its own (``python -m myriad ...``, its output in ``<sweep>/<run>.log``);
    returns the sweep folder.

    Raises:
        ConfigError: a combination's config is unusable (nothing has run then).
        RunFolderError: ``sweep_dir`` holds files and ``overwrite`` is false.
    """
    from myriad.utils.config import ConfigError, RunFolderError

    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    combos = expand(overrides)
    keys = swept_keys(overrides)
    for combo in combos:  # every config checked before anything runs
        compose_run(kind, combo, algo, init)
    if sweep_dir is None:
        root = Path("runs") / "sweeps"
        root.mkdir(parents=True, exist_ok=True)
        folder = root / f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}"
        n = 1
        while folder.exists():
            folder = folder.with_name(f"{kind}-{time.strftime('%Y%m%d-%H%M%S')}-{n}")
            n += 1
    else:
        folder = Path(sweep_dir)
        if folder.exists() and any(folder.iterdir()):
            if not overwrite:
                raise RunFolderError(
                    f"{folder} already holds files: choose another --run-dir for the sweep, or "
                    "pass --overwrite to replace it"
                )
            if not (folder / SWEEP_FILE).is_file():
                raise RunFolderError(
                    f"--overwrite replaces only sweep folders, and {folder} has no {SWEEP_FILE}: "
                    "choose another --run-dir"
                )
            import shutil

            shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = [
        {"name": run_name(i, combo, keys), "overrides": combo, "state": "pending"}
        for i, combo in enumerate(combos)
    ]
    state: dict[str, Any] = {
        "command": kind,
        "algo": algo,
        "init": init,
        "overrides": list(overrides),
        "swept": keys,
        "runs": runs,
    }
    _write(folder, state)
    _execute(state, folder, jobs)
    print(f"myriad: sweep of {len(runs)} runs finished: {folder}")
    print(f"  summary  myriad sweep summarize {folder}")
    return folder


def resume_sweep(sweep_dir: str | os.PathLike[str], jobs: int = 1) -> Path:
    """Finish an interrupted sweep: runs marked ``done`` are kept, runs with a checkpoint
    continue from it (``--resume``), the others start afresh. Returns the sweep folder.

    Raises:
        FileNotFoundError: no ``sweep.json`` in ``sweep_dir``.
    """
    from myriad.utils.config import ConfigError

    if jobs < 1:
        raise ConfigError(f"--jobs must be >= 1, got {jobs}")
    folder = Path(sweep_dir)
    state = _read_state(folder)
    runs = state["runs"]
    left = sum(r.get("state") != "done" for r in runs)
    print(f"myriad: resuming sweep {folder}: {len(runs) - left} of {len(runs)} runs done")
    _execute(state, folder, jobs)
    print(f"myriad: sweep of {len(runs)} runs finished: {folder}")
    print(f"  summary  myriad sweep summarize {folder}")
    return folder


def _read_state(folder: Path) -> dict[str, Any]:
    from myriad.utils.config import ConfigError

    path = folder / SWEEP_FILE
    if not path.is_file():
        raise FileNotFoundError(
            f"no {SWEEP_FILE} in {folder}: give the folder a sweep (myriad pretrain -m ...) wrote"
        )
    try:
        state = json.loads(path.read_text())
    except ValueError as exc:
        raise ConfigError(f"{path} is not a myriad sweep file ({exc})") from exc
    missing = [
        k for k in ("command", "runs", "swept") if not isinstance(state, dict) or k not in state
    ]
    if missing:
        raise ConfigError(f"{path} is not a myriad sweep file (no {', '.join(missing)})")
    return dict(state)


def _how(folder: Path, entry: Mapping[str, Any]) -> str:
    """How run ``entry`` of a sweep (re)starts: ``"resume"`` from its checkpoint, ``"fresh"``
    in an empty or absent folder, ``"overwrite"`` a folder a start left without checkpoint."""
    from myriad.utils.checkpoint import latest_checkpoint

    run = folder / entry["name"]
    if latest_checkpoint(run / "checkpoints") is not None:
        return "resume"
    return "overwrite" if (run / "config.yaml").is_file() else "fresh"


def _execute(state: dict[str, Any], folder: Path, jobs: int) -> None:
    """Run the sweep's runs not ``done`` yet, in this process or (``jobs > 1``) as processes."""
    if jobs > 1:
        _run_parallel(state, folder, jobs)
        return
    from myriad.distributed import make_distributed  # the env workers of `distributed=` runs

    kind, algo, init = state["command"], state.get("algo"), state.get("init")
    runs = state["runs"]
    for i, entry in enumerate(runs):
        if entry.get("state") == "done":
            continue
        _announce(i, runs, folder)
        how = _how(folder, entry)
        entry["state"] = "running"
        _write(folder, state)
        run_dir = folder / entry["name"]
        resume = run_dir if how == "resume" else None
        options: dict[str, Any] = {
            "resume": resume,
            "run_dir": None if resume else run_dir,
            "overwrite": how == "overwrite",
        }
        try:
            if kind == "pretrain":
                from myriad.pretrain import pretrain

                pretrain(entry["overrides"], remote_envs=make_distributed, **options)
            else:
                from myriad.finetune import finetune

                finetune(
                    algo,
                    entry["overrides"],
                    init=None if resume else init,
                    remote_envs=make_distributed,
                    **options,
                )
        except BaseException:
            entry["state"] = "failed"
            _write(folder, state)
            raise
        entry["state"] = "done"
        _write(folder, state)


def _announce(i: int, runs: Sequence[Mapping[str, Any]], folder: Path) -> None:
    print(
        f"myriad: sweep run {i + 1}/{len(runs)} ({folder / runs[i]['name']}): "
        + " ".join(runs[i]["overrides"]),
        flush=True,
    )


def _command(state: Mapping[str, Any], entry: Mapping[str, Any], folder: Path) -> list[str]:
    """The command line of one run of a sweep, as its own process (see :func:`_how`)."""
    import sys

    argv = [sys.executable, "-m", "myriad", str(state["command"])]
    run_dir = str(folder / entry["name"])
    if state.get("algo"):
        argv += ["--algo", str(state["algo"])]
    how = _how(folder, entry)
    if how == "resume":
        return [*argv, "--resume", run_dir, *entry["overrides"]]
    if state.get("init"):
        argv += ["--init", str(state["init"])]
    argv += [*entry["overrides"], "--run-dir", run_dir]
    return [*argv, "--overwrite"] if how == "overwrite" else argv


def _run_parallel(state: dict[str, Any], folder: Path, jobs: int) -> None:
    """Run the sweep's runs as processes, at most ``jobs`` at once, in order of index. After a
    failure no new run starts; the running ones finish, then the failure is raised."""
    import subprocess

    from myriad.utils.config import ConfigError

    runs = state["runs"]
    waiting = [i for i, r in enumerate(runs) if r.get("state") != "done"]
    running: dict[int, tuple[subprocess.Popen[bytes], Any]] = {}
    failed: list[str] = []
    try:
        while waiting or running:
            while waiting and len(running) < jobs and not failed:
                i = waiting.pop(0)
                _announce(i, runs, folder)
                log = open(folder / f"{runs[i]['name']}.log", "ab")  # noqa: SIM115 (closed below)
                proc = subprocess.Popen(
                    _command(state, runs[i], folder), stdout=log, stderr=subprocess.STDOUT
                )
                running[i] = (proc, log)
                runs[i]["state"] = "running"
                _write(folder, state)
            if failed and not running:
                break
            done = [i for i, (proc, _) in running.items() if proc.poll() is not None]
            if not done:
                time.sleep(0.2)
                continue
            for i in done:
                proc, log = running.pop(i)
                log.close()
                runs[i]["state"] = "done" if proc.returncode == 0 else "failed"
                if proc.returncode != 0:
                    failed.append(f"{runs[i]['name']} (exit {proc.returncode})")
                print(f"myriad: sweep run {i + 1}/{len(runs)} {runs[i]['state']}", flush=True)
            _write(folder, state)
    finally:
        for proc, log in running.values():  # interrupted: stop the runs this sweep started
            proc.terminate()
            proc.wait()
            log.close()
    if failed:
        raise ConfigError(
            f"sweep runs failed: {', '.join(failed)}; their output is in {folder}/<run>.log"
        )


def _lookup(summary: Mapping[str, Any], path: Sequence[str]) -> float | None:
    node: Any = summary
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            return None
        node = node[key]
    return float(node) if isinstance(node, (int, float)) and not isinstance(node, bool) else None


def summarize(sweep_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The final figures of every finished run of a sweep, and per setting (the runs that differ
    only in :data:`REPETITION_KEYS`) their mean with a 95% Student-t interval.

    Raises:
        FileNotFoundError: no ``sweep.json`` in ``sweep_dir``.
        ConfigError: a ``sweep.json`` that is not a sweep's.
    """
    from myriad.tools.evaluate import mean_interval

    folder = Path(sweep_dir)
    state = _read_state(folder)
    kind, runs, swept = state["command"], state["runs"], state["swept"]
    figures = PRETRAIN_FIGURES if kind == "pretrain" else FINETUNE_FIGURES
    labels = [label for label, _ in figures]
    setting_keys = [k for k in swept if k not in REPETITION_KEYS]
    rows, missing = [], []
    for entry in runs:
        summary_file = folder / entry["name"] / "summary.json"
        if entry.get("state") != "done" or not summary_file.is_file():
            missing.append(f"{entry['name']} ({entry.get('state', '?')})")
            continue
        summary = json.loads(summary_file.read_text())
        figures_of_run = {label: _lookup(summary, where) for label, where in figures}
        setting = " ".join(o for o in entry["overrides"] if _key(o) in setting_keys) or "-"
        rows.append({"run": entry["name"], "setting": setting, **figures_of_run})
    settings = []
    for setting in dict.fromkeys(r["setting"] for r in rows):
        members = [r for r in rows if r["setting"] == setting]
        stats = {}
        for label in labels:
            values = [r[label] for r in members if r[label] is not None]
            stats[label] = mean_interval(values) if values else None
        settings.append({"setting": setting, "runs": len(members), **stats})
    return {
        "sweep": str(folder),
        "command": kind,
        "figures": labels,
        "runs": rows,
        "settings": settings,
        "unfinished": missing,
    }


def _number(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.3g}"


def table_markdown(result: Mapping[str, Any]) -> str:
    """The summary as two Markdown tables: per run, then per setting (mean [95% CI])."""
    labels = result["figures"]
    lines = [f"# Sweep {result['sweep']} ({result['command']})", "", "## Runs", ""]
    lines.append("| run | setting | " + " | ".join(labels) + " |")
    lines.append("|" + " --- |" * (len(labels) + 2))
    for r in result["runs"]:
        cells = [_number(r[label]) for label in labels]
        lines.append(f"| {r['run']} | {r['setting']} | " + " | ".join(cells) + " |")
    lines += ["", "## Settings: mean [95% CI] over runs", ""]
    lines.append("| setting | runs | " + " | ".join(labels) + " |")
    lines.append("|" + " --- |" * (len(labels) + 2))
    for s in result["settings"]:
        cells = []
        for label in labels:
            stat = s[label]
            if stat is None:
                cells.append("-")
            elif stat["low"] is None:
                cells.append(_number(stat["mean"]))
            else:
                cells.append(
                    f"{_number(stat['mean'])} [{_number(stat['low'])}, {_number(stat['high'])}]"
                )
        lines.append(f"| {s['setting']} | {s['runs']} | " + " | ".join(cells) + " |")
    if result["unfinished"]:
        lines += ["", "Not finished: " + ", ".join(result["unfinished"])]
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------ commands


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """``-m/--multirun`` and ``--cfg job`` for ``myriad pretrain`` and ``myriad finetune``."""
    parser.add_argument(
        "-m",
        "--multirun",
        action="store_true",
        help="sweep: run every combination of the overrides' values (seed=0,1 "
        "objective.beta=0.5,1), one after the other, in a sweep folder (--run-dir)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=1,
        help="with -m, run up to this many runs at once, each in its own process (default 1: "
        "one after the other)",
    )
    parser.add_argument(
        "--cfg",
        choices=["job"],
        help="print the resolved config (each combination's with -m) and exit",
    )


def config_help(kind: str) -> str:
    """The epilog of ``myriad pretrain|finetune --help``: the config groups and their options
    (read from the packaged configs, without importing Hydra), and how to see every key."""
    root = Path(__file__).resolve().parent.parent / "configs"
    # The groups in the command's defaults list ("  - env: maze").
    used = re.findall(r"^\s+- (\w+):", (root / f"{kind}.yaml").read_text(), re.MULTILINE)
    lines = ["config groups (choose with GROUP=OPTION):"]
    for group in sorted(p for p in root.iterdir() if p.is_dir() and p.name in used):
        options = ", ".join(sorted(f.stem for f in group.glob("*.yaml")))
        lines.append(f"  {group.name}: {options}")
    lines += [
        f"every key with its type, default, range and help: myriad config {kind}",
        f"the resolved config of a run: myriad {kind} [overrides] --cfg job",
        f"sweep: myriad {kind} -m seed=0,1,2 KEY=A,B  (then: myriad sweep summarize SWEEP)",
    ]
    return "\n".join(lines)


def launch(kind: str, args: argparse.Namespace, overrides: list[str]) -> int:
    """``myriad pretrain|finetune`` with ``-m`` or ``--cfg job``."""
    from omegaconf import OmegaConf

    from myriad.utils.config import ConfigError

    algo = getattr(args, "algo", None)
    init = getattr(args, "init", None)
    if args.resume is not None and (args.multirun or args.cfg):
        raise ConfigError("--resume continues one run: it takes neither -m nor --cfg")
    if args.cfg == "job":
        combos = expand(overrides) if args.multirun else [overrides]
        for combo in combos:
            if len(combos) > 1:
                print(f"# {' '.join(combo)}")
            print(OmegaConf.to_yaml(compose_run(kind, combo, algo, init)), end="")
        return 0
    if args.jobs != 1 and not args.multirun:
        raise ConfigError("--jobs runs the runs of a sweep at once: add -m")
    run_sweep(
        kind,
        overrides,
        algo=algo,
        init=init,
        sweep_dir=args.run_dir,
        overwrite=args.overwrite,
        jobs=args.jobs,
    )
    return 0


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """Add ``sweep`` to the ``myriad`` subcommands."""
    p = sub.add_parser(
        "sweep",
        help="summarize: the table of a sweep (myriad pretrain|finetune -m ...), final figures "
        "per run, mean and 95%% CI per setting (SWEEP/summary.md, summary.json); resume: finish "
        "an interrupted sweep",
    )
    p.add_argument("action", choices=["summarize", "resume"])
    p.add_argument("sweep", metavar="SWEEP", help="the sweep folder")
    p.add_argument(
        "--jobs", type=int, default=1, help="resume: runs at once, each in its own process"
    )
    return p


def run(args: argparse.Namespace, rest: list[str]) -> int:
    """``myriad sweep summarize``: print the tables and write them beside ``sweep.json``;
    ``myriad sweep resume``: finish an interrupted sweep."""
    from myriad.utils.checkpoint import atomic_write_text

    if args.action == "resume":
        resume_sweep(args.sweep, args.jobs)
        return 0

    result = summarize(args.sweep)
    text = table_markdown(result)
    print(text, end="")
    folder = Path(args.sweep)
    atomic_write_text(folder / "summary.md", text)
    atomic_write_text(folder / "summary.json", json.dumps(result, indent=2) + "\n")
    print(f"\ntables  {folder / 'summary.md'}  {folder / 'summary.json'}")
    return 0
