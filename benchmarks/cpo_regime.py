"""CPO, SAPG, PBT and PPO in the regime of the CPO paper: 6 blocks of 4,096 envs (24,576 envs;
PPO gets all of them), horizon 16, one shared initialisation, the authors' loss form
(``algo=cpo_paper`` / ``sapg_paper``), many seeds, IQM and 95% CIs (rliable).

Runs are long (5x10^7 env steps each by default), so the script works run by run and picks up
where it stopped:

    # train (resumable: a finished run is skipped, an interrupted one resumes from its checkpoint)
    python benchmarks/cpo_regime.py run --algos ppo,sapg,cpo,pbt --seeds 0-4
    # the scale sweep: envs per block 64, 512, 4,096 at equal env steps
    python benchmarks/cpo_regime.py run --envs-per-block 512 --env-steps 2e7
    # the two-stage recipe, pretraining counted in the budget: K-Myriad in the same regime, then
    # CPO from it with the rest of the env steps
    python benchmarks/cpo_regime.py pretrain --seeds 0-4 --env-steps 1e7
    python benchmarks/cpo_regime.py run --algos cpo,ppo \
        --init-from runs/bench/cpo_regime/pretrain/maze-far-b6x4096-seed{seed}
    # an ablation of the population machinery (VARIANTS), written to its own folder
    python benchmarks/cpo_regime.py run --task three-routes --algos sapg,cpo --variant independent
    # one run's per-iteration training statistics (each member's success, the leader's
    # off-policy diagnostics), beside its record
    python benchmarks/cpo_regime.py trace runs/bench/cpo_regime/three-routes-b6x4096/cpo-seed2
    # the same runs on two machines (a GPU's against the CPU's): outcome and speed per run
    python benchmarks/cpo_regime.py compare \
        benchmarks/results/cpo_regime_h200/three-routes-b6x4096 \
        benchmarks/results/cpo_regime/three-routes-b6x4096 \
        --out benchmarks/results/cpo_regime_h200/vs_cpu.json
    # aggregate whatever runs have finished into one JSON + PNG
    python benchmarks/cpo_regime.py summarize benchmarks/results/cpo_regime/maze-far-b6x4096
    # the scale sweep's folders together: final score and area against envs per block
    python benchmarks/cpo_regime.py sweep \
        benchmarks/results/cpo_regime/three-routes-b6x{64,512,4096}

Each finished run writes ``<results>/<tag>/<algo>-seed<k>.json`` (its learning curve against env
steps, final scores, wall time, the commit and the overrides it ran with); ``summarize`` writes
``<tag>.json`` and ``<tag>.png`` beside the folder: per algorithm the IQM and mean of the final
success rate, of the area under the success curve (sample efficiency) and of the env steps to 50%
success, with 95% stratified bootstrap CIs, and the IQM learning curve against env steps with its
interval (``curve_iqm``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from seed_statistics import iqm_and_mean, iqm_curve

from myriad.bench.common import code_commit, write_json
from myriad.finetune.api import finetune
from myriad.pretrain.api import pretrain
from myriad.utils.checkpoint import latest_checkpoint, load_checkpoint

ALGOS = ("ppo", "sapg", "cpo", "pbt")
#: The authors' PPO settings (docs/algorithms.md, "Paper presets"), shared by every algorithm so
#: that only the population machinery differs. PPO's 4 minibatches of a 16-step rollout of 24,576
#: envs are their 98,304-row minibatches.
PAPER_PPO = [
    # Their policies start at std 1 (log std 0), PPO's baseline included; myriad's default is
    # log std -0.5, so without this PPO and PBT would explore less than SAPG and CPO.
    "population.init_log_std=0.0",
    "ppo.epochs=5",
    "ppo.lr=5.0e-4",
    "ppo.clip=0.2",
    "ppo.value_clip=0.2",
    "ppo.value_coef=2.0",
    "ppo.desired_kl=0.016",
    "ppo.max_lr=1.0e-2",
    "ppo.max_grad_norm=1.0",
]
#: The only settings in which the four algorithms' configs may differ: the population machinery
#: itself (``test_only_the_population_machinery_differs``).
MACHINERY = (
    "algo.",
    "population.size",
    "population.parameterization",
    "ppo.minibatches",
    "ppo.schedule",
)
#: Per algorithm: the config and the overrides that put it in the regime.
ALGO_OVERRIDES: dict[str, tuple[str, list[str]]] = {
    "cpo": ("cpo_paper", []),
    "sapg": ("sapg_paper", []),
    "ppo": ("ppo", ["population.size=1", "ppo.minibatches=4", *PAPER_PPO]),
    "pbt": ("pbt", ["population.size=6", "ppo.minibatches=4", *PAPER_PPO]),
}
#: Ablations of the population machinery (``--variant``), each writing its own folder
#: (``<task>-b<blocks>x<envs>-<variant>``): a variant may change only settings in
#: :data:`MACHINERY`; per variant, the algorithms it applies to and its settings.
VARIANTS: dict[str, tuple[tuple[str, ...], list[str]]] = {
    # Members as separate networks with their own random initialisations, as PBT's are, where
    # the paper's SAPG and CPO share one network with a per-block embedding: whether PBT's early
    # successes on nav-three-routes come from its members' independent starts.
    "independent": (("sapg", "cpo"), ["population.parameterization=independent"]),
    # The leader's off-policy rows with myriad's dual clip (a negative-advantage row's loss
    # bounded at 3 |A|) instead of the authors' plain PPO clip: whether unbounded losses of rows
    # the leader would rarely take (importance ratios far above 1) are what made CPO's leader
    # lose the route it had learned (nav-three-routes, seed 2).
    "dual-clip": (("sapg", "cpo"), ["algo.off_policy_dual_clip=3.0"]),
    # CPO without its AWAC pull of the followers toward the leader's actions, the one loss term
    # its paper form adds to SAPG's: whether that pull is what widened every member's policy in
    # the seeds where CPO's leader failed or lagged on nav-three-routes.
    "no-awac": (("cpo",), ["algo.awac=false"]),
    # The leader's off-policy rows with PPO's clip around the leader's own policy (the ratio
    # pi_L / pi_L_old, each row weighted by min(pi_L_old / pi_f_old, 1)) instead of the
    # authors' ratio to the follower's policy, whose clip passes only the advantages that pull
    # the leader towards the followers' action distributions (docs/algorithms.md §6): whether
    # that pull is what widened the leaders of SAPG's seed 4 and CPO's seeds 1, 2 and 4.
    "leader-trust": (("sapg", "cpo"), ["algo.off_policy_trust_region=leader"]),
    # Separate networks and no off-policy term for the leader (its update is PPO on its own
    # block; the followers keep their AWAC pull): whether the off-policy rows are what made CPO's
    # leader, with separate networks, lose the route its own episodes had found while all five
    # followers kept theirs (nav-three-routes, seeds 0, 1 and 3).
    # The shared network without the leader's off-policy rows (every block's update is PPO on
    # its own rows, the per-block embedding and the shared trunk kept): whether SAPG's and CPO's
    # lead over PPO at 512 envs per block on nav-three-routes comes from the followers' data or
    # from the population's separate exploration alone.
    "no-off-policy": (("sapg", "cpo"), ["algo.off_policy_coef=0.0"]),
    "independent-no-off-policy": (
        ("sapg", "cpo"),
        ["population.parameterization=independent", "algo.off_policy_coef=0.0"],
    ),
}
TASKS: dict[str, list[str]] = {
    # The maze's far goal with a sparse reward: +1 and the end of the episode on reaching it.
    "maze-far": ["env=maze", "task=sparse"],
    "three-routes": ["env=three_routes", "task=sparse"],
    # The 12 x 12-cell maze: the goal 168 cells away, many dead ends.
    "big-maze": ["env=big_maze", "task=sparse"],
    # HalfCheetah's own reward (score: the leader's return).
    "halfcheetah": ["env=halfcheetah", "task=native"],
}


def score_of(task: str) -> str:
    """The figure a task is read from: its success rate, or its return where the env has no
    success flag (HalfCheetah)."""
    return "return" if task == "halfcheetah" else "success"


def seeds(text: str) -> list[int]:
    """``0-4`` or ``0,2,5``."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def run_overrides(
    algo: str, seed: int, args: argparse.Namespace, pretrained_steps: int = 0
) -> tuple[str, list[str]]:
    config, extra = ALGO_OVERRIDES[algo]
    if getattr(args, "init_from", None):
        # A run from a pretrained population takes the architecture, initial std included,
        # from it (myriad.finetune.init), and refuses to be given one.
        extra = [o for o in extra if not o.startswith("population.init_log_std=")]
    envs = args.blocks * args.envs_per_block
    blocks = [] if algo == "ppo" else [f"population.size={args.blocks}"]
    return config, [
        *TASKS[args.task],
        f"seed={seed}",
        f"num_envs={envs}",
        f"num_steps={args.horizon}",
        f"iterations={iterations(args, pretrained_steps)}",
        f"eval.every={args.eval_every}",
        f"eval.episodes={args.eval_episodes}",
        f"eval.final_episodes={args.eval_episodes}",
        f"checkpoint_every={args.checkpoint_every}",
        "keep_checkpoints=1",
        "progress=false",
        "plots=false",
        "tensorboard=false",
        *extra,
        *blocks,
        *variant_overrides(algo, args),
        *args.overrides,
    ]


