"""``myriad.pretrain.pretrain``: compose the config, run K-Myriad, report where the results are."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from myriad.envs import RemoteEnvFactory
from myriad.pretrain.settings import check_pretrain_config
from myriad.rl.runner import train_in_folder
from myriad.utils.config import compose, resumed_config
from myriad.utils.launch import RankRunner, RunRequest, on_torchrun_rank, run_on_ranks
from myriad.utils.loggers import LogBackend
from myriad.utils.logging import print_report


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
    *,
    ranks: RankRunner | None = None,
    remote_envs: RemoteEnvFactory | None = None,
    log_backends: Sequence[LogBackend] = (),
) -> dict[str, Any]:
    """Run K-Myriad pretraining; returns the run summary (also in ``<run>/summary.json``).

    Args:
        overrides: Hydra overrides, e.g. ``["env=two_rooms", "population.size=16"]``.
        resume: a run folder or checkpoint to continue (its config is reused).
        run_dir: where to write the run (default ``runs/pretrain/<env>-<time>``); a folder
            that already holds files is refused unless ``overwrite``.
        quiet: do not print the closing report.
        overwrite: replace the run in ``run_dir`` (a myriad run folder) instead of refusing.
        ranks: what runs the call on a rank of a ``torchrun`` launch
            (:func:`myriad.distributed.torchdist.pretrain_on_ranks`; ``myriad pretrain`` passes
            it there).
        remote_envs: builds the envs of a config with a ``distributed`` entry
            (:func:`myriad.distributed.make_distributed`, Ray workers; ``myriad pretrain``
            passes it).
        log_backends: trackers of the caller's own that the run's scalars and config also go
            to, beside the config's ``logger`` (objects with the methods of
            :class:`myriad.utils.loggers.LogBackend`; not used on torchrun ranks).
    """
    from myriad.pretrain.runner import PretrainRunner

    if on_torchrun_rank():
        request = RunRequest(overrides, resume, run_dir, quiet, overwrite)
        return run_on_ranks("pretrain", request, ranks)
    cfg = resolve_config(overrides, resume)
    summary, folder = train_in_folder(
        "pretrain",
        # runs/pretrain/<env>-<time>: a Gymnasium env's id rather than "gymnasium"
        str(cfg["env"].get("id") or cfg["env"]["name"]).replace("/", "-"),
        cfg,
        lambda c, folder: PretrainRunner(
            c, folder, remote_envs=remote_envs, log_backends=log_backends
        ),
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
