"""``myriad.finetune.finetune``: compose the config, optionally start from a pretrained
population, train, evaluate the leader, report where the results are."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from myriad.envs import RemoteEnvFactory
from myriad.finetune.algorithms import check_algorithm, check_algorithm_config
from myriad.finetune.init import init_config
from myriad.finetune.settings import check_finetune_config, note_coupling_mode
from myriad.nn.population import check_population
from myriad.rl.runner import train_in_folder
from myriad.utils.config import ConfigError, compose, resumed_config
from myriad.utils.launch import RankRunner, RunRequest, on_torchrun_rank, run_on_ranks
from myriad.utils.loggers import LogBackend
from myriad.utils.logging import print_report


def _algo_override(overrides: Sequence[str]) -> str | None:
    for o in overrides:
        key, _, value = o.partition("=")
        if key.lstrip("+~") == "algo":
            return value
    return None


def resolve_config(
    algo: str | None = None,
    overrides: Sequence[str] = (),
    init: str | Path | None = None,
    resume: str | Path | None = None,
) -> dict[str, Any]:
    """The run's config.

    A new run composes ``configs/finetune.yaml`` with ``algo=<algo>`` and ``overrides``; with
    ``init`` the population architecture is taken from that checkpoint (see
    :func:`myriad.finetune.init.init_config`). A resumed run reuses its saved config with
    ``overrides`` on top (the runner then refuses changes to the experiment).

    Raises:
        ConfigError: unknown algorithm, ``algo`` given twice differently, ``--init`` together
            with ``--resume``, or an unusable override.
    """
    if resume is not None:
        if init is not None:
            raise ConfigError(
                "--init starts a new run from a pretrained population and --resume continues a "
                "finetuning run: give one of them"
            )
        cfg: dict[str, Any] = resumed_config(
            resume, overrides, kind="finetune", schema=check_finetune_config
        )
        saved_algo = str(cfg.get("algo", {}).get("name"))
        if algo is not None and algo != saved_algo:
            raise ConfigError(f"{resume} is a run of algo={saved_algo}, not {algo}")
        return cfg
    given = _algo_override(overrides)
    if algo is not None and given is not None and given != algo:
        raise ConfigError(f"--algo {algo} contradicts the override algo={given}")
    chosen = algo or given
    name = check_algorithm_config(chosen) if chosen else None
    rest = [o for o in overrides if _algo_override([o]) is None]
    cfg = compose("finetune", ([f"algo={name}"] if name else []) + rest)
    check_algorithm(str(cfg["algo"]["name"]))
    check_finetune_config(cfg)
    note_coupling_mode(cfg["algo"], rest)
    if init is not None:
        init_config(cfg, init, rest)
    return cfg


def finetune(
    algo: str | None = None,
    overrides: Sequence[str] = (),
    init: str | Path | None = None,
    resume: str | Path | None = None,
    run_dir: str | Path | None = None,
    quiet: bool = False,
    overwrite: bool = False,
    *,
    ranks: RankRunner | None = None,
    remote_envs: RemoteEnvFactory | None = None,
    log_backends: Sequence[LogBackend] = (),
) -> dict[str, Any]:
    """Run finetuning; returns the run summary (also in ``<run>/summary.json``).

    Args:
        algo: ``"cpo"``, ``"sapg"``, ``"ppo"`` or ``"pbt"`` (default: the config's, ``cpo``).
        overrides: Hydra overrides, e.g. ``["task=dense", "algo.kl_preset=high"]``.
        init: a pretraining run folder or checkpoint to start from (see
            :mod:`myriad.finetune.init` for the rule); without it members start fresh.
        resume: a finetuning run folder or checkpoint to continue (its config is reused).
        run_dir: where to write the run (default ``runs/finetune/<algo>-<env>-<time>``).
        quiet, overwrite, remote_envs, log_backends: as for :func:`myriad.pretrain.pretrain`.
        ranks: as for :func:`myriad.pretrain.pretrain`, with
            :func:`myriad.distributed.torchdist.finetune_on_ranks`.
    """
    from myriad.finetune.runner import FinetuneRunner

    if on_torchrun_rank():
        request = RunRequest(overrides, resume, run_dir, quiet, overwrite, algo, init)
        return run_on_ranks("finetune", request, ranks)
    cfg = resolve_config(algo, overrides, init, resume)
    check_population(int(cfg["num_envs"]), int(cfg["population"]["size"]))
    summary, folder = train_in_folder(
        "finetune",
        f"{cfg['algo']['name']}-{cfg['env']['name']}",
        cfg,
        lambda c, folder: FinetuneRunner(
            c, folder, remote_envs=remote_envs, log_backends=log_backends
        ),
        resume=resume,
        run_dir=run_dir,
        overwrite=overwrite,
        # Also on --resume: a run stopped before its first checkpoint (during the ranking, say)
        # starts again from its saved config, initialisation included.
        start=(lambda r: r.initialise(source)) if (source := _init_source(cfg)) else None,
    )
    if not quiet:
        report(summary, folder)
    return summary


def _init_source(cfg: dict[str, Any]) -> str | None:
    """The pretrained population a run starts from (``init.source``), or None."""
    init = cfg.get("init")
    source = init.get("source") if isinstance(init, dict) else None
    return str(source) if source else None


def report(summary: dict[str, Any], folder: Path) -> None:
    """Print the headline numbers and where the checkpoint and plots are."""
    final = summary.get("final_eval") or {}
    rows = [
        ("env steps", f"{summary.get('env_steps', 0):,}"),
        ("wall time", f"{summary.get('wall_time_s', 0):.1f} s"),
        ("leader return (deterministic)", f"{final.get('eval/leader_return', float('nan')):.3f}"),
    ]
    if "eval/leader_success" in final:  # envs with a success flag
        success = f"{100 * final['eval/leader_success']:.1f}%"
        rows.insert(2, ("leader success (deterministic)", success))
    rows.extend(solution_rows(summary))
    rows.extend(coupling_rows(summary))
    init = summary.get("init")
    if init:
        rows.append(("initialised from", str(init["source"])))
        rows.append(("pretrained member per member", str(init["mapping"])))
        for difference in init.get("env_differences") or []:
            rows.append(("env differs from pretraining", difference))
    print_report(
        f"finetuning ({summary.get('algo')}) finished ({folder})",
        rows,
        [
            ("checkpoint", summary.get("checkpoint")),
            ("plots", folder / "plots"),
            ("summary", folder / "summary.json"),
        ],
    )


def _follower_values(scalars: dict[str, Any], key: str) -> list[float]:
    found = {
        int(name.rsplit("_", 1)[1]): float(value)
        for name, value in scalars.items()
        if name.startswith(f"{key}/follower_")
    }
    return [found[i] for i in sorted(found)]


def coupling_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Report rows of CPO's followers: the last iteration's KL to the leader, with the targets
    in the set-point mode (nothing for the other algorithms)."""
    scalars = summary.get("scalars") or {}
    kls = _follower_values(scalars, "cpo/kl")
    if not kls:
        return []
    text = ", ".join(f"{v:.3g}" for v in kls) + " nats"
    targets = _follower_values(scalars, "cpo/kl_target")
    if targets:
        text += " (targets " + ", ".join(f"{v:.3g}" for v in targets) + ")"
    return [("followers' KL to the leader", text)]


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def solution_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """Report rows of the final evaluation's solutions and of ``eval.perturb``'s robustness."""
    rows: list[tuple[str, str]] = []
    final = summary.get("final_eval") or {}
    if "eval/population_success" in final:
        rows.append(("best member success", _percent(final["eval/population_success"])))
    solutions = summary.get("solutions")
    if solutions:
        share = solutions["min_share"]
        # Without a success flag every episode counts: distinct behaviours, not solutions.
        kind, of = (
            ("solutions", "successes")
            if "eval/leader_success" in final
            else ("behaviours", "episodes")
        )
        rows.append(
            (
                f"distinct {kind} (population)",
                f"{solutions['count']} (routes with >= {100 * share:.0f}% of the {of})",
            )
        )
        routes = solutions["member_route"]
        rows.append(
            ("route per member", ", ".join(f"{m}: {r or '-'}" for m, r in enumerate(routes)))
        )
    robustness = summary.get("robustness")
    if robustness:
        before, after = robustness["before"], robustness.get("after")
        if after is None:
            rows.append(("leader's route walled off", robustness.get("reason", "not evaluated")))
        else:
            text = (
                f"best member {_percent(before['population_success'])} -> "
                f"{_percent(after['population_success'])}, leader "
                f"{_percent(before['leader_success'])} -> {_percent(after['leader_success'])}"
            )
            if not robustness.get("goal_reachable", True):
                text += " (the walls cut the start off the goal)"
            rows.append((f"route {robustness.get('route', '?')} walled off", text))
    return rows
