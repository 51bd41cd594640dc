"""A VecEnv whose environments run in Ray actors (the DETACH pattern: envs apart from learner).

The ``E`` environments are split into ``W`` contiguous shards (:func:`split_envs`); shard ``w``
lives in one Ray actor (:class:`myriad.distributed.worker.EnvWorker`) that builds the env by
registry name, so any registered VecEnv runs remotely. ``step`` sends every shard its actions at
once and gathers the results; the learner computes the actions (central inference). For
worker-side inference with adaptive policy synchronisation, see
:class:`myriad.distributed.APSCollector`, which drives the same actors.

Seeding: ``reset(seed)`` resets shard ``w`` with :func:`shard_seed(seed, w) <shard_seed>`, so a
remote env and the same shards built locally with :func:`myriad.envs.make` produce the same
trajectories for the same actions.

Failures: every call is bounded by ``timeout_s`` (:class:`WorkerTimeoutError` names the silent
workers). An exception inside a worker surfaces as Ray's ``RayTaskError`` carrying the worker's
traceback. A worker process that dies is restarted by Ray (``max_restarts``); the env re-seeds it
with ``shard_seed(seed, w, restarts)`` and reports the step that was lost as a truncation of that
shard's episodes (``info["restarted"]``), counted in :attr:`RemoteVecEnv.stats` as interrupted,
not as a step.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from myriad.distributed.config import DistributedConfig, RayConfig, init_ray, load_config
from myriad.distributed.shards import shard_seed, split_envs
from myriad.distributed.worker import EnvWorker, WorkerStateLost
from myriad.envs.base import StepResult, VecEnv, validate_actions
from myriad.utils.optional import require
from myriad.utils.tensors import resolve_device

if TYPE_CHECKING:
    from myriad.envs.gymnasium import VecEnvToGymnasium


class WorkerError(RuntimeError):
    """A remote worker could not do what was asked (lost for good, or too slow)."""


class WorkerLostError(WorkerError):
    """A worker died and could not be restarted (``max_restarts`` used up, or no restart came)."""


class WorkerTimeoutError(WorkerError, TimeoutError):
    """A worker gave no answer within ``timeout_s``."""


@dataclass
class RemoteStats:
    """Learner-side counters, one entry per shard.

    Attributes:
        steps: vector steps whose results a worker returned (each covers the shard's envs).
        interrupted_steps: steps lost because the worker died during them; reported to the
            caller as truncations (``info["restarted"]``), never as env steps.
        restarts: times the worker was found dead and brought back.
    """

    steps: list[int] = field(default_factory=list)
    interrupted_steps: list[int] = field(default_factory=list)
    restarts: list[int] = field(default_factory=list)


@dataclass
class ShardFailure:
    """What :meth:`RemoteVecEnv.gather` returns for a shard whose actor died during the call
    (pass it to :meth:`RemoteVecEnv.recover`)."""

    error: BaseException


def _ray() -> Any:
    return require("ray", extra="ray")


class RemoteVecEnv(VecEnv):
    """``num_envs`` environments of a registered kind, run in ``num_workers`` Ray actors.

    Ray is started on this machine (``ray.init(num_cpus=..., include_dashboard=False)``) if the
    process is not connected yet; pass ``ray_config`` (or use :meth:`from_config` with the
    ``cluster`` preset) to join a cluster instead.

    Args:
        env: registered environment name (see :func:`myriad.envs.names`).
        num_envs: total number of environments ``E``.
        num_workers: number of actors ``W`` (``W <= E``).
        device: torch device of every tensor this env returns (the learner's device).
        env_options: options for :func:`myriad.envs.make`, applied in every worker.
        worker_device: torch device of the envs inside the workers.
        cpus_per_worker, gpus_per_worker: Ray resources reserved per actor.
        max_restarts: restarts Ray grants each actor.
        timeout_s: bound on every remote call.
        ray_config: how to start or join Ray when not yet connected.
        validate: check actions before sending them (shape, device, NaN).

    Attributes:
        actors: the Ray actor handles, one per shard.
        slices: the env range of each shard.
        stats: :class:`RemoteStats`.
    """

    def __init__(
        self,
        env: str,
        num_envs: int,
        num_workers: int = 2,
        device: torch.device | str = "cpu",
        *,
        env_options: Mapping[str, Any] | None = None,
        worker_device: str = "cpu",
        cpus_per_worker: float = 1.0,
        gpus_per_worker: float = 0.0,
        max_restarts: int = 3,
        timeout_s: float = 120.0,
        ray_config: RayConfig | None = None,
        validate: bool = True,
    ) -> None:
        ray = _ray()
        init_ray(ray_config)
        self.slices = split_envs(int(num_envs), int(num_workers))
        self.num_envs = int(num_envs)
        self.num_workers = len(self.slices)
        self.device = resolve_device(device)
        self.name = env
        self.env_options = dict(env_options or {})
        self.max_restarts = int(max_restarts)
        self.timeout_s = float(timeout_s)
        self.validate = validate
        self.stats = RemoteStats(
            [0] * self.num_workers, [0] * self.num_workers, [0] * self.num_workers
        )
        self._restart_hooks: dict[str, Callable[[int], None]] = {}
        self._pending: list[Any] | None = None
        self._closed = False

        actor_cls = ray.remote(
            num_cpus=cpus_per_worker,
            num_gpus=gpus_per_worker,
            max_restarts=self.max_restarts,
            # A retried task would run on a fresh, un-reset env: recovery is done here instead.
            max_task_retries=0,
        )(EnvWorker)
        threads = max(1, int(cpus_per_worker))
        self.actors = [
            actor_cls.remote(env, sl.stop - sl.start, self.env_options, worker_device, w, threads)
            for w, sl in enumerate(self.slices)
        ]
        try:
            self.gather([a.ready.remote() for a in self.actors], "start", recover=False)
            spec = self.gather([self.actors[0].spec.remote()], "spec", recover=False)[0]
        except BaseException:
            self.close()
            raise
        self.single_observation_space = spec["single_observation_space"]
        self.single_action_space = spec["single_action_space"]
        self.features = spec["features"]
        self.max_episode_steps = int(spec["max_episode_steps"])

        e, o, p = self.num_envs, self.obs_dim, self.features.dim
        self._base_seed: int | None = None
        self._last_obs = np.zeros((e, o), dtype=np.float32)
        self._cur_features = np.zeros((e, p), dtype=np.float32)
        self._ep_return = np.zeros(e, dtype=np.float32)
        self._ep_length = np.zeros(e, dtype=np.int64)
        self._info_template: dict[str, tuple[tuple[int, ...], np.dtype]] = {}

    @classmethod
    def from_config(
        cls,
        env: str,
        num_envs: int,
        config: DistributedConfig | str | Mapping[str, Any] = "local",
        device: torch.device | str = "cpu",
        env_options: Mapping[str, Any] | None = None,
    ) -> RemoteVecEnv:
        """Build from a :class:`DistributedConfig`, a preset name (``"local"``, ``"cluster"``),
        a YAML path or a mapping."""
        cfg = config if isinstance(config, DistributedConfig) else load_config(config)
        w = cfg.workers
        return cls(
            env,
            num_envs,
            w.num_workers,
            device,
            env_options=env_options,
            worker_device=w.device,
            cpus_per_worker=w.cpus_per_worker,
            gpus_per_worker=w.gpus_per_worker,
            max_restarts=w.max_restarts,
            timeout_s=w.timeout_s,
            ray_config=cfg.ray,
        )

    @property
    def reset_seed(self) -> int | None:
        """The seed of the last :meth:`reset` (None before the first)."""
        return self._base_seed

    # -- remote calls ---------------------------------------------------------------------------
    def gather(self, refs: list[Any], op: str, recover: bool = True) -> list[Any]:
        """Results of one call per shard, waiting at most ``timeout_s``.

        A shard whose actor died, or whose restarted process received a call meant for the
        previous one, yields :class:`ShardFailure` (when ``recover``) for the caller to handle; any
        other exception raised inside a worker propagates as ``RayTaskError``.
        """
        ray = _ray()
        _, pending = ray.wait(list(refs), num_returns=len(refs), timeout=self.timeout_s)
        if pending:
            waiting = {ref.hex() for ref in pending}
            slow = [w for w, ref in enumerate(refs) if ref.hex() in waiting]
            raise WorkerTimeoutError(
                f"{op}: worker(s) {slow} of env {self.name!r} gave no answer within "
                f"{self.timeout_s:g} s (raise timeout_s for slow envs or long rollouts)"
            )
        out: list[Any] = []
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=self.timeout_s))
            except ray.exceptions.RayActorError as err:
                if not recover or getattr(err, "actor_init_failed", False):
                    raise
                out.append(ShardFailure(err))
            except WorkerStateLost as err:  # Ray re-raises it as RayTaskError(WorkerStateLost)
                if not recover:
                    raise
                out.append(ShardFailure(err))
        return out

    def call(self, worker: int, method: str, *args: Any) -> Any:
        """Call ``method(*args)`` on one worker and wait (bounded) for the answer."""
        ref = getattr(self.actors[worker], method).remote(*args)
        return self.gather([ref], method, recover=False)[0]

    def set_restart_hook(self, key: str, hook: Callable[[int], None]) -> None:
        """Run ``hook(worker)`` after a worker has been restarted and re-seeded.

        One hook per ``key``: a new collector on the same env replaces the previous one's.
        """
        self._restart_hooks[key] = hook

    def recover(self, worker: int, cause: BaseException, seed: int | None = None) -> Any:
        """Bring back a worker whose actor died: wait for Ray's restart, re-seed, run hooks.

        Args:
            worker: the shard index.
            cause: the error that showed the actor had died.
            seed: reset seed for the restarted shard (default ``shard_seed(seed, w, restarts)``
                for the last reset seed).

        Returns:
            ``(obs [n, O], features [n, p])`` of the re-seeded shard, NumPy.

        Raises:
            WorkerLostError: restarts used up, or the actor did not come back in ``timeout_s``.
        """
        ray = _ray()
        self.stats.restarts[worker] += 1
        count = self.stats.restarts[worker]
        if count > self.max_restarts:
            raise WorkerLostError(
                f"worker {worker} of env {self.name!r} died {count} times; max_restarts="
                f"{self.max_restarts} used up"
            ) from cause
        if seed is None:
            if self._base_seed is None:
                raise WorkerLostError(f"worker {worker} died before the first reset") from cause
            seed = shard_seed(self._base_seed, worker, count)
        deadline = time.monotonic() + self.timeout_s
        while True:
            ref = self.actors[worker].reset.remote(seed)
            try:
                obs, features = ray.get(ref, timeout=max(deadline - time.monotonic(), 0.01))
                break
            except ray.exceptions.GetTimeoutError as err:
                raise WorkerTimeoutError(
                    f"worker {worker} was not back from its restart within {self.timeout_s:g} s"
                ) from err
            except ray.exceptions.RayActorError as err:
                # Calls sent while Ray restarts the actor can fail too; retry until the deadline.
                if getattr(err, "actor_init_failed", False):
                    raise
                if time.monotonic() > deadline:
                    raise WorkerLostError(
                        f"worker {worker} of env {self.name!r} did not come back after dying "
                        f"(restart {count} of {self.max_restarts})"
                    ) from err
                time.sleep(0.1)
        sl = self.slices[worker]
        self._last_obs[sl] = obs
        self._cur_features[sl] = features
        self._ep_return[sl] = 0.0
        self._ep_length[sl] = 0
        for hook in self._restart_hooks.values():
            hook(worker)
        return obs, features

    # -- VecEnv -------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset every shard, shard ``w`` with ``shard_seed(seed, w)``; returns ``obs [E, O]``.

        ``seed=None`` draws one from torch's global generator, so ``seed_everything`` makes the
        run reproducible.
        """
        self._check_open()
        if seed is None:
            seed = int(torch.randint(0, 2**62, (1,)).item())
        self._base_seed = int(seed)
        self._pending = None
        seeds = [shard_seed(self._base_seed, w) for w in range(self.num_workers)]
        results = self.gather([a.reset.remote(s) for a, s in zip(self.actors, seeds)], "reset")
        for w, res in enumerate(results):
            if isinstance(res, ShardFailure):
                res = self.recover(w, res.error, seed=seeds[w])
            obs, features = res
            self._last_obs[self.slices[w]] = obs
            self._cur_features[self.slices[w]] = features
        self._ep_return[:] = 0.0
        self._ep_length[:] = 0
        return self._tensor(self._last_obs.copy())

    def step_async(self, actions: torch.Tensor) -> None:
        """Send ``actions [E, A]`` to every shard without waiting; finish with :meth:`step_wait`."""
        self._check_open()
        if self._base_seed is None:
            raise RuntimeError("call reset(seed) before step")
        if self._pending is not None:
            raise RuntimeError("step_async called twice without step_wait")
        if self.validate:
            actions = validate_actions(actions, self.num_envs, self.action_dim, self.device)
        act = actions.detach().to("cpu", torch.float32).numpy()
        self._pending = [
            a.step.remote(np.ascontiguousarray(act[sl])) for a, sl in zip(self.actors, self.slices)
        ]

    def step_wait(self) -> StepResult:
        """Gather the step sent by :meth:`step_async`; see the module docstring on failures."""
        if self._pending is None:
            raise RuntimeError("step_wait called without step_async")
        refs, self._pending = self._pending, None
        results = self.gather(refs, "step")
        restarted = np.zeros(self.num_envs, dtype=bool)
        for w, res in enumerate(results):
            if isinstance(res, ShardFailure):
                part = self._interrupted(w)  # before recover() clears the shard's episode
                part["obs"], part["current_features"] = self.recover(w, res.error)
                results[w] = part
                restarted[self.slices[w]] = True
                self.stats.interrupted_steps[w] += 1
            else:
                self.stats.steps[w] += 1
        return self._assemble(results, restarted)

    def step(self, actions: torch.Tensor) -> StepResult:
        """Step every shard with its slice of ``actions [E, A]``, in parallel."""
        self.step_async(actions)
        return self.step_wait()

    def current_features(self) -> torch.Tensor:
        """Features of the current states ``[E, p]`` (kept from the last step; no remote call)."""
        if self._base_seed is None:
            raise RuntimeError("call reset(seed) before current_features")
        return self._tensor(self._cur_features.copy())

    def close(self) -> None:
        """Kill the worker actors (without restart). Ray itself keeps running."""
        if self._closed:
            return
        self._closed = True
        ray = _ray()
        for actor in getattr(self, "actors", []):
            # An actor that is already gone has nothing left to release.
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)

    # -- checkpoints ----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Every shard's state (:meth:`EnvWorker.get_state`), the reset seed and the
        learner-side episode counters, so that :meth:`load_state_dict` continues every episode
        exactly.

        ``exact`` is False when a shard's env keeps simulator state outside its tensors (MuJoCo
        physics, a wrapped Gymnasium env): such a checkpoint restores the counters only.
        """
        self._check_open()
        if self._base_seed is None:
            return {"exact": False, "reset": False}
        shards = self.gather([a.get_state.remote() for a in self.actors], "get_state", False)
        return {
            "exact": all(bool(sh["env"].get("exact", False)) for sh in shards),
            "reset": True,
            "sizes": [sl.stop - sl.start for sl in self.slices],
            "shards": shards,
            "base_seed": self._base_seed,
            "last_obs": torch.from_numpy(self._last_obs.copy()),
            "features": torch.from_numpy(self._cur_features.copy()),
            "episode_return": torch.from_numpy(self._ep_return.copy()),
            "episode_length": torch.from_numpy(self._ep_length.copy()),
        }

    def load_state_dict(self, state: dict[str, Any]) -> str | None:
        """Put every shard back in the state of :meth:`state_dict`.

        Returns:
            None when done exactly; otherwise why it cannot be (the env keeps state outside its
            tensors, or the checkpoint's shards differ from these workers'), with nothing
            changed: reset the env before stepping it (see
            :func:`myriad.rl.collector.load_env_state_dict`).
        """
        self._check_open()
        if not state.get("reset", False):
            return "the checkpoint was taken before the first reset"
        if not state["exact"]:
            return f"the env {self.name!r} keeps simulator state outside its tensors"
        sizes = [sl.stop - sl.start for sl in self.slices]
        if list(state["sizes"]) != sizes:
            return f"the checkpoint's shards have {list(state['sizes'])} envs, these {sizes}"
        refs = [a.set_state.remote(sh) for a, sh in zip(self.actors, state["shards"])]
        self.gather(refs, "set_state", recover=False)
        self._pending = None
        # The restart counts (and max_restarts) start afresh: these are new worker processes.
        self._base_seed = int(state["base_seed"])
        self._last_obs = state["last_obs"].numpy().copy()
        self._cur_features = state["features"].numpy().copy()
        self._ep_return = state["episode_return"].numpy().copy()
        self._ep_length = state["episode_length"].numpy().copy()
        return None

    def as_gymnasium(self) -> VecEnvToGymnasium:
        """This env as a ``gymnasium.vector.VectorEnv`` (NumPy in and out, same-step reset)."""
        from myriad.envs.gymnasium import VecEnvToGymnasium

        return VecEnvToGymnasium(self)

    def worker_counters(self) -> list[dict[str, int]]:
        """What each worker process reports it did since it (re)started; see
        :meth:`EnvWorker.counters`."""
        return self.gather([a.counters.remote() for a in self.actors], "counters", recover=False)

    # -- assembly -------------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this RemoteVecEnv is closed")

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device)

    def _interrupted(self, w: int) -> dict[str, Any]:
        """The step result of a shard whose step was lost: its episodes end by truncation at the
        last state the learner saw; the caller adds the restarted shard's fresh ``obs`` and
        ``current_features``."""
        sl = self.slices[w]
        n = sl.stop - sl.start
        info = {
            "final_obs": self._last_obs[sl].copy(),
            "features": self._cur_features[sl].copy(),
            "done": np.ones(n, dtype=bool),
            "episode_return": self._ep_return[sl].copy(),
            "episode_length": self._ep_length[sl].copy(),
        }
        for key, (tail, dtype) in self._info_template.items():
            if key not in info:
                info[key] = np.zeros((n, *tail), dtype=dtype)
        return {
            "reward": np.zeros(n, dtype=np.float32),
            "terminated": np.zeros(n, dtype=bool),
            "truncated": np.ones(n, dtype=bool),
            "info": info,
            "info_other": {},
            "interrupted": True,
        }

    def _assemble(self, parts: list[dict[str, Any]], restarted: np.ndarray) -> StepResult:
        live = [p for p in parts if not p.get("interrupted")]
        if live:
            self._info_template = {k: (v.shape[1:], v.dtype) for k, v in live[0]["info"].items()}
        obs = np.concatenate([p["obs"] for p in parts])
        reward = np.concatenate([p["reward"] for p in parts]).astype(np.float32, copy=False)
        terminated = np.concatenate([p["terminated"] for p in parts])
        truncated = np.concatenate([p["truncated"] for p in parts])
        info_np = {
            key: np.concatenate([p["info"][key] for p in parts])
            for key in parts[0]["info"]
            if all(key in p["info"] for p in parts)
        }
        done = info_np["done"]

        live_envs = ~restarted
        self._ep_return[live_envs] += reward[live_envs]
        self._ep_length[live_envs] += 1
        self._ep_return[done] = 0.0
        self._ep_length[done] = 0
        self._last_obs = obs
        self._cur_features = np.concatenate([p["current_features"] for p in parts])

        info: dict[str, Any] = {k: self._tensor(v) for k, v in info_np.items()}
        info["restarted"] = self._tensor(restarted)
        other_keys = {k for p in parts for k in p["info_other"]}
        for key in sorted(other_keys):
            info[key] = [p["info_other"].get(key) for p in parts]
        return (
            self._tensor(obs.copy()),
            self._tensor(reward),
            self._tensor(terminated),
            self._tensor(truncated),
            info,
        )


def make_remote(
    env: str,
    num_envs: int,
    device: torch.device | str = "cpu",
    config: DistributedConfig | str | Mapping[str, Any] = "local",
    **env_options: Any,
) -> RemoteVecEnv:
    """``RemoteVecEnv.from_config(env, num_envs, config, device, env_options)``."""
    return RemoteVecEnv.from_config(env, num_envs, config, device, env_options)
