"""Rollout collection: step a VecEnv with a population model and fill a RolloutStorage.

The step loop runs on the device end to end: no Python loop over environments, no ``.item()``,
no host copies. Episode statistics are accumulated per member on the device and read once per
rollout by :meth:`EpisodeTracker.summary`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from myriad.envs.base import EpisodeStats, TensorVecEnv, VecEnv
from myriad.nn.population import PopulationActorCritic, block_members, member_blocks
from myriad.rl.storage import RolloutStorage


class EpisodeSums(NamedTuple):
    """Per-member sums over the episodes finished since the tracker's last read, ``[M]`` float64
    each: ``returns``, ``lengths``, ``successes`` (episodes that ended with
    ``info["success"]``) and ``counts`` (episodes)."""

    returns: np.ndarray
    lengths: np.ndarray
    successes: np.ndarray
    counts: np.ndarray


class EpisodeTracker:
    """Sums of the returns, lengths and successes of finished episodes, per member, kept on the
    device: the one place where a rollout's episode statistics are accumulated.

    Args:
        num_members: M.
        device: where the accumulators live.
        per_member: :meth:`summary` also reports each member's means.

    Attributes:
        sums: ``[4, M]`` float64: return, length, success and episode count per member.
        has_success: an env reported ``info["success"]`` (success rates mean something).
    """

    def __init__(
        self, num_members: int, device: torch.device | str, per_member: bool = True
    ) -> None:
        self.num_members = num_members
        self.per_member = per_member
        self.sums = torch.zeros(4, num_members, dtype=torch.float64, device=device)
        self.has_success = False

    def record(
        self,
        member: torch.Tensor,
        done: torch.Tensor,
        episode_return: torch.Tensor,
        episode_length: torch.Tensor,
        success: torch.Tensor | None = None,
    ) -> None:
        """Fold in the episodes that ended at this step (all ``[E]``; no host sync).

        ``success`` (``[E]`` bool, the env's ``info["success"]``) counts for the envs where
        ``done``; None when the env reports none.
        """
        mask = done.to(torch.float64)
        if success is None:
            succeeded = torch.zeros_like(mask)
        else:
            self.has_success = True
            succeeded = (success & done).to(torch.float64)
        rows = torch.stack(
            [
                episode_return.to(torch.float64) * mask,
                episode_length.to(torch.float64) * mask,
                succeeded,
                mask,
            ]
        )
        self.sums.index_add_(1, member, rows)

    def read(self, reset: bool = True) -> EpisodeSums:
        """The per-member sums since the last reset (one read from the device)."""
        values = self.sums.cpu().numpy().copy()
        if reset:
            self.sums.zero_()
        return EpisodeSums(*values)

    def summary(self, reset: bool = True) -> dict[str, float]:
        """Mean return and length of the episodes finished since the last reset
        (:meth:`scalars` of :meth:`read`)."""
        return self.scalars(self.read(reset))

    def scalars(self, sums: EpisodeSums) -> dict[str, float]:
        """Keys: ``episode/return``, ``episode/length``, ``episode/count`` and, per member with
        at least one finished episode, ``episode/return/member_{i}``. Means are absent while no
        episode has finished."""
        ret, length, count = sums.returns.tolist(), sums.lengths.tolist(), sums.counts.tolist()
        total = sum(count)
        out: dict[str, float] = {"episode/count": float(total)}
        if total > 0:
            out["episode/return"] = sum(ret) / total
            out["episode/length"] = sum(length) / total
        if self.per_member and self.num_members > 1:
            for i, (r, c) in enumerate(zip(ret, count)):
                if c > 0:
                    out[f"episode/return/member_{i}"] = r / c
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"sums": self.sums.detach().cpu().clone(), "has_success": self.has_success}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sums.copy_(state["sums"])
        self.has_success = bool(state["has_success"])


def env_state_dict(env: VecEnv) -> dict[str, Any]:
    """The resumable state of ``env``.

    Uses ``env.state_dict()`` when the env defines it. Otherwise captures every tensor
    attribute, the running episode statistics and the ``generator`` of the env, which is the
    whole state of torch envs that keep their state in tensors (as
    :class:`~myriad.envs.base.TensorVecEnv` subclasses do, unless they set ``state_in_tensors``
    to False); envs holding state elsewhere should define ``state_dict`` / ``load_state_dict``.
    ``state["exact"]`` says whether loading the state puts the env back exactly where it was.
    """
    state_dict = getattr(env, "state_dict", None)
    if callable(state_dict):
        return {"state_dict": state_dict()}
    tensors = {k: v.detach().cpu().clone() for k, v in vars(env).items() if torch.is_tensor(v)}
    exact = isinstance(env, TensorVecEnv) and env.state_in_tensors
    state: dict[str, Any] = {"tensors": tensors, "exact": exact}
    episode = getattr(env, "episode", None)
    if isinstance(episode, EpisodeStats):
        state["episode"] = episode.state_dict()
    generator = getattr(env, "generator", None)
    if isinstance(generator, torch.Generator):
        state["generator"] = generator.get_state()
    return state


def load_env_state_dict(env: VecEnv, state: dict[str, Any]) -> str | None:
    """Restore a state captured by :func:`env_state_dict`.

    Returns:
        None when ``env`` is now exactly in the saved state; otherwise why not (the env's
        simulator state lives outside its tensors, or its ``load_state_dict`` said so by
        returning a reason): the caller must reset the env before stepping it again.
    """
    if "state_dict" in state:
        reason = env.load_state_dict(state["state_dict"])  # type: ignore[attr-defined]
        return reason if isinstance(reason, str) else None
    tensors = dict(state["tensors"])
    episode = state.get("episode")
    for name, value in tensors.items():
        current = getattr(env, name, None)
        if torch.is_tensor(current) and current.shape == value.shape:
            current.copy_(value)
        else:
            device = current.device if torch.is_tensor(current) else env.device
            setattr(env, name, value.to(device))
    stats = getattr(env, "episode", None)
    if episode is not None and isinstance(stats, EpisodeStats):
        stats.load_state_dict(episode)
    if "generator" in state:
        env.generator.set_state(state["generator"])  # type: ignore[attr-defined]
    # Checkpoints written before "exact" was recorded: the env's own kind says it.
    if state.get("exact", isinstance(env, TensorVecEnv) and env.state_in_tensors):
        return None
    return f"{type(env).__name__} keeps simulator state outside its tensors"


class RolloutCollector:
    """Runs T steps of ``env`` with ``model`` into a :class:`RolloutStorage`.

    Args:
        env: the batched environments, ``E = env.num_envs``.
        model: the population; member ``i`` acts in the envs where ``member == i``.
        member: ``[E]`` long (default: M contiguous equal blocks, see
            :func:`~myriad.nn.population.block_members`).
        generator: randomness of action sampling (None: torch's global generator).
        bootstrap_truncated: bootstrap truncated episodes from V(final_obs). The final
            observations of the rollout are kept (in the ``next_obs`` field with
            ``store_transitions``, else in a ``[T, E, O]`` buffer of the collector) and the
            critic evaluates those of the truncated steps only, once after the rollout.
        per_member_stats: report each member's episode return (default: when M <= 16, so large
            populations do not flood the logs).
        store_transitions: also keep, per step, ``next_obs`` (``info["final_obs"]``: the
            observation reached before any reset) and ``state_features`` (entropy features of
            the state the action was taken in), as storage extras; datasets need both.
    """

    def __init__(
        self,
        env: VecEnv,
        model: PopulationActorCritic,
        member: torch.Tensor | None = None,
        generator: torch.Generator | None = None,
        bootstrap_truncated: bool = True,
        per_member_stats: bool | None = None,
        store_transitions: bool = False,
    ) -> None:
        self.env = env
        self.store_transitions = store_transitions
        self.model = model
        m = model.num_members
        self.member = (
            block_members(env.num_envs, m, env.device) if member is None else member.long()
        )
        if self.member.shape != (env.num_envs,):
            raise ValueError(f"member must have shape [{env.num_envs}], got {self.member.shape}")
        self.blocked = member_blocks(self.member, m)
        self.generator = generator
        self.bootstrap_truncated = bootstrap_truncated
        per_member = m <= 16 if per_member_stats is None else per_member_stats
        self.episodes = EpisodeTracker(m, env.device, per_member)
        self.obs: torch.Tensor | None = None
        self._final_obs: torch.Tensor | None = None
        # Set by load_state_dict: why the env could not be restored exactly (None: it was).
        self.env_not_restored: str | None = None

    def make_storage(self, num_steps: int, **options: Any) -> RolloutStorage:
        """A storage shaped for this collector's env, model and member layout."""
        feature_dim = self.env.features.dim if getattr(self.env, "features", None) else 0
        options.setdefault("feature_dim", feature_dim)
        storage = RolloutStorage(
            num_steps,
            self.member,
            self.env.obs_dim,
            self.env.action_dim,
            num_members=self.model.num_members,
            **options,
        )
        if self.store_transitions:
            # Read from the whole rollout (one-step targets, the dataset), never per minibatch.
            storage.register_field("next_obs", (self.env.obs_dim,), in_batch=False)
            storage.register_field("state_features", (feature_dim,), in_batch=False)
        return storage

    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Reset the envs (``seed`` as in ``VecEnv.reset``); returns ``obs [E, O]``."""
        self.obs = self.env.reset(seed)
        return self.obs

    def _final_obs_buffer(self, storage: RolloutStorage) -> torch.Tensor | None:
        """Where the rollout's final observations go, ``[T, E, O]`` (None: not kept)."""
        if self.store_transitions:
            return storage.extras["next_obs"]
        if not self.bootstrap_truncated:
            return None
        shape = (storage.num_steps, storage.num_envs, storage.obs_dim)
        if self._final_obs is None or self._final_obs.shape != shape:
            self._final_obs = storage.obs.new_empty(shape)
        return self._final_obs

    @torch.no_grad()
    def collect(self, storage: RolloutStorage) -> None:
        """Fill ``storage`` with ``storage.num_steps`` steps, the truncation bootstraps and
        ``last_values``."""
        self.collect_steps(storage)
        self.bootstrap_truncations(storage)

    @torch.no_grad()
    def collect_steps(self, storage: RolloutStorage) -> None:
        """The rollout loop: ``storage.num_steps`` steps and ``last_values``, with no read from
        the device (truncation values are left at 0: :meth:`bootstrap_truncations`)."""
        obs = self.reset() if self.obs is None else self.obs
        model, member, blocked, env = self.model, self.member, self.blocked, self.env
        final_obs = self._final_obs_buffer(storage)
        storage.clear()
        for t in range(storage.num_steps):
            out = model.act(obs, member, self.generator, blocked=blocked)
            extras = {"state_features": env.current_features()} if self.store_transitions else {}
            next_obs, reward, terminated, truncated, info = env.step(out.actions)
            if final_obs is not None:
                final_obs[t].copy_(info["final_obs"])
            storage.add(
                obs=obs,
                actions=out.actions,
                log_prob=out.log_prob,
                value=out.value,
                reward=reward,
                terminated=terminated,
                truncated=truncated,
                features=info.get("features"),
                mean=out.mean,
                log_std=out.log_std,
                **extras,
            )
            done = info.get("done")
            if done is None:
                done = terminated | truncated
            self.episodes.record(
                member, done, info["episode_return"], info["episode_length"], info.get("success")
            )
            obs = next_obs
        storage.last_values.copy_(model.value(obs, member, blocked))
        self.obs = obs

    @torch.no_grad()
    def bootstrap_truncations(self, storage: RolloutStorage) -> None:
        """``storage.truncation_values`` = V(final_obs) of the truncated steps of the rollout
        just collected, 0 elsewhere.

        Only those steps need the critic (one in 400 for episodes cut at 400 steps), where
        evaluating it on every step's final observations doubled the critic passes of the
        rollout. Finding them reads their count from the device: one host sync per rollout,
        after the loop. The critic is the one that acted (the update has not run yet).
        """
        final_obs = self._final_obs_buffer(storage)
        if final_obs is None or not self.bootstrap_truncated:
            return
        rows = storage.truncated.view(-1).nonzero().squeeze(1)
        if rows.numel() == 0:
            return
        envs = rows.remainder(storage.num_envs)
        values = self.model.value(
            final_obs.view(-1, storage.obs_dim).index_select(0, rows),
            self.member.index_select(0, envs),
        )
        storage.truncation_values.view(-1).index_copy_(0, rows, values.to(storage.dtype))

    def state_dict(self) -> dict[str, Any]:
        """Current observations, episode accumulators, sampling generator and env state."""
        state: dict[str, Any] = {
            "obs": None if self.obs is None else self.obs.detach().cpu().clone(),
            "episodes": self.episodes.state_dict(),
            "env": env_state_dict(self.env),
        }
        if self.generator is not None:
            state["generator"] = self.generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`. When the env cannot be put back exactly
        (:func:`load_env_state_dict`), :attr:`env_not_restored` says why and the next rollout
        starts from a reset: its episodes are new ones, never continuations of the saved ones."""
        self.env_not_restored = load_env_state_dict(self.env, state["env"])
        obs = state["obs"]
        self.obs = None if obs is None or self.env_not_restored else obs.to(self.env.device)
        self.episodes.load_state_dict(state["episodes"])
        if self.generator is not None and "generator" in state:
            self.generator.set_state(state["generator"])