def variant_problem(
    variant: str, algos: list[str], init_from: str | None, overrides: list[str]
) -> str | None:
    """Why ``--variant`` cannot run as asked (None: it can)."""
    applies, settings = VARIANTS[variant]
    keys = {o.split("=", 1)[0] for o in settings}
    if [a for a in algos if a not in applies]:
        return f"--variant {variant} applies to {', '.join(applies)} only; pass --algos with those"
    if init_from and any(k.startswith("population.") for k in keys):
        # A run from a pretrained population takes its architecture (--init refuses it).
        return f"--variant {variant} changes the architecture: run it from scratch, no --init-from"
    clash = sorted(keys & {o.split("=", 1)[0].lstrip("+~") for o in overrides})
    if clash:
        # The folder says the variant: a later override of its setting would be another run.
        return f"--variant {variant} sets {', '.join(clash)}; drop that override"
    return None


def variant_overrides(algo: str, args: argparse.Namespace) -> list[str]:
    """The ``--variant``'s settings for ``algo`` (none without a variant)."""
    variant = getattr(args, "variant", None)
    if variant is None:
        return []
    problem = variant_problem(variant, [algo], None, [])
    if problem:
        raise ValueError(problem)
    return VARIANTS[variant][1]


def iterations(args: argparse.Namespace, pretrained_steps: int = 0) -> int:
    """Finetuning iterations: the env-step budget less the pretraining's."""
    per_iteration = args.blocks * args.envs_per_block * args.horizon
    return max(1, round((args.env_steps - pretrained_steps) / per_iteration))


