"""The K-Myriad pretraining runner: a population maximising the entropy of its state mixture.

Each iteration: collect ``T`` steps in every env, measure the rollout's k-NN entropies (collective,
individual, diversity) and coverage, let the objective update the population (PPO on the per-state
k-NN reward, or the importance-weighted estimator with a trust region), append the finished
episodes to the dataset, and log. The runner base owns the loop, checkpoints and resume.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch

from myriad.envs import RemoteEnvFactory, make
from myriad.pretrain.collaborators import (
    DatasetSink,
    MeasurementFactory,
    RunShape,
    SinkFactory,
    knn_measurement,
    recorder_sink,
)
from myriad.pretrain.objectives import build_objective
from myriad.rl.on_policy import (
    STAGE_RESUME_IGNORED_KEYS,
    OnPolicyRunner,
    population_setup,
    runner_settings,
)
from myriad.rl.ppo import PPO, ppo_config
from myriad.rl.roles import ProcessRole, SingleProcess
from myriad.utils.faults import fault_point
from myriad.utils.loggers import LogBackend
from myriad.utils.seeding import make_generator, stream_seed
from myriad.viz.pretrain_plots import coverage_map, entropy_curves
from myriad.viz.runs import TrainingVideos, run_behaviour_plots


class PretrainRunner(OnPolicyRunner):
    """K-Myriad pretraining from a resolved config (see ``configs/pretrain.yaml``).

    Args:
        cfg: the resolved config as a mapping.
        run_dir: the run folder.
        role: how this process takes part in the run (:mod:`myriad.rl.roles`). On a rank of a
            ``torchrun`` launch every rank holds the whole population and steps its members'
            envs; the k-NN measurement reads every rank's features, the update averages the
            gradients over the ranks, and the writer alone records the dataset (every rank's
            rows, in the order of one process), evaluates and writes the run folder.
        remote_envs: builds the envs of a config with a ``distributed`` entry (the command
            layer's choice; :func:`~myriad.envs.registry.make_from_config`).
        log_backends: trackers of the caller's own that the run's scalars also go to
            (:class:`~myriad.utils.loggers.LogBackend`), beside the config's ``logger``.
        dataset_sink: builds the writer's sink of the dataset rows when ``dataset.enabled``
            (default: the run's HDF5 dataset; :mod:`myriad.pretrain.collaborators`).
        measurement: builds the rollouts' k-NN measurement and coverage (default: the
            objective's settings).
    """

    RESUME_IGNORED_KEYS: ClassVar[tuple[str, ...]] = (
        *OnPolicyRunner.RESUME_IGNORED_KEYS,
        *STAGE_RESUME_IGNORED_KEYS,
    )
    #: torchrun runs wrote this name before ranks became a role of this runner.
    CHECKPOINT_NAMES: ClassVar[tuple[str, ...]] = ("ShardedPretrainRunner",)

    def __init__(
        self,
        cfg: Mapping[str, Any],
        run_dir: str | os.PathLike[str],
        role: ProcessRole | None = None,
        remote_envs: RemoteEnvFactory | None = None,
        dataset_sink: SinkFactory = recorder_sink,
        measurement: MeasurementFactory = knn_measurement,
        log_backends: Sequence[LogBackend] = (),
    ) -> None:
        role = role if role is not None else SingleProcess()
        obj_cfg = cfg["objective"]
        setup = population_setup(
            cfg, role.env_shard, min_states=int(obj_cfg["k"]), remote_envs=remote_envs
        )
        cfg = setup.config
        # The member of every env of the run [E]; this process steps the envs `setup.envs`.
        self.member = setup.member
        super().__init__(
            setup.env,
            setup.model,
            PPO(setup.model, ppo_config(cfg)),
            cfg,
            run_dir,
            num_steps=int(cfg["num_steps"]),
            seed=setup.env_seed,
            member=setup.member[setup.envs],
            store_transitions=True,
            desync=bool(cfg.get("desync_episodes", True)),
            role=role,
            log_backends=log_backends,
            **runner_settings(cfg),
        )
        self.num_members = self.model.num_members
        shape = RunShape(cfg, self.run_dir, self.env, len(self.member), self.num_members)
        measures = measurement(shape)
        self.measure = role.measurement(measures.entropy, setup.envs)
        self.objective = build_objective(obj_cfg, self.model, self.algorithm)
        # At beta = 1 neither objective reads the per-member neighbours before the update ends,
        # so on CPU their search overlaps the update (docs/pretrain.md, k-NN share).
        self.measure.defer_members = float(obj_cfg["beta"]) == 1.0
        # Coverage of each rollout and of everything visited so far (None: not measured).
        self.coverage = measures.coverage
        #: Whether the run records a dataset (the writer's :attr:`dataset`; every process sends
        #: its rows).
        self.records_dataset = bool(cfg["dataset"]["enabled"])
        self.dataset: DatasetSink | None = (
            dataset_sink(shape) if self.records_dataset and role.is_writer else None
        )
        # None unless video.every; the writer alone records.
        self.videos = TrainingVideos.from_config(cfg, self.run_dir) if role.is_writer else None
        # Seeded alike, the replicas start equal; on ranks the role makes sure of it (GPU
        # inits) and keeps them so (each rank learns from its own envs' rows).
        role.prepare(self.model, self.algorithm, "envs")

    # -- dataset ---------------------------------------------------------------------------
    def _rollout_rows(self) -> dict[str, torch.Tensor]:
        """This rollout's transitions, ``[T, E, ...]`` per dataset column."""
        s = self.storage
        t, e = s.num_steps, s.num_envs
        return {
            "observations": s.obs,
            "next_observations": s.extras["next_obs"],
            "actions": s.actions,
            "rewards": s.rewards,
            "terminals": s.terminated,
            "timeouts": s.truncated,
            "member": self.collector.member.expand(t, e).to(torch.int32),
            "features": s.extras["state_features"],
        }

    # -- one iteration ---------------------------------------------------------------------
    @property
    def steps_per_iteration(self) -> int:
        return self.storage.num_steps * len(self.member)

    def iteration(self) -> dict[str, float]:
        t0 = time.perf_counter()
        self.collector.collect(self.storage)
        t_collect = time.perf_counter() - t0

        stored = self.storage.features
        assert stored is not None  # pretraining's storage keeps the entropy features
        features = self.role.all_gather(stored)  # [T, E, p] states reached
        if not torch.isfinite(features).all():
            raise FloatingPointError(
                f"env {self.env.name} returned non-finite entropy features; check the env "
                "(unstable simulation?) before pretraining on it"
            )
        t1 = time.perf_counter()
        measurement = self.measure(features)
        t_knn = time.perf_counter() - t1
        stats = self.objective.update(self.storage, measurement)
        t2 = time.perf_counter()
        t_update = t2 - t1 - t_knn
        # A deferred per-member search still running when the update ends is k-NN time.
        scalars: dict[str, float] = {f"train/{k}": v for k, v in stats.items()}
        scalars.update(measurement.scalars())
        t_knn += time.perf_counter() - t2
        if self.coverage is not None:
            scalars.update(self.coverage.update(features, self.member))
        scalars.update(self._pairwise_kl())
        if self.records_dataset:
            rows = self.role.gather_rows(self._rollout_rows())
            if self.dataset is not None:
                self.dataset.record(rows)
        total = time.perf_counter() - t0
        scalars["perf/knn_share"] = t_knn / total
        scalars["perf/collect_share"] = t_collect / total
        scalars["perf/update_share"] = t_update / total
        scalars.update(self.collector.episodes.summary())
        if self.videos is not None and self.videos.due(self.iteration_count + 1):
            # At this iteration's env steps, the scalars' x axis; backends that show videos
            # (W&B) get the file.
            done = self.env_steps + self.steps_per_iteration
            video = self.videos.record(self.model, self.iteration_count + 1, done)
            self.logger.log_video("videos/population", video, self.iteration_count + 1, done)
        return scalars

    @torch.no_grad()
    def _pairwise_kl(self, max_states: int = 2048) -> dict[str, float]:
        """Mean KL between members' action distributions on a shared sample of visited states."""
        if self.num_members < 2:
            return {}
        obs = self.storage.obs.reshape(-1, self.env.obs_dim)
        idx = torch.linspace(0, len(obs) - 1, min(max_states, len(obs)), device=obs.device).long()
        kl = self.model.pairwise_kl(self.role.all_gather(obs[idx], dim=0))
        m = self.num_members
        off = kl[~torch.eye(m, dtype=torch.bool, device=kl.device)]
        return {
            "diversity/pairwise_kl_mean": float(off.mean()),
            "diversity/pairwise_kl_min": float(off.min()),
        }

    # -- state and results -----------------------------------------------------------------
    def state_objects(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "algorithm": self.algorithm,
            "collector": self.collector_state,
            "objective": self.objective,
            "measure": self.measure,
            **({"progress": self.coverage} if self.coverage is not None else {}),
            **({"dataset": _DatasetState(self)} if self.dataset is not None else {}),
        }

    def resume(self, path: str | os.PathLike[str]) -> Path:
        """:meth:`RunnerBase.resume`; when the envs could not be put back in their saved state
        (remote workers of an env whose simulator state is not in tensors, a changed worker
        layout), says so on stderr and ends the dataset's unfinished episodes as truncations:
        the envs restart from a reset, and no saved episode is continued by another."""
        source = super().resume(path)
        why = self.collector.env_not_restored
        if why is not None:
            cut = self.dataset.cut_episodes() if self.dataset is not None else 0
        if why is not None and self.role.is_writer:  # one note per launch
            print(
                f"myriad: note: the envs cannot be restored exactly ({why}): they restart from "
                f"a reset, and the dataset's {cut} unfinished episodes end as truncated at the "
                "checkpoint",
                file=sys.stderr,
            )
        return source

    @torch.no_grad()
    def evaluate(self, episodes: int = 1) -> dict[str, Any]:
        """Run the final population for ``episodes`` full episodes in a fresh copy of the env;
        returns the visited features, members, coverage and entropies, and writes the plots.
        The writer evaluates alone (the replicas are equal); {} elsewhere."""
        if not self.role.is_writer:
            return {}
        cfg = self.config
        env = make(
            cfg["env"]["name"],
            len(self.member),
            self.env.device,
            **dict(cfg["env"].get("options") or {}),
        )
        self.status(
            f"final evaluation: {episodes} episode(s) in each of {len(self.member):,} envs "
            f"({episodes * env.max_episode_steps} steps), entropy and coverage"
        )
        seed = stream_seed(int(cfg["seed"]), "evaluation")  # never the training envs' episodes
        gen = make_generator(seed, env.device)
        obs = env.reset(seed=seed)
        feats, members = [], []
        for _ in range(episodes * env.max_episode_steps):
            out = self.model.act(obs, self.member, gen, blocked=True)  # block_members layout
            obs, _, _, _, info = env.step(out.actions)
            feats.append(info["features"])
            members.append(self.member)
        env.close()
        features = torch.stack(feats)
        member = torch.stack(members)
        spec = self.env.features
        flat = features.reshape(-1, spec.dim)
        result: dict[str, Any] = {}
        if self.coverage is not None:
            cov = self.coverage.coverage(flat, member.reshape(-1))
            result["eval_coverage_union"] = float(cov.union)
            result["eval_coverage_per_member"] = [float(c) for c in cov.per_group.tolist()]
        measurement = self.measure.evaluate(features)
        result.update({f"eval_{k.replace('/', '_')}": v for k, v in measurement.scalars().items()})
        if not self.plots:
            return result
        self.status(f"writing the coverage map and behaviour plots into {self.plots_dir}")
        spec = spec.with_data_bounds(flat)  # plots need bounds: the data's where the env has none
        layout = self.env.layout
        coverage_map(
            self.plots_dir / "coverage_map.png",
            features.reshape(-1, spec.dim).cpu().numpy(),
            member.reshape(-1).cpu().numpy(),
            spec,
            walls=layout.walls_xy() if layout is not None else None,
            coverage=result.get("eval_coverage_per_member"),
            union_coverage=result.get("eval_coverage_union"),
            title=(
                f"{cfg['env']['name']}: {self.num_members} members, beta={cfg['objective']['beta']}"
            ),
        )
        entropy_curves(
            self.plots_dir / "entropy_coverage.png", self.logger.history, self.steps_per_iteration
        )
        run_behaviour_plots(
            cfg["env"], self.plots_dir, features, member, spec, self.num_members, cfg["env"]["name"]
        )
        return result

    def finish(self) -> dict[str, Any]:
        """Close the dataset, evaluate, write plots and ``summary.json``; returns the writer's
        summary (on every process)."""
        if self.dataset is not None and self.dataset.path is not None:
            self.status(f"closing the dataset {self.dataset.path}")
        dataset = self.dataset.finish(self.iteration_count) if self.dataset is not None else None
        fault_point("run.dataset_finished")
        result = self.evaluate(int(self.config["eval"]["episodes"]))
        summary = {**self.summary(), **self.logger.latest(), **result}
        summary["dataset"] = str(dataset) if dataset else None
        summary["checkpoint"] = str(self.save_checkpoint())
        summary["plots"] = str(self.plots_dir) if self.plots else None
        self.logger.write_summary(self.run_dir / "summary.json", **summary)
        return self.role.broadcast(summary)

    def close(self) -> None:
        """Release files; an unfinished dataset stays as its ``.partial`` file for resume."""
        if self.dataset is not None:
            self.dataset.close()
        if self.videos is not None:
            self.videos.close()
        super().close()


class _DatasetState:
    """Checkpoint adapter of the run's :class:`~myriad.pretrain.collaborators.DatasetSink`: its
    state depends on the iteration the checkpoint was taken at, which the runner restores
    first."""

    def __init__(self, runner: PretrainRunner) -> None:
        self.runner = runner

    def state_dict(self) -> dict[str, Any]:
        return self._recorder().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._recorder().load_state_dict(state, self.runner.iteration_count)

    def _recorder(self) -> DatasetSink:
        recorder = self.runner.dataset
        assert recorder is not None  # the runner checkpoints this adapter only with a recorder
        return recorder
