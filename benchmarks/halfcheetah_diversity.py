"""Do K-Myriad members specialise on HalfCheetah? Per-member forward velocity and torso pitch.

Runs one K-Myriad pretraining on ``mujoco-halfcheetah`` (Gymnasium HalfCheetah-v5 semantics,
CPU MuJoCo backend) with its default entropy features, the root's x position and the torso pitch
(``qpos[0]``, ``qpos[2]`` wrapped to ``[-pi, pi]``), then rolls out the final members
(stochastic actions, as during pretraining, fresh envs, ``--eval-envs`` per member) and records
per member the forward velocity (the torso's x velocity, ``qvel[0]``) and the pitch at every
step. The same rollouts of the freshly initialised population (same config and seed, no
training) are the reference: what "distinct" looks like before any pretraining.

Distinct behaviours: members are summarised by (mean forward velocity, mean pitch rate
``qvel[2]``); the pitch rate, not the mean pitch, because members that flip over sweep the whole
circle and have no meaningful mean pitch, while the sign and size of their rotation rate tell a
forward flip from a backward one. Two members are linked when their mean velocities differ by at
most ``--vel-threshold`` m/s AND their mean pitch rates by at most ``--rate-threshold`` rad/s;
the number of distinct behaviours is the number of connected groups (single linkage). Each
member also gets a descriptive label: direction (forward / backward / in place, by its mean
velocity beyond ``--vel-threshold`` / 2) and posture (level, pitched + / -, on its back, or, when
the pitch's mean resultant length is below 0.5, flipping + / - by the sign of its pitch rate).

    python benchmarks/halfcheetah_diversity.py                       # pretrain, then evaluate
    python benchmarks/halfcheetah_diversity.py --run /tmp/hc_pre    # evaluate an existing run
    python benchmarks/halfcheetah_diversity.py --finetune-init /tmp/hc_pre --finetune-seeds 2

writes ``--out`` (JSON) and a figure next to it (same name, ``.png``). ``--finetune-init RUN``
instead adds a first finetuning comparison on HalfCheetah's own reward (forward velocity minus
control cost) to the existing ``--out``: PPO, CPO (fixed coefficients,
``algo.kl_preset=balanced``, lambda 0.2) and SAPG, each started from RUN's members (8, PPO: the
best-ranked one), the leader evaluated with deterministic actions
(``benchmarks/finetune_compare.py``'s ``run_once``); the curves go into the JSON's ``finetune``
entry and a second figure (``_finetune.png``), together with RUN's own per-member behaviour
summary (same rollouts and rule as above). ``--finetune-variants`` picks other variants
(:data:`FINETUNE_VARIANTS`: the CPO presets 0.1 / 0.3, the KL set point, PBT) and ``--members``
the population size of the finetuning runs."""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from myriad.bench.common import machine_info, write_json
from myriad.envs import make_from_config
from myriad.nn.population import PopulationActorCritic, build_population
from myriad.rl.saved_population import load_population
from myriad.utils.checkpoint import library_versions
from myriad.utils.seeding import make_generator


def pretrain_overrides(args: argparse.Namespace) -> list[str]:
    """The ``myriad pretrain`` overrides of the run: the Ant env group re-pointed at
    HalfCheetah (no HalfCheetah group exists), its fast model and CPU backend."""
    return [
        "env=ant",
        "env.name=mujoco-halfcheetah",
        "~env.options.xy_bound",
        f"+env.options.x_bound={args.x_bound}",
        f"env.options.max_episode_steps={args.episode_steps}",
        f"population.size={args.members}",
        f"num_envs={args.num_envs}",
        f"iterations={args.iterations}",
        f"seed={args.seed}",
        "dataset.enabled=false",
        "progress=false",
        "checkpoint_every=0",
        "torch_threads=1",
    ]