def tag(args: argparse.Namespace) -> str:
    base = f"{args.task}-b{args.blocks}x{args.envs_per_block}"
    variant = getattr(args, "variant", None)
    base += f"-{variant}" if variant else ""
    return base + ("-kmyriad" if getattr(args, "init_from", None) else "")


def init_run(args: argparse.Namespace, seed: int) -> tuple[Path | None, int]:
    """The pretrained population a run starts from (``--init-from``, ``{seed}`` replaced) and
    the env steps its pretraining took (0 without one)."""
    if not args.init_from:
        return None, 0
    folder = Path(args.init_from.format(seed=seed))
    summary = json.loads((folder / "summary.json").read_text())
    return folder, int(summary["env_steps"])


def pretrain_population(seed: int, args: argparse.Namespace) -> Path:
    """K-Myriad pretraining in the regime (same envs, blocks and architecture as CPO's)."""
    folder = (
        args.workdir / "pretrain" / f"{args.task}-b{args.blocks}x{args.envs_per_block}-seed{seed}"
    )
    if (folder / "summary.json").exists():
        print(f"{folder} is pretrained: skipped", flush=True)
        return folder
    per_iteration = args.blocks * args.envs_per_block * args.horizon
    resume = folder if any((folder / "checkpoints").glob("*.pt")) else None
    overrides = [
        TASKS[args.task][0],
        f"seed={seed}",
        f"num_envs={args.blocks * args.envs_per_block}",
        f"num_steps={args.horizon}",
        f"iterations={max(1, round(args.env_steps / per_iteration))}",
        f"population.size={args.blocks}",
        "population.parameterization=embedding",
        "population.embedding_dim=32",
        f"checkpoint_every={args.checkpoint_every}",
        "keep_checkpoints=1",
        "progress=false",
        "plots=false",
        "dataset.enabled=false",
        *args.overrides,
    ]
    summary = pretrain(
        [] if resume else overrides,
        resume=resume,
        run_dir=None if resume else folder,
        quiet=True,
        overwrite=resume is None and folder.exists(),
    )
    print(f"pretrained seed {seed}: {summary.get('env_steps')} env steps -> {folder}", flush=True)
    return folder


def refuse_changed_settings(
    folder: Path, config: str, overrides: list[str], init: Path | None
) -> None:
    """Stop before resuming a run whose saved settings differ from what this code would start
    now: a resumed run continues with its own saved config, and its record would otherwise
    claim the current settings."""
    from myriad.finetune.api import resolve_config
    from myriad.utils.checkpoint import config_diff
    from myriad.utils.config import load_run_config

    changed = config_diff(load_run_config(folder), resolve_config(config, overrides, init=init))
    if changed:
        shown = ", ".join(f"{k}: {old!r} -> {new!r}" for k, old, new in changed[:4])
        raise SystemExit(
            f"{folder} was started with other settings ({shown}); move it away to start it "
            "again, or finish it with the code that started it"
        )


