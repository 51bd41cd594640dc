"""The finetuning runner: a leader and followers (or PPO / PBT members) on a task reward.

Each iteration collects ``T`` steps of every env, lets the algorithm update the population from
that one shared rollout, then logs the update's stats, per-member returns and success rates, the
KL diagnostics (:mod:`myriad.assess.diagnostics`) and, every ``eval.every`` iterations, the
leader's deterministic success on fresh envs. The runner base owns the loop, checkpoints, exact
resume, TensorBoard, the progress bar and the per-group plots; :meth:`FinetuneRunner.finish`
adds the final evaluation, the KL heatmap and the overview figure.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

from myriad.assess.diagnostics import Diagnostics
from myriad.assess.evaluation import PopulationEvaluation, PopulationEvaluator
from myriad.envs import RemoteEnvFactory, make
from myriad.envs.base import VecEnv
from myriad.finetune.algorithms import build_algorithm
from myriad.finetune.base import FinetuneAlgorithm
from myriad.finetune.init import InitReport, initialise
from myriad.finetune.tracking import member_scalars
from myriad.rl.on_policy import (
    STAGE_RESUME_IGNORED_KEYS,
    OnPolicyRunner,
    population_setup,
    runner_settings,
)
from myriad.rl.roles import ProcessRole, SingleProcess
from myriad.rl.storage import RolloutStorage
from myriad.utils.checkpoint import latest_checkpoint
from myriad.utils.config import ConfigError
from myriad.utils.loggers import LogBackend
from myriad.utils.seeding import stream_seed
from myriad.viz.finetune_plots import kl_heatmap, kl_setpoint, overview
from myriad.viz.route_plots import route_map
from myriad.viz.runs import TrainingVideos, evaluation_behaviour_plots


def check_task(env: VecEnv) -> None:
    """Refuse an env without a task reward (a nav env with ``task=none``)."""
    if not env.has_task_reward:
        raise ConfigError(
            f"env {env.name} has no task reward (task=none, the pretraining setting): finetune "
            f"on task=sparse, dense or multigoal"
        )


class FinetuneRunner(OnPolicyRunner):
    """Finetuning from a resolved config (see ``configs/finetune.yaml``).

    Args:
        cfg: the resolved config.
        run_dir: the run folder.
        role: how this process takes part in the run (:mod:`myriad.rl.roles`). On a rank of a
            ``torchrun`` launch every rank holds the whole population and algorithm, steps its
            share of the envs, gathers every rank's rollout into :attr:`storage` and learns as
            :attr:`update_split` says; the writer alone runs the final evaluation and writes
            the run folder.
        remote_envs: builds the envs of a config with a ``distributed`` entry (the command
            layer's choice; :func:`~myriad.envs.registry.make_from_config`).
        log_backends: trackers of the caller's own that the run's scalars also go to
            (:class:`~myriad.utils.loggers.LogBackend`), beside the config's ``logger``.
    """

    RESUME_IGNORED_KEYS: ClassVar[tuple[str, ...]] = (
        *OnPolicyRunner.RESUME_IGNORED_KEYS,
        *STAGE_RESUME_IGNORED_KEYS,
    )
    #: torchrun runs wrote this name before ranks became a role of this runner.
    CHECKPOINT_NAMES: ClassVar[tuple[str, ...]] = ("ShardedFinetuneRunner",)

    algorithm: FinetuneAlgorithm

    def __init__(
        self,
        cfg: Mapping[str, Any],
        run_dir: str | os.PathLike[str],
        role: ProcessRole | None = None,
        remote_envs: RemoteEnvFactory | None = None,
        log_backends: Sequence[LogBackend] = (),
    ) -> None:
        role = role if role is not None else SingleProcess()
        setup = population_setup(cfg, role.env_shard, remote_envs=remote_envs)
        check_task(setup.env)
        cfg = setup.config
        self.seed = setup.seed
        algorithm = build_algorithm(cfg, setup.model, self.seed)
        super().__init__(
            setup.env,
            setup.model,
            algorithm,
            cfg,
            run_dir,
            num_steps=int(cfg["num_steps"]),
            seed=setup.env_seed,
            member=setup.member[setup.envs],
            store_transitions=algorithm.needs_transitions,
            desync=bool(cfg.get("desync_episodes", True)),
            role=role,
            log_backends=log_backends,
            **runner_settings(cfg),
        )
        # Seeded alike, the replicas start equal; the role makes sure of it (an env that draws
        # from the global generator while it is built draws per env, so per process).
        role.share_module(self.model)
        role.share_state(self.algorithm)
        #: How the processes split the update: ``"envs"`` (each learns from its own envs' rows,
        #: normalisers merged), ``"rows"`` (each learns from its share of every minibatch of
        #: the gathered rollout), None in one process (or with ``rank_split="none"``: the whole
        #: update on every rank, a reference for benchmarks).
        self.update_split: str | None = None
        if role.world_size > 1 and algorithm.rank_split in ("envs", "rows"):
            self.update_split = algorithm.rank_split
        role.prepare(self.model, algorithm, self.update_split)
        #: This process's share of each rollout ``[T, E_local]``; :attr:`storage` is the whole
        #: run's ``[T, E]`` (the same storage in one process).
        self.local_storage = self.storage
        self.storage = role.whole_rollout(self.local_storage, setup.member)
        env, member, size = self.env, setup.member, self.model.num_members
        self.diagnostics = Diagnostics(
            member,
            size,
            self.storage.num_steps,
            int(cfg["diagnostics"]["states_per_member"]),
            per_member=size <= 16,
        )
        self.init_report: InitReport | None = None
        # None unless video.every; the writer alone records.
        self.videos = TrainingVideos.from_config(cfg, self.run_dir) if role.is_writer else None
        self.final_eval: dict[str, float] | None = None
        self.evaluator = PopulationEvaluator.from_config(
            dict(cfg.get("eval") or {}),
            env,
            self.make_env,
            size,
            stream_seed(self.seed, "evaluation"),
        )
        self.last_evaluation: PopulationEvaluation | None = None
        self.solutions: dict[str, Any] | None = None
        self.robustness: dict[str, Any] | None = None

    # ---------------------------------------------------------------- set-up

    def make_env(self, num_envs: int, **overrides: Any) -> VecEnv:
        """The configured task env with ``num_envs`` envs (``overrides`` on its options)."""
        env_cfg = self.config["env"]
        options = {**dict(env_cfg.get("options") or {}), **overrides}
        return make(env_cfg["name"], num_envs, self.config["device"], **options)

    @property
    def leader(self) -> int:
        return self.algorithm.leader

    def initialise(self, source: str | os.PathLike[str]) -> InitReport:
        """Start the population from a pretrained run (the rule in :mod:`myriad.finetune.init`).

        Every process ranks (the ranking's evaluation is seeded alike); the writer's population
        and report are then every process's."""
        init = self.config.get("init") or {}
        rank_options = dict(init.get("rank_options") or {})
        self.status(
            f"ranking the members of {source} on the task "
            f"({int(init.get('episodes', 16))} episodes each)"
        )
        self.init_report = initialise(
            self.model,
            source,
            lambda n: self.make_env(n, **rank_options),
            episodes=int(init.get("episodes", 16)),
            deterministic=bool(init.get("deterministic", False)),
            critic=str(init.get("critic", "fresh")),
            seed=stream_seed(self.seed, "init_ranking"),
            env=self.config["env"],
        )
        self.role.share_module(self.model)
        self.init_report = self.role.broadcast(self.init_report)
        return self.init_report

    # ---------------------------------------------------------------- one iteration

    @property
    def critic_warmup(self) -> int:
        """Iterations at the start that fit only the critics: ``init.critic_warmup`` when the
        actors come from ``--init`` and the critics are fresh, else 0."""
        if self.init_report is None or self.init_report.critic != "fresh":
            return 0
        return int((self.config.get("init") or {}).get("critic_warmup", 0))

    def collect(self) -> RolloutStorage:
        """This iteration's rollout of every env (every process's), the one the update learns
        from."""
        self.collector.collect(self.local_storage)
        self.role.gather_rollout(self.local_storage, self.storage)
        return self.storage

    def learning_rollout(self, rollout: RolloutStorage) -> RolloutStorage:
        """The rows this process's update learns from: its own envs' rows when the update
        splits by envs, else the whole rollout."""
        return self.local_storage if self.update_split == "envs" else rollout

    def iteration(self) -> dict[str, float]:
        rollout = self.collect()
        critic_only = self.iteration_count < self.critic_warmup
        stats = self.algorithm.update(self.learning_rollout(rollout), critic_only=critic_only)
        out: dict[str, float] = {f"train/{k}": v for k, v in stats.items()}
        out["train/critic_only"] = float(critic_only)
        episodes = self.collector.episodes
        sums = episodes.read()
        out.update(episodes.scalars(sums))
        out.update(self.algorithm.end_iteration(sums.returns, sums.counts))
        leader = self.leader
        out.update(member_scalars(sums, leader, episodes.has_success, self.model.num_members <= 16))
        out.update(self.diagnostics(self.model, rollout, leader))
        every = int(self.config["eval"]["every"])
        if every and (self.iteration_count + 1) % every == 0:
            out.update(self.evaluate_leader(int(self.config["eval"]["episodes"])))
        if self.videos is not None and self.videos.due(self.iteration_count + 1):
            # At this iteration's env steps, the scalars' x axis; backends that show videos
            # (W&B) get the file.
            done = self.env_steps + self.steps_per_iteration
            video = self.videos.record(self.model, self.iteration_count + 1, done)
            self.logger.log_video("videos/population", video, self.iteration_count + 1, done)
        return out

    def evaluate_leader(self, episodes: int) -> dict[str, float]:
        """``episodes`` deterministic episodes of every member in fresh envs, one batched
        rollout (:class:`PopulationEvaluator`): the leader's success rate and mean return
        (``eval/leader_success``, ``eval/leader_return``), the best member's success rate
        (``eval/population_success``) and the number of distinct solutions
        (``eval/distinct_solutions``); with ``eval.sampled``, the same rates and return with
        sampled actions (``eval/*_sampled``)."""
        self.last_evaluation = self.evaluator.evaluate(self.model, self.leader, episodes)
        scalars = dict(self.last_evaluation.scalars)
        if self.config["eval"].get("sampled", False):
            scalars.update(self.evaluator.sampled(self.model, self.leader, episodes))
        return scalars

    # ---------------------------------------------------------------- results

    def summary(self) -> dict[str, Any]:
        out = super().summary()
        out["algo"] = self.config["algo"]["name"]
        out["leader"] = self.leader
        out["init"] = self.init_report.to_dict() if self.init_report else None
        out["final_eval"] = self.final_eval
        out["solutions"] = self.solutions
        out["robustness"] = self.robustness
        history = self.logger.history
        out["evaluations"] = [
            {"iteration": i, "env_steps": i * self.steps_per_iteration}
            | {k: dict(history[k]).get(i) for k in sorted(history) if k.startswith("eval/")}
            for i, _ in history.get("eval/leader_success", [])
        ]
        return out

    def finish(self) -> dict[str, Any]:
        """Evaluate the leader, write the heatmap, overview and ``summary.json``; returns the
        summary. The writer alone does so; its summary is every process's."""
        summary: dict[str, Any] | None = self._final_report() if self.role.is_writer else None
        shared = self.role.broadcast(summary)
        assert shared is not None  # the writer's summary
        return dict(shared)

    def _final_report(self) -> dict[str, Any]:
        final_episodes = int(self.config["eval"]["final_episodes"])
        self.status(
            f"final evaluation: {final_episodes} episodes of each of the {self.model.num_members} "
            "members, deterministic actions"
        )
        self.final_eval = self.evaluate_leader(final_episodes)
        final = self.last_evaluation
        assert final is not None
        self.solutions = final.to_dict(self.evaluator.regions)
        perturbed, perturbed_layout = None, None
        if self.evaluator.perturb:
            self.status(f"evaluating again with {self.evaluator.perturb}")
            self.robustness, perturbed, perturbed_layout = self.evaluator.robustness(
                self.model, self.leader, final_episodes, final
            )
        plots = []
        if self.plots:
            self.status(f"writing the route map, KL heatmap and overview into {self.plots_dir}")
            plots.append(
                route_map(
                    self.plots_dir / "routes.png",
                    final,
                    self.evaluator.regions,
                    self.env.features,
                    self.leader,
                    perturbed,
                    perturbed_layout,
                    (self.robustness or {}).get("blocked_cells"),
                    title=f"{self.config['algo']['name']} on {self.config['env']['name']}",
                )
            )
        if self.plots and self.diagnostics.last_matrix is not None:
            plots.append(
                kl_heatmap(
                    self.plots_dir / "pairwise_kl.png", self.diagnostics.last_matrix, self.leader
                )
            )
        if self.plots:
            plots.append(
                overview(
                    self.plots_dir / "finetune_overview.png",
                    self.logger.history,
                    self.steps_per_iteration,
                    title=f"{self.config['algo']['name']} on {self.config['env']['name']}",
                )
            )
            setpoint = kl_setpoint(self.plots_dir / "kl_setpoint.png", self.logger.history)
            if setpoint is not None:  # CPO: the couplings per follower
                plots.append(setpoint)
            plots += evaluation_behaviour_plots(
                self.config["env"],
                self.plots_dir,
                self.model,
                final.episodes,
                self.env.features,
                seed=self.seed,
                title=self.config["env"]["name"],
            )
        summary = {
            **self.summary(),
            "checkpoint": str(latest_checkpoint(self.checkpoint_dir)),
            "plots": [str(p) for p in plots],
        }
        self.logger.write_summary(self.run_dir / "summary.json", **summary)
        return {**summary, "scalars": self.logger.latest()}

    # ---------------------------------------------------------------- checkpoints

    def state_objects(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "algorithm": self.algorithm,
            "collector": self.collector_state,
            "finetune": _RunnerState(self),
        }

    def resume(self, path: str | os.PathLike[str]) -> Path:
        """:meth:`RunnerBase.resume`; envs that cannot be put back in their saved state
        (MuJoCo physics, see :func:`myriad.rl.collector.load_env_state_dict`) restart from a
        reset before the next rollout, which one line on stderr says."""
        source = super().resume(path)
        why = self.collector.env_not_restored
        if why is not None and self.role.is_writer:  # one note per launch
            print(
                f"myriad: note: the envs cannot be restored exactly ({why}): they restart from "
                "a reset",
                file=sys.stderr,
            )
        return source


class _RunnerState:
    """The runner's own state: the init report and the last KL matrix."""

    def __init__(self, runner: FinetuneRunner) -> None:
        self.runner = runner

    def state_dict(self) -> dict[str, Any]:
        r = self.runner
        matrix = r.diagnostics.last_matrix
        return {
            "init": r.init_report.to_dict() if r.init_report else None,
            "kl_matrix": matrix.clone() if matrix is not None else None,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        r = self.runner
        r.init_report = InitReport(**state["init"]) if state["init"] else None
        matrix = state["kl_matrix"]
        r.diagnostics.last_matrix = matrix.clone() if matrix is not None else None
