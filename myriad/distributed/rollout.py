"""Worker-side inference with adaptive policy synchronisation (APS, docs/algorithms.md §9).

Each worker of a :class:`~myriad.distributed.RemoteVecEnv` holds a copy of the policy, acts for
``T`` steps and returns a batch with the behaviour distribution parameters and log-probabilities.
After each update of the learner's policy, :meth:`APSCollector.publish` measures on each worker's
own states the drift ``D_w = mean KL(pi_{v_w} || pi_v)`` and sends the new weights only to the
workers with ``D_w > delta`` (one ``ray.put`` per version; the workers get the object ref).
Training uses the behaviour log-probabilities in :class:`RolloutBatch`, so batches collected by
stale workers remain correct importance-sampling data.

Typical loop::

    env = RemoteVecEnv("nav-maze", num_envs=1024, num_workers=8)
    collector = APSCollector(env, policy, horizon=64, delta=0.05, seed=0)
    for it in range(iterations):
        batch = collector.collect()        # [T, E] tensors on the learner's device
        train(policy, batch)               # uses batch.log_prob as the old log-probabilities
        collector.publish()                # policy changed: version += 1, APS decides per worker
    print(collector.stats())
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from myriad.distributed.aps import AdaptiveSync, mean_policy_kl
from myriad.distributed.config import DistributedConfig, load_config
from myriad.distributed.policy import ParamsPolicy, as_dist_params, dist_kind
from myriad.distributed.remote import RemoteVecEnv, ShardFailure, _ray


class Critic(Protocol):
    """What :meth:`RolloutBatch.fill_storage` needs from the learner's model (a
    :class:`myriad.nn.PopulationActorCritic`, for instance)."""

    def value(self, obs: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
        """Each row's member's value estimate, ``[N]``."""
        ...


@dataclass
class RolloutBatch:
    """One collection from every worker, concatenated in env order (shard 0 first).

    Shapes: ``T`` steps, ``E`` envs, ``O`` observation, ``A`` action, ``p`` features.

    Attributes:
        obs: ``[T, E, O]`` states the actions were taken in.
        actions: ``[T, E, A]`` float (Gaussian, unclipped samples) or ``[T, E]`` long.
        log_prob: ``[T, E]`` behaviour log-probabilities of ``actions``.
        params: behaviour distribution, ``{"mean", "log_std"}: [T, E, A]`` or
            ``{"logits": [T, E, K]}``.
        reward, terminated, truncated, done: ``[T, E]``.
        final_obs: ``[T, E, O]`` observation reached by each step before any reset.
        features: ``[T, E, p]`` features of the state reached by each step (before reset).
        episode_return, episode_length: ``[T, E]``, nonzero where an episode ended.
        next_obs: ``[E, O]`` states after the last step (bootstrap).
        next_features: ``[E, p]`` their features.
        member: ``[E]`` member acting in each env.
        version: ``[E]`` policy version that acted in each env.
        restarted: ``[E]`` True for envs of a worker that was restarted for this batch (its
            previous episodes were cut; the batch starts from fresh resets).
        info: other per-env info entries, ``[T, E, ...]``.
        workers: per-worker metadata: ``worker``, ``version``, ``lag``, ``index`` (how many
            batches that worker had delivered before), ``restarted``.
    """

    obs: torch.Tensor
    actions: torch.Tensor
    log_prob: torch.Tensor
    params: dict[str, torch.Tensor]
    reward: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    done: torch.Tensor
    final_obs: torch.Tensor
    features: torch.Tensor
    episode_return: torch.Tensor
    episode_length: torch.Tensor
    next_obs: torch.Tensor
    next_features: torch.Tensor
    member: torch.Tensor
    version: torch.Tensor
    restarted: torch.Tensor
    info: dict[str, torch.Tensor] = field(default_factory=dict)
    workers: list[dict[str, Any]] = field(default_factory=list)

    @property
    def horizon(self) -> int:
        return int(self.obs.shape[0])

    @property
    def num_envs(self) -> int:
        return int(self.obs.shape[1])

    @torch.no_grad()
    def fill_storage(self, storage: Any, model: Critic) -> None:
        """Write this batch into a :class:`myriad.rl.RolloutStorage` for PPO.

        Log-probabilities and distribution parameters are the workers' (behaviour) ones;
        values, the truncation bootstraps ``V(final_obs)`` and ``last_values = V(next_obs)`` come
        from ``model``'s critic (``model.value(obs, member)``), which only the learner has.
        Gaussian policies only (the storage keeps float actions ``[T, E, A]``).
        """
        if "mean" not in self.params:
            raise TypeError("RolloutStorage holds Gaussian rollouts; this batch is categorical")
        t, e = self.horizon, self.num_envs
        rows = self.member.repeat(t)

        def value(obs: torch.Tensor) -> torch.Tensor:
            return model.value(obs.reshape(t * e, -1), rows).reshape(t, e)

        values, trunc_values = value(self.obs), value(self.final_obs)
        storage.clear()
        for i in range(t):
            storage.add(
                obs=self.obs[i],
                actions=self.actions[i],
                log_prob=self.log_prob[i],
                value=values[i],
                reward=self.reward[i],
                terminated=self.terminated[i],
                truncated=self.truncated[i],
                truncation_value=trunc_values[i],
                features=self.features[i],
                mean=self.params["mean"][i],
                log_std=self.params["log_std"][i],
            )
        storage.last_values.copy_(model.value(self.next_obs, self.member))


def state_dict_bytes(state: dict[str, torch.Tensor]) -> int:
    """Bytes of the tensors of a state dict (what one sync transfers)."""
    return sum(t.numel() * t.element_size() for t in state.values())


class APSCollector:
    """Worker-side inference over a :class:`RemoteVecEnv` with adaptive policy synchronisation.

    Args:
        env: the remote env whose workers will act.
        policy: the learner's policy (trained in place); any module with ``action_params`` and
            ``act`` (see :mod:`myriad.distributed.policy`). A copy with the current weights is
            sent to every worker now (version 0).
        horizon: steps ``T`` per batch.
        delta: APS threshold in nats (0: sync after every update).
        member: ``[E]`` member of each env (default: all 0).
        action_table: ``[K, A]`` env action of each discrete action (categorical policies).
        seed: reset seed of the env (None: keep the env's current states, which requires a
            prior ``env.reset``).
        kl_max_states: measure ``D_w`` on at most this many of the worker's states (evenly
            strided); None: all.
        max_lag: also sync workers this many versions behind (see :class:`AdaptiveSync`).
        sync: an :class:`AdaptiveSync` to use (default ``AdaptiveSync(delta, max_lag)``).

    Attributes:
        version: the learner's policy version ``v``.
        worker_version: the version each worker holds, ``v_w``.
        aps: the :class:`AdaptiveSync` (syncs, bytes, lag, KL at sync time).
        batches: batches delivered per worker; env_steps: env steps delivered in total.
    """

    def __init__(
        self,
        env: RemoteVecEnv,
        policy: nn.Module,
        horizon: int,
        delta: float = 0.0,
        *,
        member: torch.Tensor | None = None,
        action_table: torch.Tensor | None = None,
        seed: int | None = None,
        kl_max_states: int | None = None,
        max_lag: int | None = None,
        sync: AdaptiveSync | None = None,
    ) -> None:
        if horizon < 1:
            raise ValueError(f"horizon must be >= 1, got {horizon}")
        for name in ("action_params", "act"):
            if not callable(getattr(policy, name, None)):
                raise TypeError(
                    f"the policy must expose {name}(obs, member, ...); "
                    f"{type(policy).__name__} does not"
                )
        self.env = env
        self.policy = policy
        self.horizon = int(horizon)
        self.aps = sync if sync is not None else AdaptiveSync(delta, max_lag)
        self.kl_max_states = kl_max_states
        self.device = env.device
        if member is None:
            member = torch.zeros(env.num_envs, dtype=torch.long)
        member = torch.as_tensor(member, dtype=torch.long).cpu()
        if member.shape != (env.num_envs,):
            raise ValueError(f"member must have shape [{env.num_envs}], got {list(member.shape)}")
        self.member = member.to(self.device)
        self._member_np = member.numpy()
        self._table = None if action_table is None else torch.as_tensor(action_table).cpu().numpy()

        self.version = 0
        self.worker_version = [0] * env.num_workers
        self.batches = [0] * env.num_workers
        self.env_steps = 0
        self.restart_syncs = 0
        self._weights: tuple[int, Any, int] | None = None  # (version, object ref, bytes)
        self._pending: tuple[list[Any], int] | None = None  # in-flight rollouts and horizon
        # Per worker: the states of its latest batch and the parameters its policy has on them.
        self._probe: list[tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]] | None] = [
            None
        ] * env.num_workers

        ray = _ray()
        # One serialised copy of the module for every worker (and for restarts).
        self._module_ref = ray.put(copy.deepcopy(policy).cpu())
        refs = [self._set_policy_ref(w) for w in range(env.num_workers)]
        env.gather(refs, "set_policy", recover=False)
        env.set_restart_hook("policy", self._on_restart)
        if seed is not None:
            env.reset(seed)
        elif env.reset_seed is None:
            raise RuntimeError("reset the env first or pass seed= to APSCollector")

    @classmethod
    def from_config(
        cls,
        env: RemoteVecEnv,
        policy: nn.Module,
        config: DistributedConfig | str | Mapping[str, Any] = "local",
        **options: Any,
    ) -> APSCollector:
        """Build with the ``aps`` section of a config (preset name, YAML path or mapping);
        ``options`` (``member``, ``action_table``, ``seed``, ...) are passed through."""
        cfg = config if isinstance(config, DistributedConfig) else load_config(config)
        return cls(
            env,
            policy,
            cfg.aps.horizon,
            cfg.aps.delta,
            max_lag=cfg.aps.max_lag,
            kl_max_states=cfg.aps.kl_max_states,
            **options,
        )

    # -- weights ------------------------------------------------------------------------------
    def _set_policy_ref(self, w: int) -> Any:
        sl = self.env.slices[w]
        return self.env.actors[w].set_policy.remote(
            self._module_ref, 0, self._member_np[sl], self._table
        )

    def _weights_ref(self) -> tuple[Any, int]:
        """The current weights in Ray's object store: put once per version, shared by workers."""
        if self._weights is None or self._weights[0] != self.version:
            ray = _ray()
            state = {k: v.detach().to("cpu") for k, v in self.policy.state_dict().items()}
            self._weights = (self.version, ray.put(state), state_dict_bytes(state))
        return self._weights[1], self._weights[2]

    def _on_restart(self, w: int) -> None:
        """A restarted worker lost its policy copy: install it again at the current version."""
        env = self.env
        ref, nbytes = self._weights_ref()
        env.gather([self._set_policy_ref(w)], "set_policy", recover=False)
        env.call(w, "set_weights", ref, self.version)
        self.worker_version[w] = self.version
        self.restart_syncs += 1
        self.aps.record_bytes(w, nbytes)
        self._probe[w] = None

    # -- collection -----------------------------------------------------------------------------
    def collect(self) -> RolloutBatch:
        """One batch of ``horizon`` steps from every worker, gathered in parallel.

        A worker that dies during its rollout is restarted, re-seeded and given the current
        weights, and its rollout is redone; the lost attempt is never delivered, so no batch is
        counted twice or dropped.
        """
        self.collect_async()
        return self.collect_wait()

    def collect_async(self) -> None:
        """Start every worker's rollout without waiting; finish with :meth:`collect_wait`.

        The learner may train and :meth:`publish` meanwhile: new weights queue behind the
        running rollouts, and each batch reports the version that actually produced it.
        """
        if self._pending is not None:
            raise RuntimeError("collect_async called twice without collect_wait")
        refs = [a.rollout.remote(self.horizon) for a in self.env.actors]
        self._pending = (refs, self.horizon)

    def collect_wait(self) -> RolloutBatch:
        """Gather the rollouts started by :meth:`collect_async` (see :meth:`collect`)."""
        if self._pending is None:
            raise RuntimeError("collect_wait called without collect_async")
        env = self.env
        (refs, horizon), self._pending = self._pending, None
        results = env.gather(refs, "rollout")
        while any(isinstance(r, ShardFailure) for r in results):
            failed = [w for w, r in enumerate(results) if isinstance(r, ShardFailure)]
            for w in failed:
                env.recover(w, results[w].error)
            retry = env.gather([env.actors[w].rollout.remote(horizon) for w in failed], "rollout")
            for w, res in zip(failed, retry):
                if not isinstance(res, ShardFailure):
                    res["restarted"] = True
                results[w] = res
        return self._assemble(results)

    def _assemble(self, results: list[dict[str, Any]]) -> RolloutBatch:
        env = self.env
        dev = self.device

        def cat(key: str, axis: int = 1) -> torch.Tensor:
            return torch.from_numpy(np.concatenate([r[key] for r in results], axis=axis)).to(dev)

        meta = []
        versions = np.zeros(env.num_envs, dtype=np.int64)
        restarted = np.zeros(env.num_envs, dtype=bool)
        for w, res in enumerate(results):
            sl = env.slices[w]
            lag = self.version - int(res["version"])
            self.aps.record_lag(w, lag)
            versions[sl] = res["version"]
            restarted[sl] = bool(res.get("restarted", False))
            meta.append(
                {
                    "worker": w,
                    "version": int(res["version"]),
                    "lag": lag,
                    "index": self.batches[w],
                    "restarted": bool(res.get("restarted", False)),
                }
            )
            self.batches[w] += 1
            self.env_steps += int(res["obs"].shape[0]) * (sl.stop - sl.start)
            if int(res["version"]) == self.worker_version[w]:
                self._probe[w] = self._probe_states(res, sl)
            # Otherwise the worker was synced while this batch was running: the probe taken at
            # sync time already describes the policy it now holds.

        params = {
            key: torch.from_numpy(np.concatenate([r["params"][key] for r in results], 1)).to(dev)
            for key in results[0]["params"]
        }
        info = {
            key: torch.from_numpy(np.concatenate([r["info"][key] for r in results], 1)).to(dev)
            for key in results[0]["info"]
        }
        contract = {k: info.pop(k) for k in ("final_obs", "features", "done")}
        ep_return, ep_length = info.pop("episode_return"), info.pop("episode_length")
        return RolloutBatch(
            obs=cat("obs"),
            actions=cat("actions"),
            log_prob=cat("log_prob"),
            params=params,
            reward=cat("reward"),
            terminated=cat("terminated"),
            truncated=cat("truncated"),
            done=contract["done"],
            final_obs=contract["final_obs"],
            features=contract["features"],
            episode_return=ep_return,
            episode_length=ep_length,
            next_obs=cat("next_obs", axis=0),
            next_features=cat("next_features", axis=0),
            member=self.member.clone(),
            version=torch.from_numpy(versions).to(dev),
            restarted=torch.from_numpy(restarted).to(dev),
            info=info,
            workers=meta,
        )

    def _probe_states(
        self, res: dict[str, Any], sl: slice
    ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """The worker's states ``[N, O]``, their members ``[N]`` and the behaviour parameters
        ``[N, ...]`` on them, flattened over ``T`` and subsampled to ``kl_max_states``."""
        obs = res["obs"]
        t, n = obs.shape[:2]
        idx = np.arange(t * n)
        if self.kl_max_states is not None and t * n > self.kl_max_states:
            idx = np.linspace(0, t * n - 1, self.kl_max_states).round().astype(np.int64)
        flat_obs = torch.from_numpy(obs.reshape(t * n, -1)[idx]).to(self.device)
        member = np.broadcast_to(self._member_np[sl], (t, n)).reshape(-1)[idx]
        params = {
            k: torch.from_numpy(v.reshape(t * n, *v.shape[2:])[idx]).to(self.device)
            for k, v in res["params"].items()
        }
        return flat_obs, torch.from_numpy(member.copy()).to(self.device), params

    # -- synchronisation ------------------------------------------------------------------------
    @torch.no_grad()
    def publish(self) -> dict[int, float]:
        """Declare that ``policy`` was updated: ``version += 1``, then APS for every worker.

        For each worker, ``D_w`` is the mean exact KL from the parameters its policy produced on
        the states of its latest batch to the learner's current policy on the same states; the
        weights go to the workers with ``D_w > delta``.

        Returns:
            ``{worker: D_w}`` for every worker that has delivered a batch.
        """
        self.version += 1
        env, policy = self.env, self.policy
        assert isinstance(policy, ParamsPolicy)  # __init__ refused a policy without it
        kls: dict[int, float] = {}
        acks: list[tuple[int, Any]] = []
        for w, probe in enumerate(self._probe):
            if probe is None:
                continue
            obs, member, behaviour = probe
            current = as_dist_params(policy.action_params(obs, member))
            if dist_kind(current) != dist_kind(behaviour):
                raise TypeError("the policy changed between Gaussian and categorical")
            kl = mean_policy_kl(behaviour, current)
            kls[w] = kl
            if self.aps.decide(w, kl, lag=self.version - self.worker_version[w]):
                ref, nbytes = self._weights_ref()
                acks.append((w, env.actors[w].set_weights.remote(ref, self.version)))
                self.aps.record_bytes(w, nbytes)
                self.worker_version[w] = self.version
                # The worker now acts with pi_v: its drift is measured from pi_v from now on.
                detached = {k: v.detach().clone() for k, v in current.items()}
                self._probe[w] = (obs, member, detached)
        if acks:
            results = env.gather([ref for _, ref in acks], "set_weights")
            for (w, _), res in zip(acks, results):
                if isinstance(res, ShardFailure):
                    env.recover(w, res.error)  # the restart hook installs the current weights
        return kls

    def stats(self) -> dict[str, Any]:
        """APS counters (:meth:`AdaptiveSync.summary`) plus versions and delivery counts."""
        out = self.aps.summary()
        out.update(
            version=self.version,
            worker_version=list(self.worker_version),
            batches_per_worker=list(self.batches),
            env_steps=self.env_steps,
            restarts_per_worker=list(self.env.stats.restarts),
            restart_syncs=self.restart_syncs,
        )
        return out