def run_one(algo: str, seed: int, args: argparse.Namespace) -> Path:
    """Train (or finish) one run and write its record; the record's path."""
    out = args.results / tag(args) / f"{algo}-seed{seed}.json"
    if out.exists():
        print(f"{out} exists: skipped", flush=True)
        return out
    folder = args.workdir / tag(args) / f"{algo}-seed{seed}"
    init, pretrained_steps = init_run(args, seed)
    config, overrides = run_overrides(algo, seed, args, pretrained_steps)
    started = time.perf_counter()
    ran_with = code_commit() or "unknown"
    resume = (
        folder
        if (folder / "checkpoints").is_dir() and any((folder / "checkpoints").glob("*.pt"))
        else None
    )
    if resume is not None:
        refuse_changed_settings(folder, config, overrides, init)
    summary = finetune(
        None if resume else config,
        [] if resume else overrides,
        init=None if resume else init,
        resume=resume,
        run_dir=None if resume else folder,
        quiet=True,
        overwrite=resume is None and folder.exists(),
    )
    history = load_checkpoint(summary["checkpoint"])["logger"]["history"]
    per_iteration = args.blocks * args.envs_per_block * args.horizon
    # The x axis counts the pretraining's env steps too.
    curve = {
        metric: [
            (pretrained_steps + int(step) * per_iteration, float(value))
            for step, value in history.get(f"eval/leader_{metric}", [])
        ]
        for metric in ("success", "return")
    }
    # The population's best member at each evaluation: a follower can solve the task that the
    # leader, the algorithm's answer, does not learn from its rows.
    curve["population_success"] = [
        (pretrained_steps + int(step) * per_iteration, float(value))
        for step, value in history.get("eval/population_success", [])
    ]
    # Each iteration's share of the training episodes finished in it that succeeded, over all
    # envs (iterations in which none finished have no point): a policy can reach the goal while
    # exploring and lose it again, which the evaluations of the deterministic leader do not show.
    curve["training_success"] = [
        (pretrained_steps + int(step) * per_iteration, float(value))
        for step, value in history.get("episode/success", [])
    ]
    final = summary.get("final_eval") or {}
    success = [v for _, v in curve["success"]]
    returns = [v for _, v in curve["return"]]
    budget = pretrained_steps + iterations(args, pretrained_steps) * per_iteration
    reached = [s for s, v in curve["success"] if v >= 0.5]
    record = {
        "benchmark": "cpo_regime",
        "algo": algo,
        "config": config,
        "seed": seed,
        "task": args.task,
        "blocks": args.blocks,
        "envs_per_block": args.envs_per_block,
        "num_envs": args.blocks * args.envs_per_block,
        "horizon": args.horizon,
        "env_steps": budget,
        "pretrained_env_steps": pretrained_steps,
        "init": str(init) if init else None,
        "overrides": overrides,
        "commit": ran_with,
        "curve": curve,
        "final_success": float(final.get("eval/leader_success", success[-1] if success else 0.0)),
        "final_return": float(final.get("eval/leader_return", 0.0)),
        "final_population_success": float(final.get("eval/population_success", 0.0)),
        "max_training_success": max((v for _, v in curve["training_success"]), default=0.0),
        "auc_success": float(np.mean(success)) if success else 0.0,
        "auc_return": float(np.mean(returns)) if returns else 0.0,
        "steps_to_half": reached[0] if reached else budget,
        "steps_per_second": summary.get("steps_per_second"),
        "wall_s_this_process": time.perf_counter() - started,
        "resumed": resume is not None,
    }
    write_json(out, record)
    figure = score_of(args.task)
    print(
        f"{algo} seed {seed}: final {figure} {record['final_' + figure]:.3f}, "
        f"auc {record['auc_' + figure]:.3f} -> {out}",
        flush=True,
    )
    return out


def _metric(record: dict[str, Any], metric: str) -> float:
    """A run's ``metric``; the area under the return curve of runs written before the JSON
    held it is computed from their curve, as :func:`run_one` does."""
    if metric == "auc_return" and metric not in record:
        returns = [v for _, v in record["curve"]["return"]]
        return float(np.mean(returns)) if returns else 0.0
    return float(record[metric])


