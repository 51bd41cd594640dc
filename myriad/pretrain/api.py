"""``myriad.pretrain.pretrain``: compose the config, run K-Myriad, report where the results are."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from myriad.pretrain.settings import check_pretrain_config
from myriad.rl.runner import train_in_folder
from myriad.utils.config import compose, resumed_config
from myriad.utils.logging import print_report

#: The package that runs pretraining on the ranks of a ``torchrun`` launch. It sits above
#: pretraining (it extends the runner), so it is imported by name on the first launch and
#: installs its entry point with :func:`set_rank_launcher`.
RANKS_MODULE = "myriad.distributed.torchdist"
_rank_launcher: Callable[..., dict[str, Any]] | None = None


def set_rank_launcher(launcher: Callable[..., dict[str, Any]]) -> None:
    """Install what :func:`pretrain` runs on a rank of a ``torchrun`` launch:
    ``launcher(overrides, resume, run_dir, quiet, overwrite) -> summary``."""
    global _rank_launcher
    _rank_launcher = launcher


def resolve_config(
    overrides: Sequence[str] = (), resume: str | Path | None = None
) -> dict[str, Any]:
    """The run's config: composed from ``configs/pretrain.yaml`` and ``overrides``, or, when
    resuming, the run's saved config with ``overrides`` applied on top (the runner then refuses
    overrides that would change the experiment)."""
    if resume is None:
        cfg = compose("pretrain", overrides)
        check_pretrain_config(cfg)
        return cfg
    return resumed_config(resume, overrides, kind="pretrain", schema=check_pretrain_config)


def pretrain(
    overrides: Sequence[str] = (),
    resume: str | Path | None = None,
    run_dir: str | Path | None = None,
    quiet: bool = False,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Run K-Myriad pretraining; returns the run summary (also in ``<run>/summary.json``).

    Args:
        overrides: Hydra overrides, e.g. ``["env=two_rooms", "population.size=16"]``.
        resume: a run folder or checkpoint to continue (its config is reused).
        run_dir: where to write the run (default ``runs/pretrain/<env>-<time>``); a folder
            that already holds files is refused unless ``overwrite``.
        quiet: do not print the closing report.
        overwrite: replace the run in ``run_dir`` (a myriad run folder) instead of refusing.
    """
    from myriad.pretrain.runner import PretrainRunner

    if os.environ.get("WORLD_SIZE", "1") not in ("", "1"):  # a rank of a torchrun launch
        if _rank_launcher is None:
            importlib.import_module(RANKS_MODULE)  # installs its launcher
        if _rank_launcher is None:
            raise RuntimeError(f"{RANKS_MODULE} did not install a rank launcher")
        return _rank_launcher(overrides, resume, run_dir, quiet, overwrite)
    cfg = resolve_config(overrides, resume)
    summary, folder = train_in_folder(
        "pretrain",
        # runs/pretrain/<env>-<time>: a Gymnasium env's id rather than "gymnasium"
        str(cfg["env"].get("id") or cfg["env"]["name"]).replace("/", "-"),
        cfg,
        PretrainRunner,
        resume=resume,
        run_dir=run_dir,
        overwrite=overwrite,
    )
    if not quiet:
        report(summary, folder)
    return summary


def report(summary: dict[str, Any], folder: Path) -> None:
    """Print the headline numbers and where the checkpoint, dataset and plots are."""
    rows = [
        ("env steps", f"{summary.get('env_steps', 0):,}"),
        ("wall time", f"{summary.get('wall_time_s', 0):.1f} s"),
    ]
    # Coverage only where the env has a grid (bounded features): never a misleading 0%.
    if "coverage/cumulative_union" in summary:
        rows.append(
            (
                "union coverage, all states visited",
                f"{100 * summary['coverage/cumulative_union']:.1f}%",
            )
        )
    if "eval_coverage_union" in summary:
        rows.append(
            ("union coverage, final population", f"{100 * summary['eval_coverage_union']:.1f}%")
        )
    rows += [
        (
            "collective entropy, final population",
            f"{summary.get('eval_entropy_collective', float('nan')):.3f} nats",
        ),
        (
            "diversity, final population",
            f"{summary.get('eval_entropy_diversity', float('nan')):.3f} nats",
        ),
    ]
    print_report(
        f"K-Myriad pretraining finished ({folder})",
        rows,
        [
            ("checkpoint", summary.get("checkpoint")),
            ("dataset", summary.get("dataset")),
            ("plots", summary.get("plots")),
            ("summary", folder / "summary.json"),
        ],
    )
