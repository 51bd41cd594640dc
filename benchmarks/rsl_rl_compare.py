"""myriad's PPO learning loop against rsl_rl's, on the same env, network and settings.

Both learn on ``nav-maze`` with the dense task reward from ``E`` parallel envs: the same MLP
(two hidden layers of 64 ELU units, separate actor and critic, state-independent log std,
observation normalisation), the same rollout length, epochs, minibatches, clip ranges, discount,
GAE lambda and KL-adaptive learning rate. rsl_rl (the ``rsl-rl-lib`` package, the ``bench`` extra)
runs its own ``OnPolicyRunner.learn`` through :class:`RslRlNavEnv`, a thin adapter from a myriad
env to rsl_rl's ``VecEnv``; myriad runs what ``myriad finetune --algo ppo`` runs: the command's
config (with the settings above as overrides) and ``FinetuneRunner.learn`` with its thread
setting (:class:`RunnerLearner`), so the timing includes the runner's own per-iteration work
(episode statistics, logging). Timed blocks of iterations alternate between the two
(A B, then B A, ...) so that the load from other processes on the machine falls on both alike;
each block's env-steps/s is recorded and the ratio is taken of the medians. Each block also
records env-steps per CPU-second of the process (``cpu_ratio``), which the load of other
processes changes much less than the wall clock.

The same runs give the learning curves (mean return of the episodes finished in each iteration,
measured identically for both by the adapter and myriad's episode tracker). A second part times
a SAPG population of 16 members against single-policy PPO in myriad (both through the finetuning
runner, same env and network), interleaved in the same way.

Differences that remain by design, and cost myriad time rather than save it: myriad bootstraps
truncated episodes from V(final observation) (a critic pass over the truncated steps after each
rollout) where rsl_rl uses V(current observation), and myriad normalises the critic's targets
(value normalisation).
Advantages are normalised per minibatch in myriad and per rollout in rsl_rl.

Both run in one process with the process settings of every myriad process, applied when this
script imports myriad, before torch (``myriad.utils.process``; recorded in the JSON's
``settings.process_settings`` and ``machine.openmp``): idle OpenMP threads sleep
(``OMP_WAIT_POLICY=PASSIVE`` unless the environment sets a policy) and glibc keeps freed memory.
``OMP_WAIT_POLICY=ACTIVE python benchmarks/rsl_rl_compare.py`` times both with spinning idle
threads instead.

    .venv/bin/python benchmarks/rsl_rl_compare.py                 # full: threads 1 and 2
    .venv/bin/python benchmarks/rsl_rl_compare.py --quick         # a smoke run
    .venv/bin/python benchmarks/rsl_rl_compare.py --value-clip 0.2 --threads 1 --skip-population \
        --out benchmarks/results/rsl_rl_compare_value_clip.json
    .venv/bin/python benchmarks/rsl_rl_compare.py --skip-rsl-rl \
        --out benchmarks/results/rsl_rl_compare_sapg.json
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# isort: off
# myriad first, as in the command: importing it applies the process settings (OpenMP wait
# policy, allocator; myriad.utils.process) before torch loads its OpenMP runtime.
import myriad  # noqa: F401
import torch

# isort: on
from myriad.bench.common import machine_info, write_json
from myriad.envs import make
from myriad.envs.base import VecEnv
from myriad.utils.process import apply_process_settings
from myriad.utils.seeding import seed_everything

DEFAULT_OUT = Path("benchmarks/results/rsl_rl_compare.json")
ENV_NAME = "nav-maze"
ENV_OPTIONS: dict[str, Any] = {"task": "dense", "max_episode_steps": 400, "max_speed": 0.85}
HIDDEN = (64, 64)
ACTIVATION = "elu"
INIT_LOG_STD = -0.5
# PPO settings shared by both (myriad's finetuning defaults, configs/finetune.yaml).
NUM_STEPS = 32
EPOCHS = 4
MINIBATCHES = 4
LR = 3e-4
CLIP = 0.2
GAMMA = 0.99
LAM = 0.95
VALUE_COEF = 1.0
# myriad clips its value loss in the normalised scale of its value normaliser, rsl_rl (which has
# none) in return units. The default run (rsl_rl_compare.json) leaves myriad's clip out: it was
# recorded while the clip's centre still moved with the normaliser's statistics, which stalled
# myriad's critic on this task. --value-clip 0.2 runs with myriad's default clip, as rsl_rl clips
# its own (rsl_rl_compare_value_clip.json).
MYRIAD_VALUE_CLIP: float | None = None
ENTROPY_COEF = 0.0
MAX_GRAD_NORM = 1.0
DESIRED_KL = 0.01


def load_average() -> list[float]:
    return [round(v, 2) for v in os.getloadavg()]


def nav_env(num_envs: int) -> VecEnv:
    return make(ENV_NAME, num_envs, "cpu", **ENV_OPTIONS)


def desync(env: VecEnv) -> None:
    """After the reset: as in myriad's finetuning runner, the first episodes end at random
    steps, so every rollout mixes episode phases and episodes finish from the first iterations
    on (the same draws for both learners: the env's generator, seeded by the reset)."""
    env.randomize_episode_progress()  # type: ignore[attr-defined]


class RslRlNavEnv:
    """A myriad :class:`~myriad.envs.base.VecEnv` seen through rsl_rl's ``VecEnv`` interface.

    Observations go out as a ``TensorDict`` with one group, ``"policy"``; ``extras["time_outs"]``
    carries the truncations (rsl_rl bootstraps them). Finished episodes' returns are summed on
    the device the way myriad's :class:`~myriad.rl.collector.EpisodeTracker` does, so both
    learners' curves are measured identically.
    """

    def __init__(self, env: VecEnv, obs: torch.Tensor) -> None:
        from rsl_rl.env import VecEnv as RslVecEnv

        # rsl_rl's VecEnv is an ABC with class-level attribute annotations only; registering the
        # adapter keeps isinstance checks true without inheriting its abstract machinery.
        RslVecEnv.register(RslRlNavEnv)
        self.env = env
        self.num_envs = env.num_envs
        self.num_actions = env.action_dim
        self.max_episode_length = env.max_episode_steps
        self.device = str(env.device)
        self.cfg: dict[str, Any] = {"env": ENV_NAME, **ENV_OPTIONS}
        self.obs = obs
        self.episode_sums = torch.zeros(2, dtype=torch.float64)
        self.reward_sum = torch.zeros((), dtype=torch.float64)
        self.reward_steps = 0

    @property
    def episode_length_buf(self) -> torch.Tensor:
        return self.env.episode.lengths  # type: ignore[attr-defined]

    @episode_length_buf.setter
    def episode_length_buf(self, value: torch.Tensor) -> None:
        self.env.episode.lengths = value.long()  # type: ignore[attr-defined]

    def _wrap(self, obs: torch.Tensor) -> Any:
        from tensordict import TensorDict

        return TensorDict({"policy": obs}, batch_size=[self.num_envs])

    def get_observations(self) -> Any:
        return self._wrap(self.obs)

    def step(self, actions: torch.Tensor) -> tuple[Any, torch.Tensor, torch.Tensor, dict]:
        obs, reward, _, truncated, info = self.env.step(actions)
        done = info["done"]
        self.obs = obs
        self.reward_sum += reward.sum(dtype=torch.float64)
        self.reward_steps += reward.numel()
        mask = done.to(torch.float64)
        self.episode_sums += torch.stack(
            [(info["episode_return"].to(torch.float64) * mask).sum(), mask.sum()]
        )
        return self._wrap(obs), reward, done.long(), {"time_outs": truncated.float()}

    def summary(self) -> tuple[float, float]:
        """Mean reward per env step and mean return of the episodes finished since the last
        call (NaN when none finished)."""
        total, count = self.episode_sums.tolist()
        mean_reward = float(self.reward_sum) / max(self.reward_steps, 1)
        self.episode_sums.zero_()
        self.reward_sum.zero_()
        self.reward_steps = 0
        return mean_reward, total / count if count else math.nan


def rsl_rl_config() -> dict[str, Any]:
    """rsl_rl's training config with the shared settings."""
    return {
        "num_steps_per_env": NUM_STEPS,
        "save_interval": 10**9,
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "check_for_nan": False,
        "algorithm": {
            "class_name": "rsl_rl.algorithms.PPO",
            "num_learning_epochs": EPOCHS,
            "num_mini_batches": MINIBATCHES,
            "clip_param": CLIP,
            "gamma": GAMMA,
            "lam": LAM,
            "value_loss_coef": VALUE_COEF,
            "entropy_coef": ENTROPY_COEF,
            "learning_rate": LR,
            "max_grad_norm": MAX_GRAD_NORM,
            "use_clipped_value_loss": True,
            "schedule": "adaptive",
            "desired_kl": DESIRED_KL,
        },
        "actor": {
            "class_name": "rsl_rl.models.MLPModel",
            "hidden_dims": list(HIDDEN),
            "activation": ACTIVATION,
            "obs_normalization": True,
            "distribution_cfg": {
                "class_name": "rsl_rl.modules.distribution.GaussianDistribution",
                "init_std": math.exp(INIT_LOG_STD),
                "std_type": "log",
            },
        },
        "critic": {
            "class_name": "rsl_rl.models.MLPModel",
            "hidden_dims": list(HIDDEN),
            "activation": ACTIVATION,
            "obs_normalization": True,
        },
    }


class Learner:
    """One learning loop; :meth:`run` reports, per iteration, the mean reward per env step of
    its rollout and the mean return of the episodes that finished in it."""

    name: str
    steps_per_iteration: int

    def run(self, iterations: int) -> list[tuple[float, float]]:
        raise NotImplementedError


class RunnerLearner(Learner):
    """``myriad finetune --algo ALGO``: the command's config and runner
    (:class:`~myriad.finetune.runner.FinetuneRunner`), trained by ``FinetuneRunner.learn`` with
    the command's thread setting, so every iteration pays what a user's does (episode
    statistics, member scalars, diagnostics, logging). The checkpoint and summary that a run
    writes once, at its end, are left out of the timed blocks."""

    def __init__(
        self,
        algo: str,
        num_envs: int,
        threads: int,
        seed: int,
        run_dir: Path,
        overrides: tuple[str, ...] = (),
    ) -> None:
        from myriad.finetune.api import resolve_config
        from myriad.finetune.runner import FinetuneRunner
        from myriad.rl.runner import set_torch_threads

        cfg = resolve_config(
            algo,
            [
                f"env.name={ENV_NAME}",
                *(f"env.options.{k}={v}" for k, v in ENV_OPTIONS.items()),
                f"population.actor_hidden=[{','.join(map(str, HIDDEN))}]",
                f"population.critic_hidden=[{','.join(map(str, HIDDEN))}]",
                f"population.activation={ACTIVATION}",
                f"population.init_log_std={INIT_LOG_STD}",
                f"num_envs={num_envs}",
                f"num_steps={NUM_STEPS}",
                f"torch_threads={threads}",
                f"seed={seed}",
                "eval.every=0",
                "checkpoint_every=0",
                "progress=false",
                "plots=false",
                "tensorboard=false",
                *overrides,
            ],
        )
        set_torch_threads(cfg)
        self.runner = runner = FinetuneRunner(cfg, run_dir)
        runner.save_checkpoint = lambda *a, **k: run_dir  # type: ignore[method-assign]
        runner.write_summary = lambda: run_dir  # type: ignore[method-assign]
        self.rewards: list[float] = []
        collect = runner.collect

        def collect_and_note() -> Any:
            rollout = collect()
            self.rewards.append(float(rollout.rewards.mean()))
            return rollout

        runner.collect = collect_and_note  # type: ignore[method-assign]
        self.steps_per_iteration = runner.steps_per_iteration

    def run(self, iterations: int) -> list[tuple[float, float]]:
        done = self.runner.iteration_count
        self.runner.learn(done + iterations)
        returns = dict(self.runner.logger.history.get("episode/return", []))
        return [
            (self.rewards[i], returns.get(i + 1, math.nan)) for i in range(done, done + iterations)
        ]


class RslRlLearner(Learner):
    name = "rsl_rl"

    def __init__(self, num_envs: int, seed: int) -> None:
        import contextlib
        import io

        from rsl_rl.runners import OnPolicyRunner

        seed_everything(seed)
        env = nav_env(num_envs)
        obs = env.reset(seed=seed)
        desync(env)
        self.env = RslRlNavEnv(env, obs)
        # The runner prints the model summary on construction; keep the benchmark output terse.
        with contextlib.redirect_stdout(io.StringIO()):
            self.runner = OnPolicyRunner(self.env, rsl_rl_config(), log_dir=None, device="cpu")
        self.steps_per_iteration = NUM_STEPS * num_envs

    def run(self, iterations: int) -> list[tuple[float, float]]:
        out = []
        for _ in range(iterations):
            self.runner.learn(1)
            out.append(self.env.summary())
        return out


def interleaved(
    learners: list[Learner], repeats: int, iterations: int
) -> dict[str, dict[str, Any]]:
    """Time ``repeats`` blocks of ``iterations`` iterations per learner, alternating the order
    (A B, B A, ...), after one warm-up iteration each; returns per learner the steps/s of every
    block (wall clock, and per CPU-second of this process: the latter is the same under the
    load of other processes with one thread, the former is not) and, per iteration (warm-up
    included), the mean step reward and episode return."""
    out: dict[str, dict[str, Any]] = {}
    for learner in learners:
        first = learner.run(1)
        out[learner.name] = {
            "steps_per_s": [],
            "steps_per_cpu_s": [],
            "mean_reward": [r for r, _ in first],
            "episode_return": [e for _, e in first],
        }
    for r in range(repeats):
        for learner in learners if r % 2 == 0 else learners[::-1]:
            start, start_cpu = time.perf_counter(), time.process_time()
            curve = learner.run(iterations)
            seconds = time.perf_counter() - start
            cpu_seconds = time.process_time() - start_cpu
            rec = out[learner.name]
            steps = learner.steps_per_iteration * iterations
            rec["steps_per_s"].append(steps / seconds)
            rec["steps_per_cpu_s"].append(steps / cpu_seconds)
            rec["mean_reward"] += [r for r, _ in curve]
            rec["episode_return"] += [e for _, e in curve]
    for rec in out.values():
        rec["median_steps_per_s"] = statistics.median(rec["steps_per_s"])
        rec["median_steps_per_cpu_s"] = statistics.median(rec["steps_per_cpu_s"])
    return out


def trend(values: list[float], window: int) -> dict[str, float]:
    """Mean of the first and of the last ``window`` finite values, and their difference."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return {"first": math.nan, "last": math.nan, "change": math.nan}
    first, last = statistics.fmean(finite[:window]), statistics.fmean(finite[-window:])
    return {"first": first, "last": last, "change": last - first}


def rate_ratio(numerator: dict[str, Any], denominator: dict[str, Any]) -> dict[str, Any]:
    """Two interleaved learners' records (:func:`interleaved`) compared: the ratio of their
    median env-steps per second and the ratio in each timed block."""
    return {
        "ratio": numerator["median_steps_per_s"] / denominator["median_steps_per_s"],
        "block_ratios": [
            a / b for a, b in zip(numerator["steps_per_s"], denominator["steps_per_s"])
        ],
        "cpu_ratio": numerator["median_steps_per_cpu_s"] / denominator["median_steps_per_cpu_s"],
    }


def compare_rsl_rl(
    num_envs: int,
    threads: int,
    repeats: int,
    iterations: int,
    value_clip: float | None = MYRIAD_VALUE_CLIP,
) -> dict[str, Any]:
    torch.set_num_threads(threads)
    clip = "null" if value_clip is None else str(value_clip)
    # rsl_rl's adaptive schedule has no ceiling below 1e-2; the finetuning default's is 1e-3.
    settings = (
        "population.size=1",
        f"ppo.value_clip={clip}",
        f"ppo.max_lr={1e-2}",
        f"ppo.epochs={EPOCHS}",
        f"ppo.minibatches={MINIBATCHES}",
        f"ppo.lr={LR}",
        f"ppo.clip={CLIP}",
        f"ppo.gamma={GAMMA}",
        f"ppo.lam={LAM}",
        f"ppo.value_coef={VALUE_COEF}",
        f"ppo.entropy_coef={ENTROPY_COEF}",
        f"ppo.max_grad_norm={MAX_GRAD_NORM}",
        f"ppo.desired_kl={DESIRED_KL}",
    )
    with tempfile.TemporaryDirectory() as tmp:
        ours = RunnerLearner("ppo", num_envs, threads, 0, Path(tmp) / "myriad", settings)
        ours.name = "myriad"
        learners: list[Learner] = [ours, RslRlLearner(num_envs, 0)]
        res = interleaved(learners, repeats, iterations)
    mine, theirs = res["myriad"], res["rsl_rl"]
    window = max(1, len(mine["mean_reward"]) // 4)
    curves = {name: trend(res[name]["mean_reward"], window) for name in ("myriad", "rsl_rl")}
    return {
        "num_envs": num_envs,
        "torch_threads": threads,
        "repeats": repeats,
        "iterations_per_block": iterations,
        "myriad": mine,
        "rsl_rl": theirs,
        **rate_ratio(mine, theirs),
        # The dense reward is minus the normalised distance to the goal: its mean per step
        # rises as the policy learns, whatever the episode phases of the rollout.
        "mean_reward_trend": {
            "window": window,
            **curves,
            "both_improve": all(c["change"] > 0 for c in curves.values()),
        },
    }


def compare_population(
    num_envs: int, size: int, threads: int, repeats: int, iterations: int
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        single = RunnerLearner(
            "ppo", num_envs, threads, 0, Path(tmp) / "ppo", ("population.size=1",)
        )
        population = RunnerLearner(
            "sapg", num_envs, threads, 0, Path(tmp) / "sapg", (f"population.size={size}",)
        )
        single.name, population.name = "ppo-1", f"sapg-{size}"
        res = interleaved([single, population], repeats, iterations)
    a, b = res[single.name], res[population.name]
    return {
        "num_envs": num_envs,
        "torch_threads": threads,
        "population_size": size,
        "repeats": repeats,
        "iterations_per_block": iterations,
        "ppo": a,
        "sapg": b,
        **rate_ratio(b, a),
    }


def _parse_ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",") if v.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="JSON output path")
    ap.add_argument("--num-envs", type=int, default=4096)
    ap.add_argument("--threads", type=_parse_ints, default=[1, 2], help="e.g. 1,2")
    ap.add_argument("--repeats", type=int, default=6, help="timed blocks per learner")
    ap.add_argument("--iterations", type=int, default=3, help="iterations per timed block")
    ap.add_argument("--population", type=int, default=16, help="SAPG population size")
    ap.add_argument(
        "--value-clip",
        type=lambda v: None if v.lower() == "none" else float(v),
        default=MYRIAD_VALUE_CLIP,
        help="myriad's PPO value clip (none, or e.g. 0.2, its library default)",
    )
    ap.add_argument("--skip-population", action="store_true", help="only the rsl_rl comparison")
    ap.add_argument(
        "--skip-rsl-rl", action="store_true", help="only the SAPG population against PPO"
    )
    ap.add_argument("--quick", action="store_true", help="small sizes, a smoke run")
    args = ap.parse_args(argv)
    if args.quick:
        args.num_envs, args.repeats, args.iterations, args.threads = 256, 2, 1, [1]
    rsl_rl_version = None
    if not args.skip_rsl_rl:
        try:
            import rsl_rl  # noqa: F401
        except ImportError:
            print(
                "rsl_rl is not installed: pip install -e '.[bench]' (the rsl-rl-lib package)",
                file=sys.stderr,
            )
            return 2
        from importlib.metadata import version

        rsl_rl_version = version("rsl-rl-lib")

    load_start = load_average()
    started = time.perf_counter()
    runs = []
    for threads in [] if args.skip_rsl_rl else args.threads:
        res = compare_rsl_rl(args.num_envs, threads, args.repeats, args.iterations, args.value_clip)
        print(
            f"{args.num_envs} envs, {threads} thread(s): myriad "
            f"{res['myriad']['median_steps_per_s']:,.0f} steps/s, rsl_rl "
            f"{res['rsl_rl']['median_steps_per_s']:,.0f} steps/s, ratio {res['ratio']:.2f}",
            flush=True,
        )
        runs.append(res)
    population = []
    if not args.skip_population:
        for threads in args.threads:
            res = compare_population(
                args.num_envs, args.population, threads, args.repeats, args.iterations
            )
            print(
                f"{args.num_envs} envs, {threads} thread(s): SAPG-{args.population} "
                f"{res['sapg']['median_steps_per_s']:,.0f} steps/s, PPO "
                f"{res['ppo']['median_steps_per_s']:,.0f} steps/s, ratio {res['ratio']:.2f} "
                f"(per CPU-second {res['cpu_ratio']:.2f})",
                flush=True,
            )
            population.append(res)
    payload = {
        "benchmark": "rsl_rl_compare",
        "machine": machine_info("cpu"),
        "rsl_rl_lib": rsl_rl_version,
        "load_average_start": load_start,
        "load_average_end": load_average(),
        "seconds": time.perf_counter() - started,
        "settings": {
            "env": ENV_NAME,
            "env_options": ENV_OPTIONS,
            "hidden": list(HIDDEN),
            "activation": ACTIVATION,
            "num_steps": NUM_STEPS,
            "epochs": EPOCHS,
            "minibatches": MINIBATCHES,
            "lr": LR,
            "desired_kl": DESIRED_KL,
            "myriad_value_clip": args.value_clip,
            "process_settings": dataclasses.asdict(apply_process_settings()),
        },
        "rsl_rl_runs": runs,
        "population_runs": population,
    }
    path = write_json(args.out, payload)
    print(f"results written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