def _curve_iqm(curves: list[list[tuple[int, float]]], reps: int) -> dict[str, list[float]]:
    """The IQM learning curve over runs (each a list of ``(env steps, score)``), on the points
    all runs reached, with its 95% bootstrap interval."""
    n = min(len(c) for c in curves)
    values = np.array([[v for _, v in c[:n]] for c in curves], dtype=float)  # [runs, n]
    iqm, low, high = iqm_curve(values, reps)
    return {
        "env_steps": [float(s) for s, _ in curves[0][:n]],
        "iqm": iqm.tolist(),
        "ci95_low": low.tolist(),
        "ci95_high": high.tolist(),
    }


#: The training statistics a trace keeps, by prefix: each member's training success, the
#: leader's off-policy diagnostics, the followers' KL to the leader, the entropy, the learning
#: rate, each member's log std (logged from 2026-11-28 on), the population's diversity and the
#: evaluations.
TRACE_KEYS = (
    "episode/success",
    "train/leader_ess",
    "train/off_policy_clip_fraction",
    "train/entropy",
    "train/lr",
    "policy/",
    "kl_to_leader/",
    "diversity/",
    "eval/",
)
TRACES = Path("benchmarks/results/cpo_regime_traces")


#: Episodes per member of a trace's evaluation of the final policies.
TRACE_EPISODES = 64


def final_success(last: Path, deterministic: bool) -> list[float]:
    """Each member's success rate over :data:`TRACE_EPISODES` episodes of the checkpoint
    ``last`` (``myriad eval``'s evaluation: fresh envs, the run's evaluation seed), acting with
    the policy means or sampling as in training."""
    from myriad.tools.evaluate import evaluate_run

    result = evaluate_run(last, episodes=TRACE_EPISODES, deterministic=deterministic)
    return [float(row["success"]["mean"]) for row in result["members"]]


def trace(run_dir: Path, out: Path | None = None) -> Path:
    """Write the per-iteration training statistics of one run (:data:`TRACE_KEYS`, from its
    last checkpoint's history), each member's final log std and each member's final success
    with mean and with sampled actions to ``out`` (default ``<TRACES>/<tag>/<algo>-seed<k>.json``):
    what its record's curves do not show, such as a leader that learned a route and lost it,
    or a wide policy whose sampled actions reach the goal where its mean actions do not."""
    last = latest_checkpoint(run_dir / "checkpoints")
    if last is None:
        raise SystemExit(f"{run_dir} has no checkpoint; pass a run folder of this benchmark")
    state = load_checkpoint(last)
    history = state["logger"]["history"]
    out = out or TRACES / run_dir.parent.name / f"{run_dir.name}.json"
    write_json(
        out,
        {
            "benchmark": "cpo_regime trace",
            "run": f"{run_dir.parent.name}/{run_dir.name}",
            "iteration": state["iteration"],
            # How wide each member's policy ended: its state-independent log std, averaged over
            # the action dimensions.
            "final_log_std_per_member": state["state"]["model"]["log_std"].mean(-1).tolist(),
            "final_success_per_member": {
                "episodes": TRACE_EPISODES,
                "mean_actions": final_success(last, deterministic=True),
                "sampled_actions": final_success(last, deterministic=False),
            },
            "series": {k: v for k, v in sorted(history.items()) if k.startswith(TRACE_KEYS)},
        },
    )
    print(f"wrote {out}", flush=True)
    return out


def summarize(folder: Path, reps: int) -> dict[str, Any]:
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*-seed*.json"))]
    if not records:
        raise SystemExit(f"no finished runs in {folder}")
    algos = [a for a in ALGOS if any(r["algo"] == a for r in records)]
    out: dict[str, Any] = {
        "benchmark": "cpo_regime",
        "folder": str(folder),
        "runs": {a: sorted(r["seed"] for r in records if r["algo"] == a) for a in algos},
        "env_steps": sorted({r["env_steps"] for r in records}),
        "num_envs": sorted({r["num_envs"] for r in records}),
        "commits": sorted({r["commit"] for r in records}),
    }
    for metric in ("final_success", "auc_success", "steps_to_half", "final_return", "auc_return"):
        scores = {
            a: np.array([[_metric(r, metric)] for r in records if r["algo"] == a], dtype=float)
            for a in algos
        }
        out[metric] = iqm_and_mean(scores, reps)
    out["score"] = score_of(records[0]["task"])
    out["curves"] = {
        a: [r["curve"][out["score"]] for r in records if r["algo"] == a] for a in algos
    }
    out["curve_iqm"] = {a: _curve_iqm(c, reps) for a, c in out["curves"].items() if c and c[0]}
    path = write_json(folder.with_suffix(".json"), out)
    plot(out, folder.with_suffix(".png"))
    print(f"wrote {path}")
    return out