@torch.no_grad()
def rollout(
    model: PopulationActorCritic,
    env_cfg: dict[str, Any],
    members: int,
    envs_per_member: int,
    steps: int,
    seed: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Roll out every member in ``envs_per_member`` fresh envs for ``steps`` steps (stochastic
    actions); returns forward velocity ``qvel[0]``, wrapped pitch ``qpos[2]`` and pitch rate
    ``qvel[2]``, each ``[members, envs_per_member * steps]``."""
    env = make_from_config(env_cfg, members * envs_per_member, "cpu")
    member = torch.arange(members).repeat_interleave(envs_per_member)  # member-major blocks
    gen = make_generator(seed, env.device)
    obs = env.reset(seed=seed)
    vel, pitch, rate = [], [], []
    try:
        for _ in range(steps):
            out = model.act(obs, member, gen, blocked=True)
            obs, _, _, _, _ = env.step(out.actions)
            qpos, qvel = env.sim.field("qpos"), env.sim.field("qvel")  # type: ignore[attr-defined]
            vel.append(qvel[:, 0].clone())
            rate.append(qvel[:, 2].clone())
            pitch.append(torch.atan2(torch.sin(qpos[:, 2]), torch.cos(qpos[:, 2])))
    finally:
        env.close()

    # [steps, E] -> [members, envs_per_member * steps]
    def per_member(xs: list[torch.Tensor]) -> np.ndarray:
        return torch.stack(xs).T.reshape(members, -1).numpy()

    return per_member(vel), per_member(pitch), per_member(rate)


def member_stats(vel: np.ndarray, pitch: np.ndarray, rate: np.ndarray) -> list[dict[str, float]]:
    """Per member (rows of the ``[members, samples]`` arrays): velocity mean / std / quartiles,
    circular mean pitch and its resultant length (1: constant pitch, 0: uniform over the circle),
    fraction of time on its back, mean and std of the pitch rate."""
    rows = []
    for v, p, r in zip(vel, pitch, rate, strict=True):
        s, c = float(np.sin(p).mean()), float(np.cos(p).mean())
        rows.append(
            {
                "vel_mean": float(v.mean()),
                "vel_std": float(v.std()),
                "vel_q25": float(np.quantile(v, 0.25)),
                "vel_median": float(np.median(v)),
                "vel_q75": float(np.quantile(v, 0.75)),
                "pitch_circ_mean": math.atan2(s, c),
                "pitch_resultant": math.hypot(s, c),
                "pitch_std": float(p.std()),
                "frac_on_back": float((np.abs(p) > math.pi / 2).mean()),
                "rate_mean": float(r.mean()),
                "rate_std": float(r.std()),
            }
        )
    return rows


def label(row: dict[str, float], vel_threshold: float) -> str:
    """A readable name for a member's behaviour (see the module docstring)."""
    v = row["vel_mean"]
    direction = (
        "forward" if v > vel_threshold / 2 else "backward" if v < -vel_threshold / 2 else "in place"
    )
    p = row["pitch_circ_mean"]
    if row["pitch_resultant"] < 0.5:
        posture = "flipping +" if row["rate_mean"] > 0 else "flipping -"
    elif abs(p) > math.pi / 2:
        posture = "on its back"
    elif p > 0.3:
        posture = "pitched +"
    elif p < -0.3:
        posture = "pitched -"
    else:
        posture = "level"
    return f"{direction}, {posture}"


def distinct_groups(
    rows: list[dict[str, float]], vel_threshold: float, rate_threshold: float
) -> list[list[int]]:
    """Single-linkage groups of members whose mean velocities differ by <= ``vel_threshold``
    and mean pitch rates by <= ``rate_threshold``."""
    n = len(rows)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i in range(n):
        for j in range(i + 1, n):
            dv = abs(rows[i]["vel_mean"] - rows[j]["vel_mean"])
            dr = abs(rows[i]["rate_mean"] - rows[j]["rate_mean"])
            if dv <= vel_threshold and dr <= rate_threshold:
                parent[find(i)] = find(j)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted(groups.values())


def summarise(
    vel: np.ndarray, pitch: np.ndarray, rate: np.ndarray, args: argparse.Namespace
) -> dict[str, Any]:
    """Per-member statistics, labels and the distinct-behaviour groups."""
    rows = member_stats(vel, pitch, rate)
    for row in rows:
        row["label"] = label(row, args.vel_threshold)  # type: ignore[assignment]
    groups = distinct_groups(rows, args.vel_threshold, args.rate_threshold)
    return {
        "members": rows,
        "distinct_groups": groups,
        "distinct_behaviours": len(groups),
        "labels": sorted({str(r["label"]) for r in rows}),
    }


def figure(
    path: Path,
    trained: tuple[np.ndarray, np.ndarray, np.ndarray],
    fresh: tuple[np.ndarray, np.ndarray, np.ndarray],
    result: dict[str, Any],
) -> None:
    """Violins of per-member forward velocity and pitch, pretrained (top) and fresh (bottom)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 7.5), sharey="col")
    for row, (name, (vel, pitch, _), summary) in enumerate(
        [
            ("K-Myriad pretrained", trained, result["pretrained"]),
            ("freshly initialised", fresh, result["fresh"]),
        ]
    ):
        members = np.arange(vel.shape[0])
        step = max(1, vel.shape[1] // 4000)  # violins need no more points than this
        for col, (data, ylabel) in enumerate(
            [(vel, "forward velocity qvel[0] (m/s)"), (pitch, "torso pitch (rad)")]
        ):
            ax = axes[row, col]
            parts = ax.violinplot([d[::step] for d in data], members, showmedians=True)
            for body, m in zip(parts["bodies"], members, strict=True):
                body.set_facecolor(plt.cm.tab10(m % 10))
                body.set_alpha(0.6)
            ax.set_xticks(members[:: max(1, len(members) // 16)])  # at most about 16 labels
            ax.set_xlabel("member")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.set_title(f"{name}: {summary['distinct_behaviours']} distinct behaviours")
        axes[row, 1].set_ylim(-math.pi, math.pi)
    fig.suptitle(
        f"HalfCheetah, {len(result['pretrained']['members'])}-member K-Myriad population "
        "(features: x, pitch): per-member distributions over evaluation rollouts"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: variant -> (algorithm, overrides). The default comparison is the first three.
def paper_loss_form(preset: str) -> list[str]:
    """The ``algo`` section of the packaged preset ``configs/algo/<preset>.yaml`` as overrides:
    the authors' loss form and couplings (1:1 weighting of the leader's off-policy rows,
    advantages normalised once over the augmented batch, the leader's critic fitted on the
    follower rows, their AWAC and KL settings), without the rest of the preset (horizon, env
    count, architecture, PPO settings), so that the variant runs at this comparison's scale and
    budget from the same initialisation as the others."""
    import yaml

    from myriad.utils.config import config_dir

    section = yaml.safe_load((config_dir() / "algo" / f"{preset}.yaml").read_text())["algo"]
    return [f"algo.{key}={json.dumps(value)}" for key, value in section.items() if key != "name"]


FINETUNE_VARIANTS: dict[str, tuple[str, list[str]]] = {
    "ppo": ("ppo", []),
    "sapg": ("sapg", []),
    "cpo": ("cpo", ["algo.kl_target=null", "algo.kl_preset=balanced"]),
    "cpo-0.1": ("cpo", ["algo.kl_target=null", "algo.kl_preset=light"]),
    "cpo-0.3": ("cpo", ["algo.kl_target=null", "algo.kl_preset=high"]),
    "cpo-setpoint": ("cpo", ["algo.kl_target=0.3"]),
    "pbt": ("pbt", []),
    # Diagnostics of the leader's decline: no off-policy loss on follower data (the leader learns
    # from its own envs only), or no adversarial reward.
    "sapg-on-policy": ("sapg", ["algo.off_policy_coef=0"]),
    "cpo-on-policy": (
        "cpo",
        ["algo.kl_target=null", "algo.kl_preset=balanced", "algo.off_policy_coef=0"],
    ),
    "cpo-noadv": (
        "cpo",
        ["algo.kl_target=null", "algo.kl_preset=balanced", "algo.adversarial=false"],
    ),
    # The leader's critic also fitted on follower data (its one-step targets there).
    "sapg-value": ("sapg", ["algo.off_policy_value=true"]),
    "cpo-value": (
        "cpo",
        ["algo.kl_target=null", "algo.kl_preset=balanced", "algo.off_policy_value=true"],
    ),
    # The authors' loss form and couplings (algo=sapg_paper / cpo_paper's algo section) at
    # this comparison's scale.
    "sapg-paper-loss": ("sapg", paper_loss_form("sapg_paper")),
    "cpo-paper-loss": ("cpo", paper_loss_form("cpo_paper")),
}
DEFAULT_FINETUNE_VARIANTS = ("ppo", "sapg", "cpo")


def finetune(args: argparse.Namespace, env_overrides: list[str]) -> dict[str, Any]:
    """PPO vs CPO (lambda 0.2) vs SAPG from ``args.finetune_init``, seeds interleaved; per run
    the leader's evaluated return curve and final return (``finetune_compare.run_once``)."""
    from finetune_compare import run_once

    runs = []
    with tempfile.TemporaryDirectory(prefix="halfcheetah-finetune-") as tmp:
        for seed in range(args.finetune_seeds):
            for variant in args.finetune_variants:
                algo, extra = FINETUNE_VARIANTS[variant]
                ns = argparse.Namespace(
                    num_envs=args.finetune_envs,
                    eval_every=args.finetune_eval_every,
                    eval_episodes=args.finetune_eval_episodes,
                    iterations=args.finetune_iterations,
                    final_episodes=args.finetune_final_episodes,
                    metric="return",
                    threshold=args.finetune_threshold,
                    overrides=[
                        *env_overrides,
                        "task=native",
                        f"population.size={1 if algo == 'ppo' else args.members}",
                        f"init.episodes={args.finetune_init_episodes}",
                        *extra,
                    ],
                )
                record = run_once(algo, seed, args.finetune_init, ns, Path(tmp))
                record["variant"] = variant
                record["overrides"] = ns.overrides
                record["load_avg"] = list(os.getloadavg())
                print(
                    f"{variant:<12} seed {seed}: final {record['final_return']:.1f}  "
                    f"mean evaluated {record['auc']:.1f}  ({record['wall_s']:.0f} s)",
                    flush=True,
                )
                runs.append(record)
    return {"runs": runs, "per_algo": per_variant(runs, list(args.finetune_variants))}