#: Where :func:`scale_sweep` writes (a folder of its own: every JSON under ``cpo_regime/`` is a
#: run record or the summary of a run folder).
SWEEPS = Path("benchmarks/results/cpo_regime_sweep")


def scale_sweep(folders: list[Path], out: Path, reps: int) -> dict[str, Any]:
    """The scale sweep: one task at several env counts per block and equal env steps, one run
    folder per count (``<task>-b6x64``, ``-b6x512``, ``-b6x4096``). Per algorithm and count: the
    IQM and mean with 95% CIs of the final score and of the area under its curve over the seeds
    that finished, and the seeds every algorithm has at that count (the like-for-like set while a
    sweep is partial). Refuses folders of different tasks, budgets or block counts."""
    records: list[dict[str, Any]] = []
    for folder in folders:
        found = [json.loads(p.read_text()) for p in sorted(folder.glob("*-seed*.json"))]
        if not found:
            raise SystemExit(f"no finished runs in {folder}")
        records += found
    for key in ("task", "blocks", "pretrained_env_steps"):
        values = sorted({str(r.get(key)) for r in records})
        if len(values) > 1:
            raise SystemExit(
                f"the folders' runs differ in {key} ({', '.join(values)}): a sweep "
                "compares one task and budget at several env counts"
            )
    # Whole iterations of different sizes fill the same budget to within one iteration.
    budgets = sorted({int(r["env_steps"]) for r in records})
    if budgets[-1] > 1.01 * budgets[0]:
        raise SystemExit(
            f"the folders' runs differ in env_steps ({budgets[0]} to {budgets[-1]}): a sweep "
            "compares one task and budget at several env counts"
        )
    score = score_of(records[0]["task"])
    scales = sorted({int(r["envs_per_block"]) for r in records})
    # An algorithm run at one count only (PBT, in the regime's own folder) is not in the sweep.
    algos = [a for a in ALGOS if len({r["envs_per_block"] for r in records if r["algo"] == a}) > 1]
    if not algos:
        raise SystemExit("no algorithm has runs at two env counts: nothing to sweep")
    records = [r for r in records if r["algo"] in algos]
    for algo in algos:
        # Only the env count may change across a sweep, not the algorithm's settings (a variant's
        # folder is another algorithm). Records written before overrides were kept have none.
        settings = {
            (r["config"], r["horizon"], *_sweep_settings(r["overrides"]))
            for r in records
            if r["algo"] == algo and "overrides" in r
        }
        if len(settings) > 1:
            raise SystemExit(
                f"{algo}'s runs differ in more than their env count across these folders "
                "(a --variant or other overrides): a sweep varies the env count only"
            )
    out_record: dict[str, Any] = {
        "benchmark": "cpo_regime_sweep",
        "task": records[0]["task"],
        "env_steps": budgets,
        "blocks": records[0]["blocks"],
        "folders": [_shown(f) for f in folders],
        "envs_per_block": scales,
        "score": score,
        "commits": sorted({r["commit"] for r in records}),
        "runs": {
            a: {
                str(n): sorted(
                    r["seed"] for r in records if r["algo"] == a and r["envs_per_block"] == n
                )
                for n in scales
            }
            for a in algos
        },
    }
    # The like-for-like seeds at each count: those of every algorithm that has runs there.
    out_record["common_seeds"] = {
        str(n): sorted(
            set.intersection(
                *(set(seeds[str(n)]) for seeds in out_record["runs"].values() if seeds[str(n)])
            )
        )
        for n in scales
    }
    for metric in (f"final_{score}", f"auc_{score}"):
        out_record[metric] = {}
        for a in algos:
            per_scale = {
                n: np.array(
                    [
                        [_metric(r, metric)]
                        for r in records
                        if r["algo"] == a and r["envs_per_block"] == n
                    ],
                    dtype=float,
                )
                for n in scales
            }
            present = {str(n): v for n, v in per_scale.items() if len(v)}
            out_record[metric][a] = iqm_and_mean(present, reps)
    path = write_json(out, out_record)
    plot_sweep(out_record, out.with_suffix(".png"))
    print(f"wrote {path}")
    return out_record


def _sweep_settings(overrides: list[str]) -> tuple[str, ...]:
    """A run's overrides without those a sweep varies with the env count or the seed."""
    varying = ("seed=", "num_envs=", "iterations=")
    return tuple(o for o in overrides if not o.startswith(varying))


def plot_sweep(sweep: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    score = sweep["score"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, metric, label in zip(
        axes, (f"final_{score}", f"auc_{score}"), (f"final {score}", f"area under {score} curve")
    ):
        for algo, per_scale in sweep[metric].items():
            scales = sorted(per_scale, key=int)
            iqm = np.array([per_scale[n]["iqm"] for n in scales])
            low = iqm - np.array([per_scale[n]["iqm_ci95"][0] for n in scales])
            high = np.array([per_scale[n]["iqm_ci95"][1] for n in scales]) - iqm
            seeds = ", ".join(f"{n}: {len(per_scale[n]['values'])}" for n in scales)
            ax.errorbar(
                [int(n) for n in scales],
                iqm,
                yerr=[low, high],
                capsize=4,
                marker="o",
                label=f"{algo} (seeds at {seeds})",
            )
        ax.set_xscale("log", base=2)
        if score == "success":
            ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel(f"envs per block ({sweep['blocks']} blocks, equal env steps)")
        ax.set_ylabel(f"leader's {label} (IQM, 95% CI)")
        ax.legend(fontsize=8)
    fig.suptitle(f"{sweep['task']}: scale sweep at {sweep['env_steps'][-1]:.3g} env steps")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _device_free(overrides: list[str]) -> list[str]:
    return [o for o in overrides if not o.startswith("device=")]


def _shown(path: Path) -> str:
    """``path`` relative to the checkout when it is inside it (records stay valid elsewhere)."""
    root = Path(__file__).resolve().parents[1]
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path)


def compare(folder: Path, reference: Path, out: Path) -> dict[str, Any]:
    """The runs of ``folder`` against the same runs in ``reference`` (e.g. one machine's against
    another's): per run both final successes, both areas under the success curve, both speeds
    and their ratio, and how many runs end alike (final success both above or both below one
    half). A pair must have the same task, budget, envs, config and overrides (``device=``
    aside); a run without its counterpart is listed under ``unmatched``."""
    rows, unmatched = [], []
    for path in sorted(folder.glob("*-seed*.json")):
        other = reference / path.name
        if not other.exists():
            unmatched.append(path.stem)
            continue
        a, b = json.loads(path.read_text()), json.loads(other.read_text())
        if score_of(a["task"]) != "success":
            raise SystemExit(
                f"{path}: compare counts outcomes by success, and {a['task']} is scored by return"
            )
        for key in ("task", "env_steps", "num_envs", "config"):
            if a[key] != b[key]:
                raise SystemExit(f"{path.name}: {key} differs ({a[key]} against {b[key]})")
        if _device_free(a["overrides"]) != _device_free(b["overrides"]):
            raise SystemExit(f"{path.name}: the runs' overrides differ beyond device=")
        rows.append(
            {
                "run": path.stem,
                "final_success": [a["final_success"], b["final_success"]],
                "auc_success": [round(a["auc_success"], 3), round(b["auc_success"], 3)],
                "steps_per_second": [round(a["steps_per_second"]), round(b["steps_per_second"])],
                # Not a speed-up of the device when a run was resumed or its machine was shared.
                "speed_ratio": round(a["steps_per_second"] / b["steps_per_second"], 1),
                "resumed": [bool(a.get("resumed")), bool(b.get("resumed"))],
                "same_outcome": (a["final_success"] > 0.5) == (b["final_success"] > 0.5),
                "commits": [a["commit"], b["commit"]],
            }
        )
    if not rows:
        raise SystemExit(f"no run of {folder} has a counterpart in {reference}")
    result = {
        "benchmark": "cpo_regime_compare",
        "folder": _shown(folder),
        "reference": _shown(reference),
        "runs": rows,
        "unmatched": unmatched,
        "same_outcome": sum(r["same_outcome"] for r in rows),
        "compared": len(rows),
    }
    path = write_json(out, result)
    print(f"{result['same_outcome']} of {len(rows)} runs end alike; wrote {path}")
    return result


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, bars) = plt.subplots(1, 2, figsize=(11, 4))
    for algo, curve in summary["curve_iqm"].items():
        runs = len(summary["curves"][algo])
        ax.plot(curve["env_steps"], curve["iqm"], label=f"{algo} ({runs} seeds)")
        ax.fill_between(curve["env_steps"], curve["ci95_low"], curve["ci95_high"], alpha=0.2)
    ax.set_xlabel("env steps")
    ax.set_ylabel(f"leader {summary['score']} (deterministic), IQM and 95% CI")
    ax.legend()
    final = summary[f"final_{summary['score']}"]
    names = list(final)
    iqm = [final[a]["iqm"] for a in names]
    low = [final[a]["iqm"] - final[a]["iqm_ci95"][0] for a in names]
    high = [final[a]["iqm_ci95"][1] - final[a]["iqm"] for a in names]
    bars.bar(names, iqm, yerr=[low, high], capsize=4)
    bars.set_ylabel(f"final {summary['score']}, IQM and 95% CI")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="train the runs that have no record yet")
    run.add_argument("--task", choices=sorted(TASKS), default="maze-far")
    run.add_argument("--algos", default=",".join(ALGOS))
    run.add_argument("--seeds", type=seeds, default=seeds("0-4"))
    run.add_argument("--blocks", type=int, default=6)
    run.add_argument("--envs-per-block", type=int, default=4096)
    run.add_argument("--horizon", type=int, default=16)
    run.add_argument("--env-steps", type=float, default=5e7)
    run.add_argument("--eval-every", type=int, default=16, help="iterations between evaluations")
    run.add_argument("--eval-episodes", type=int, default=64)
    run.add_argument("--checkpoint-every", type=int, default=8)
    run.add_argument("--workdir", type=Path, default=Path("runs/bench/cpo_regime"))
    run.add_argument("--results", type=Path, default=Path("benchmarks/results/cpo_regime"))
    run.add_argument(
        "--init-from",
        help="start from this pretrained run ({seed} is replaced); its env steps count",
    )
    run.add_argument(
        "--variant",
        choices=sorted(VARIANTS),
        help="an ablation of the population machinery (VARIANTS), in its own folder",
    )
    run.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run")
    pre = sub.add_parser("pretrain", help="K-Myriad pretraining in the regime, one run per seed")
    for name, kind, default in (
        ("--task", str, "maze-far"),
        ("--seeds", seeds, seeds("0-4")),
        ("--blocks", int, 6),
        ("--envs-per-block", int, 4096),
        ("--horizon", int, 16),
        ("--env-steps", float, 1e7),
        ("--checkpoint-every", int, 8),
        ("--workdir", Path, Path("runs/bench/cpo_regime")),
    ):
        pre.add_argument(name, type=kind, default=default)
    pre.add_argument("overrides", nargs="*", help="extra Hydra overrides")
    agg = sub.add_parser("summarize", help="aggregate the finished runs of one folder")
    agg.add_argument("folder", type=Path)
    agg.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    tr = sub.add_parser("trace", help="one run's per-iteration training statistics, to a JSON")
    tr.add_argument(
        "run_dir", type=Path, help="a run folder, e.g. runs/bench/cpo_regime/<tag>/cpo-seed2"
    )
    tr.add_argument("--out", type=Path, help=f"default: {TRACES}/<tag>/<run>.json")
    swp = sub.add_parser("sweep", help="one task's run folders at several env counts per block")
    swp.add_argument("folders", type=Path, nargs="+")
    swp.add_argument("--out", type=Path, help=f"default: {SWEEPS}/<task>.json")
    swp.add_argument("--reps", type=int, default=2000, help="bootstrap resamples")
    cmp = sub.add_parser("compare", help="one folder's runs against the same runs elsewhere")
    cmp.add_argument("folder", type=Path)
    cmp.add_argument("reference", type=Path)
    cmp.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "compare":
        compare(args.folder, args.reference, args.out)
        return 0
    if args.command == "trace":
        trace(args.run_dir, args.out)
        return 0
    if args.command == "sweep":
        task = args.folders[0].name.rsplit("-b", 1)[0]
        scale_sweep(args.folders, args.out or SWEEPS / f"{task}.json", args.reps)
        return 0
    if args.command == "summarize":
        summarize(args.folder, args.reps)
        return 0
    if args.command == "pretrain":
        for seed in args.seeds:
            pretrain_population(seed, args)
        return 0
    algos = [a.strip() for a in args.algos.split(",")]
    unknown = [a for a in algos if a not in ALGOS]
    if unknown:
        parser.error(f"unknown algorithm(s) {unknown}; choose from {', '.join(ALGOS)}")
    if args.variant is not None:
        problem = variant_problem(args.variant, algos, args.init_from, args.overrides)
        if problem:
            parser.error(problem)
    # Seed-major: the first seed of every algorithm before the second of any, so a partial
    # sweep compares like with like.
    for seed in args.seeds:
        for algo in algos:
            run_one(algo, seed, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