#: A drop of the leader's evaluated return between two evaluations larger than this is an
#: instability event; a run "reaches" a return when one of its evaluations does.
DROP, REACH = 100.0, 200.0


def per_variant(runs: list[dict[str, Any]], variants: list[str]) -> dict[str, Any]:
    """Per variant: the runs' final, mean evaluated and first evaluated returns, their means
    over the runs, the instability events (drops > :data:`DROP`) and the runs reaching
    :data:`REACH`."""
    out = {}
    for variant in variants:
        mine = [r for r in runs if r["variant"] == variant]
        curves = [[value for _, value in r["curve"]] for r in mine]
        final = [r["final_return"] for r in mine]
        evaluated = [r["auc"] for r in mine]
        out[variant] = {
            "final_return": final,
            "mean_evaluated_return": evaluated,
            "first_evaluated_return": [c[0] for c in curves],
            "final_return_mean": float(np.mean(final)),
            "mean_evaluated_return_mean": float(np.mean(evaluated)),
            "drops_over_100": sum(
                sum(1 for a, b in itertools.pairwise(c) if a - b > DROP) for c in curves
            ),
            "runs_reaching_200": sum(1 for c in curves if max(c) >= REACH),
        }
    return out


def finetune_figure(path: Path, result: dict[str, Any]) -> None:
    """The leader's evaluated return against env steps, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    palette = plt.get_cmap("tab20").colors
    colours = {v: palette[i % len(palette)] for i, v in enumerate(FINETUNE_VARIANTS)}
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for run in result["runs"]:
        steps, values = zip(*run["curve"], strict=True)
        ax.plot(
            steps,
            values,
            color=colours[run.get("variant", run["algo"])],
            marker="o",
            alpha=0.8,
            label=run.get("variant", run["algo"]) if run["seed"] == 0 else None,
        )
    ax.set_xlabel("env steps")
    ax.set_ylabel("leader's evaluated return")
    ax.grid(alpha=0.3)
    ax.legend()
    ax.set_title("HalfCheetah finetuning from K-Myriad members (cpo: lambda 0.2)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", help="evaluate this pretraining run instead of training one")
    parser.add_argument("--members", type=int, default=8)
    parser.add_argument("--num-envs", type=int, default=1024)
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--episode-steps", type=int, default=200)
    parser.add_argument("--x-bound", type=float, default=10.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-envs", type=int, default=16, help="evaluation envs per member")
    parser.add_argument("--vel-threshold", type=float, default=1.0, help="m/s")
    parser.add_argument("--rate-threshold", type=float, default=1.0, help="rad/s")
    parser.add_argument("--out", default="benchmarks/results/halfcheetah_diversity.json")
    parser.add_argument("--finetune-init", help="add the finetuning comparison from this run")
    parser.add_argument("--finetune-seeds", type=int, default=2)
    parser.add_argument(
        "--finetune-variants",
        nargs="+",
        default=list(DEFAULT_FINETUNE_VARIANTS),
        choices=list(FINETUNE_VARIANTS),
    )
    parser.add_argument("--finetune-envs", type=int, default=512)
    parser.add_argument("--finetune-iterations", type=int, default=60)
    parser.add_argument("--finetune-eval-every", type=int, default=10)
    parser.add_argument("--finetune-eval-episodes", type=int, default=8)
    parser.add_argument("--finetune-final-episodes", type=int, default=16)
    parser.add_argument("--finetune-init-episodes", type=int, default=8)
    parser.add_argument("--finetune-threshold", type=float, default=100.0)
    parser.add_argument(
        "--summarize",
        action="store_true",
        help="recompute --out's per-variant figures from its runs",
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.summarize:
        out = Path(args.out)
        result = json.loads(out.read_text())
        runs = result["finetune"]["runs"]
        variants = list(dict.fromkeys(r["variant"] for r in runs))
        result["finetune"]["per_algo"] = per_variant(runs, variants)
        write_json(out, result)
        return 0
    if args.finetune_init:
        return main_finetune(args)
    load_before = os.getloadavg()
    start = time.perf_counter()

    with tempfile.TemporaryDirectory(prefix="halfcheetah-diversity-") as tmp:
        if args.run:
            run = Path(args.run)
        else:
            from myriad.pretrain.api import pretrain

            run = Path(tmp) / "pretrain"
            pretrain(pretrain_overrides(args), run_dir=run, quiet=True)
        summary = json.loads((run / "summary.json").read_text())
        saved = load_population(run)
        model = saved.model.eval()
        members = int(saved.config["population"]["size"])
        steps = int(saved.env["options"]["max_episode_steps"]) - 1  # the last step resets
        eval_seed = int(saved.config["seed"]) + 10_000  # not the training envs' episodes
        trained = rollout(model, saved.env, members, args.eval_envs, steps, eval_seed)
        torch.manual_seed(int(saved.config["seed"]))
        probe = make_from_config(saved.env, 1, "cpu")
        fresh_model = build_population(
            saved.config["population"], probe.obs_dim, probe.action_dim
        ).eval()
        probe.close()
        fresh = rollout(fresh_model, saved.env, members, args.eval_envs, steps, eval_seed)

    result: dict[str, Any] = {
        "benchmark": "halfcheetah_diversity",
        "machine": {**machine_info(), "versions": library_versions()},
        "load_avg_before": list(load_before),
        "load_avg_after": list(os.getloadavg()),
        "settings": {
            "run": str(args.run) if args.run else None,
            "pretrain_overrides": pretrain_overrides(args) if not args.run else None,
            "config": {
                "env": saved.env,
                "population": saved.config["population"],
                "num_envs": saved.config["num_envs"],
                "num_steps": saved.config["num_steps"],
                "iterations": saved.config["iterations"],
                "objective": saved.config["objective"],
                "seed": saved.config["seed"],
            },
            "eval_envs_per_member": args.eval_envs,
            "eval_steps": steps,
            "eval_actions": "stochastic",
            "vel_threshold": args.vel_threshold,
            "rate_threshold": args.rate_threshold,
            "distinct_rule": (
                "single-linkage groups of members linked when |mean velocity difference| <= "
                "vel_threshold m/s and |mean pitch rate difference| <= rate_threshold rad/s"
            ),
        },
        "pretraining": {
            k: summary.get(k)
            for k in (
                "env_steps",
                "wall_time_s",
                "coverage/cumulative_union",
                "eval_coverage_union",
                "eval_coverage_per_member",
                "eval_entropy_collective",
                "eval_entropy_diversity",
            )
        },
        "pretrained": summarise(*trained, args),
        "fresh": summarise(*fresh, args),
        "total_wall_s": time.perf_counter() - start,
    }
    out = Path(args.out)
    write_json(out, result)
    figure(out.with_suffix(".png"), trained, fresh, result)
    for name in ("pretrained", "fresh"):
        print(f"{name}: {result[name]['distinct_behaviours']} distinct behaviours")
        for i, row in enumerate(result[name]["members"]):
            print(
                f"  member {i}: vel {row['vel_mean']:+.2f} +- {row['vel_std']:.2f} m/s, "
                f"pitch {row['pitch_circ_mean']:+.2f} rad (R {row['pitch_resultant']:.2f})  "
                f"{row['label']}"
            )
    print(f"wrote {out} and {out.with_suffix('.png')}")
    return 0


def main_finetune(args: argparse.Namespace) -> int:
    """Add the finetuning comparison (and the init run's behaviour summary) to ``--out``."""
    out = Path(args.out)
    result = json.loads(out.read_text())
    saved = load_population(args.finetune_init)
    members = int(saved.config["population"]["size"])
    steps = int(saved.env["options"]["max_episode_steps"]) - 1
    eval_seed = int(saved.config["seed"]) + 10_000
    init_rollouts = rollout(
        saved.model.eval(), saved.env, members, args.eval_envs, steps, eval_seed
    )
    options = saved.env["options"]
    env_overrides = [
        "env=ant",
        f"env.name={saved.env['name']}",
        "~env.options.xy_bound",
        f"+env.options.x_bound={options['x_bound']}",
        f"env.options.max_episode_steps={options['max_episode_steps']}",
    ]
    load_before = os.getloadavg()
    start = time.perf_counter()
    comparison = finetune(args, env_overrides)
    result["finetune"] = {
        "init": str(args.finetune_init),
        "init_config": {k: saved.config[k] for k in ("env", "num_envs", "iterations", "seed")},
        "init_behaviour": summarise(*init_rollouts, args),
        "settings": {
            "algos": {
                v: [FINETUNE_VARIANTS[v][0], "task=native", *FINETUNE_VARIANTS[v][1]]
                for v in args.finetune_variants
            },
            "members": args.members,
            "env_overrides": env_overrides,
            "seeds": args.finetune_seeds,
            "num_envs": args.finetune_envs,
            "iterations": args.finetune_iterations,
            "env_steps_per_run": comparison["runs"][0]["env_steps"],
            "eval_every": args.finetune_eval_every,
            "eval_episodes": args.finetune_eval_episodes,
            "final_episodes": args.finetune_final_episodes,
            "init_episodes": args.finetune_init_episodes,
            "threshold": args.finetune_threshold,
        },
        "load_avg_before": list(load_before),
        "load_avg_after": list(os.getloadavg()),
        "wall_s": time.perf_counter() - start,
        **comparison,
    }
    write_json(out, result)
    finetune_figure(out.with_name(out.stem + "_finetune.png"), result["finetune"])
    print(json.dumps(result["finetune"]["per_algo"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
