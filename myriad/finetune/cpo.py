"""CPO: SAPG plus three couplings between the followers and the leader (docs/algorithms.md §7).

- KL penalty: each follower's advantage becomes ``A_f - lambda * (log pi_f(a|s) - log pi_L(a|s))``
  (:meth:`CPO.advantages`). The penalty is subtracted after the per-member normalisation, so
  lambda is measured in advantage standard deviations whatever the reward scale.
- Advantage-weighted pull (:class:`AWACPullTerm`): on the leader's rows, every follower
  maximises ``beta * min(exp(A_f(s_L, a_L) / lambda_awac), 100) * log pi_f(a_L | s_L)``, with
  ``A_f`` the follower critic's one-step TD advantage of the leader's action.
- Adversarial diversity reward (:class:`~myriad.finetune.discriminator.AdversarialReward`): the
  followers' rewards get ``c_adv * log q(i|s,a)``; the leader's do not.

Each coupling has its own switch and coefficient. The coefficients are per follower (``[M]``
tensors, 0 for the leader): fixed (the presets, ``kl_coef``, ``adversarial_coef``), or adapted
every iteration by a :class:`~myriad.finetune.kl_setpoint.KLSetpointController` that holds each
follower's KL to the leader near ``kl_target`` (or its entry of ``kl_targets``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from myriad.finetune.discriminator import AdversarialReward, DiscriminatorConfig, rollout_labels
from myriad.finetune.kl_setpoint import KLSetpointConfig, KLSetpointController
from myriad.finetune.losses import (
    awac_loss,
    awac_weights,
    kl_penalized_advantages,
    one_step_td,
)
from myriad.finetune.rows import leader_rows, tile_members
from myriad.finetune.sapg import SAPG, SAPGConfig, ensure_field, transitions
from myriad.nn.distributions import gaussian_kl, gaussian_log_prob
from myriad.nn.population import Evaluation, PopulationActorCritic
from myriad.rl.ppo import PPO, LossTerm, PPOConfig, RewardBonus
from myriad.rl.row_share import RowShare
from myriad.rl.storage import Batch, RolloutStorage
from myriad.utils.config import ConfigError
from myriad.utils.settings import Check, at_least, positive, setting
from myriad.utils.tensors import member_rows

#: lambda of the KL penalty for the three diversity regimes.
KL_PRESETS: dict[str, float] = {"light": 0.1, "balanced": 0.2, "high": 0.3}


@dataclass
class CPOConfig:
    """The couplings' switches and coefficients.

    Attributes:
        kl_penalty: penalise followers' advantages by their sampled KL to the leader.
        kl_preset: ``"light"`` (0.1), ``"balanced"`` (0.2) or ``"high"`` (0.3).
        kl_coef: an explicit lambda (overrides the preset).
        awac: the advantage-weighted pull toward the leader's actions.
        awac_coef: beta.
        awac_temperature: lambda_awac.
        awac_max_weight: the weights' upper clip (100 in CPO).
        adversarial: the discriminator reward.
        adversarial_coef: c_adv.
        discriminator: the classifier's settings.
        kl_target: one KL target (nats) for every follower: the set-point mode (the default),
            in which ``kl_preset`` / ``kl_coef`` and ``adversarial_coef`` are only the initial
            values. None: fixed coefficients.
        kl_targets: one target per follower (overrides ``kl_target``).
        setpoint: the controller's gains and bounds.
    """

    kl_penalty: bool = setting(True, help="A_f <- A_f - lambda (log pi_f - log pi_L)")
    kl_preset: str = setting(
        "light",
        help="lambda of the KL penalty: light 0.1 | balanced 0.2 | high 0.3 (with a KL target: "
        "its initial value)",
        check=Check(
            lambda v: v in KL_PRESETS,
            "one of " + ", ".join(f"{k} ({v})" for k, v in KL_PRESETS.items()),
            "is not known",
        ),
    )
    kl_coef: float | None = setting(
        None, help="an explicit lambda; overrides the preset", check=at_least(0)
    )
    awac: bool = setting(
        True, help="- beta min(exp(A_f(s_L, a_L) / lambda_awac), max) log pi_f(a_L | s_L)"
    )
    awac_coef: float = setting(0.01, help="beta", check=at_least(0))
    awac_temperature: float = setting(1.0, help="lambda_awac", check=positive())
    awac_max_weight: float = setting(100.0, help="upper clip of the AWAC weights", check=positive())
    adversarial: bool = setting(
        True, help="follower reward += c_adv log q(i | s, a) (never positive)"
    )
    adversarial_coef: float = setting(
        0.002,
        help="c_adv (with a KL target: its floor's start; see setpoint.adversarial_coef_init)",
        check=at_least(0),
    )
    discriminator: DiscriminatorConfig = setting(
        factory=DiscriminatorConfig, help="the member classifier"
    )
    kl_target: float | None = setting(
        0.3,
        help="KL set point (nats): lambda and c_adv adapt per follower to hold KL(follower || "
        "leader) near it; null: the fixed coefficients above",
        check=positive(),
    )
    kl_targets: Sequence[float] | None = setting(
        None, help="one target per follower, e.g. [0.1,0.3,1.0]; overrides kl_target"
    )
    setpoint: KLSetpointConfig = setting(
        factory=KLSetpointConfig, help="the set point's gains and bounds"
    )

    def __post_init__(self) -> None:
        if self.kl_preset not in KL_PRESETS:
            raise ValueError(
                f"unknown KL preset {self.kl_preset!r}; choose one of "
                + ", ".join(f"{k} ({v})" for k, v in KL_PRESETS.items())
            )
        if isinstance(self.discriminator, dict):
            disc = dict(self.discriminator)
            if "hidden" in disc:
                disc["hidden"] = tuple(int(h) for h in disc["hidden"])
            self.discriminator = DiscriminatorConfig(**disc)
        if isinstance(self.setpoint, dict):
            self.setpoint = KLSetpointConfig(**self.setpoint)
        if self.kl_target is not None:
            self.kl_target = float(self.kl_target)
        if self.kl_targets is not None:
            self.kl_targets = [float(t) for t in self.kl_targets]
        if self.kl_targets is not None:
            targets = list(self.kl_targets)
        else:
            targets = [] if self.kl_target is None else [self.kl_target]
        if self.set_point and not all(t > 0 for t in targets):
            raise ValueError(f"KL targets must be > 0 nats, got {targets}")
        if self.set_point and not self.kl_penalty:
            raise ValueError(
                "a KL target adapts the KL penalty: set kl_penalty=true, or drop the target "
                "(kl_target=null, kl_targets=null)"
            )

    @property
    def set_point(self) -> bool:
        """Whether the coefficients are adapted toward KL targets."""
        return self.kl_target is not None or self.kl_targets is not None

    @property
    def kl_lambda(self) -> float:
        """The KL penalty's lambda: ``kl_coef`` when given, else the preset's."""
        return float(self.kl_coef) if self.kl_coef is not None else KL_PRESETS[self.kl_preset]


def _first(value: float | None, default: float) -> float:
    return float(default if value is None else value)


class AWACPullTerm:
    """The followers' advantage-weighted log-likelihood of the leader's actions.

    Needs ``batch.extras["awac_weight"]`` ``[B, M]``: member j's weight
    ``min(exp(A_j(s, a) / lambda_awac), max)`` of each leader row (from :meth:`CPO.prepare`).
    Every member is evaluated on the leader's rows in one batched pass; the leader's own row of
    the result is dropped.

    Args:
        coef: beta.
        leader: the leader's member index.
        member_scale: ``[M]`` multipliers of beta per member, read at every call (None: 1).

    Stats: ``awac_loss`` and ``awac_weight`` (mean weight over followers and leader rows).
    """

    def __init__(
        self, coef: float, leader: int = 0, member_scale: torch.Tensor | None = None
    ) -> None:
        self.coef = float(coef)
        self.leader = leader
        self.member_scale = member_scale

    def augmented_rows(self, batch: Batch) -> float | torch.Tensor:
        """How many rows the pull adds to the augmented minibatch: one copy of the leader's
        rows per follower."""
        rows = leader_rows(batch, self.leader)
        followers = batch.num_members - 1
        if rows.weight is not None:
            return rows.weight.sum() * followers
        return float(rows.take(batch.member).shape[0] * followers)

    def __call__(
        self, algorithm: PPO, batch: Batch, evaluation: Evaluation
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model = algorithm.model
        m = model.num_members
        rows = leader_rows(batch, self.leader)
        obs, actions = rows.take(batch.obs), rows.take(batch.actions)
        n = obs.shape[0]
        tiled_obs, member = tile_members(obs, m)
        tiled_actions, _ = tile_members(actions, m)
        mean, log_std = model.action_params(tiled_obs, member, blocked=True)
        log_prob = gaussian_log_prob(tiled_actions, mean, log_std)
        followers = torch.arange(m, device=obs.device) != self.leader
        log_prob = log_prob.view(m, n)[followers]
        weights = rows.take(batch.extras["awac_weight"]).t()[followers]
        scaled = (
            weights if self.member_scale is None else weights * self.member_scale[followers, None]
        )
        loss = awac_loss(log_prob, scaled, self.coef, rows.weight)
        return loss, {"awac_loss": loss.detach(), "awac_weight": rows.mean(weights.mean(dim=0))}


class CPO(SAPG):
    """Coupled Policy Optimization over a leader (member 0) and followers.

    Args:
        model: the population, M >= 2.
        config: PPO hyperparameters.
        sapg: the SAPG part (entropy schedule, leader's off-policy loss).
        cpo: the couplings.
        extra_terms: further loss terms.
        generator: minibatch shuffling (and the discriminator's, from a derived seed).
        optimizer: default Adam over the model.
    """

    def __init__(
        self,
        model: PopulationActorCritic,
        config: PPOConfig | None = None,
        sapg: SAPGConfig | None = None,
        cpo: CPOConfig | None = None,
        *,
        extra_terms: Iterable[LossTerm] = (),
        generator: torch.Generator | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        self.cpo = cpo or CPOConfig()
        m, device = model.num_members, model.log_std.device
        # Each follower's multiplier of the AWAC coefficient (1 unless the set point scales it).
        self.awac_scale = torch.ones(m, device=device)
        terms: list[LossTerm] = []
        if self.cpo.awac:
            terms.append(AWACPullTerm(self.cpo.awac_coef, self.leader, self.awac_scale))
        super().__init__(
            model,
            config,
            sapg,
            extra_terms=[*terms, *extra_terms],
            generator=generator,
            optimizer=optimizer,
        )
        self.adversarial: AdversarialReward | None = None
        if self.cpo.adversarial:
            disc_generator = None
            if generator is not None:
                disc_generator = torch.Generator(device=generator.device)
                disc_generator.manual_seed(int(generator.initial_seed()) + 1)
            # Unit coefficient: the reward is log q; each follower's own c scales it in
            # `reward_bonus`.
            self.adversarial = AdversarialReward(
                model.obs_dim,
                model.action_dim,
                model.num_members,
                1.0,
                self.cpo.discriminator,
                normalize_obs=model.obs_norm.normalize if model.obs_norm is not None else None,
                generator=disc_generator,
                leader=self.leader,
                device=model.log_std.device,
            )
        self.follower_index = torch.nonzero(torch.arange(m) != self.leader).squeeze(1).to(device)
        # The coefficients in effect, [M] (0 for the leader): constants in the fixed mode, the
        # controller's in the set-point mode.
        self.kl_coef = torch.zeros(m, device=device)
        self.adversarial_coef = torch.zeros(m, device=device)
        self.setpoint: KLSetpointController | None = None
        self.initial_kl_coef = self.cpo.kl_lambda
        if self.cpo.set_point:
            self.setpoint = KLSetpointController(
                self._targets(m - 1),
                self.cpo.setpoint,
                kl_coef=_first(self.cpo.setpoint.kl_coef_init, self.cpo.kl_lambda),
                adversarial_coef=(
                    _first(self.cpo.setpoint.adversarial_coef_init, self.cpo.adversarial_coef)
                    if self.cpo.adversarial
                    else None
                ),
                device=device,
            )
            self.initial_kl_coef = float(self.setpoint.kl_coef[0])
        self._sync_coefficients()
        self.coupling_stats: dict[str, float] = {}
        #: The members' one-step advantages of the leader's steps during an update ``[M, N_L]``,
        #: and the columns of it this process computed (all of them unless the update is split).
        self._awac_advantage: torch.Tensor | None = None
        self._awac_own: torch.Tensor | None = None

    def set_share(self, share: RowShare | None) -> None:
        super().set_share(share)
        if self.adversarial is not None:
            self.adversarial.share = share

    def _targets(self, num_followers: int) -> list[float]:
        """The KL target of every follower.

        Raises:
            ConfigError: ``kl_targets`` does not have one entry per follower.
        """
        if self.cpo.kl_targets is None:
            assert self.cpo.kl_target is not None  # asked in the set-point mode only
            return [float(self.cpo.kl_target)] * num_followers
        targets = list(self.cpo.kl_targets)
        if len(targets) != num_followers:
            example = ",".join(["0.3"] * num_followers)
            raise ConfigError(
                f"algo.kl_targets has {len(targets)} entries for {num_followers} followers "
                f"(population.size={num_followers + 1}): give one per follower, e.g. "
                f"algo.kl_targets=[{example}], or one algo.kl_target for all"
            )
        return targets

    @torch.no_grad()
    def _sync_coefficients(self, active: bool = True) -> None:
        """Write the followers' coefficients into the ``[M]`` tensors the losses read: the
        controller's, or the fixed ones without a set point or while it is not ``active``."""
        followers = self.follower_index
        if self.setpoint is None or not active:
            self.kl_coef.index_fill_(0, followers, self.cpo.kl_lambda)
            self.adversarial_coef.index_fill_(0, followers, self.cpo.adversarial_coef)
            self.awac_scale.fill_(1.0)
            return
        self.kl_coef.index_copy_(0, followers, self.setpoint.penalty_coef)
        if self.cpo.setpoint.scale_awac:
            self.awac_scale.index_copy_(0, followers, self.setpoint.kl_coef / self.initial_kl_coef)
        adversarial = self.setpoint.adversarial_coef
        if adversarial is not None:
            self.adversarial_coef.index_copy_(0, followers, adversarial)

    # ---------------------------------------------------------------- rollout-level quantities

    def reward_bonus(self, storage: RolloutStorage) -> RewardBonus | None:
        if self.adversarial is None:
            return None
        log_q, stats = self.adversarial(storage)  # [T, E], 0 on the leader's envs
        bonus = log_q * self.adversarial_coef[storage.member]
        stats["adversarial_bonus"] = float(bonus.mean())
        return RewardBonus(bonus, stats)

    def prepare(self, storage: RolloutStorage) -> dict[str, float]:
        # Before SAPG's targets, which read them (rollout_leader_log_prob); PPO's preparation
        # changes neither the actor nor the observation statistics.
        if self.cpo.kl_penalty:
            self._leader_log_probs(storage)
        stats = super().prepare(storage)
        self._awac_advantage = self._awac_advantages(storage) if self.cpo.awac else None
        return stats

    def advantage_groups(
        self, storage: RolloutStorage, planned: torch.Tensor | None, epochs: int
    ) -> list[tuple[torch.Tensor, float]]:
        """SAPG's groups and the followers' one-step advantages of the leader's steps: each
        follower adds a copy of the leader's rows to the augmented batch (its AWAC rows)."""
        groups = super().advantage_groups(storage, planned, epochs)
        if self._awac_own is not None:
            follower = self._awac_own.index_select(0, self.follower_index).reshape(-1)
            groups.append((follower, float(follower.shape[0])))
        return groups

    def plan_minibatches(self, storage: RolloutStorage, epochs: list[list[torch.Tensor]]) -> None:
        """SAPG's plan, then the AWAC weights, normalised with the update's advantage moments
        when there are any."""
        super().plan_minibatches(storage, epochs)
        if self._awac_advantage is not None:
            self._write_awac_weights(storage, self._awac_advantage)

    def rollout_leader_log_prob(self, storage: RolloutStorage) -> torch.Tensor | None:
        return storage.flat("leader_log_prob") if self.cpo.kl_penalty else None

    @torch.no_grad()
    def _leader_log_probs(self, storage: RolloutStorage) -> None:
        """The leader's log-density of every behaviour action, before this update (when the
        update is split: of this process's envs' actions, then gathered)."""
        obs, actions = self.own_columns(storage.obs), self.own_columns(storage.actions)
        t = storage.num_steps
        log_prob = self.model.log_prob(
            obs.reshape(-1, obs.shape[-1]), self.leader, actions.reshape(-1, actions.shape[-1])
        ).view(t, -1)
        if log_prob.shape[1] != storage.num_envs:
            assert self.share is not None
            log_prob = self.share.all_gather(log_prob, 1)
        ensure_field(storage, "leader_log_prob").copy_(log_prob)

    @torch.no_grad()
    def _awac_advantages(self, storage: RolloutStorage) -> torch.Tensor:
        """``[M, T * E_L]``: every member's one-step TD advantage of the leader's steps (its own
        critic on the leader's transitions), time-major over the leader's ``E_L`` envs. When
        the update is split, each process computes an equal part of the steps and the parts
        are gathered; :attr:`_awac_own` keeps this process's part."""
        envs = self._leader_envs(storage)
        t, n_env = storage.num_steps, envs.shape[0]
        obs_all, next_all = transitions(storage)
        obs = obs_all.view(t, storage.num_envs, -1)[:, envs].reshape(t * n_env, -1)
        next_obs = next_all.view(t, storage.num_envs, -1)[:, envs].reshape(t * n_env, -1)
        rewards = storage.rewards[:, envs].reshape(-1)
        terminated = storage.terminated[:, envs].reshape(-1)
        part = None if self.share is None else self.share.block(t * n_env)
        if part is not None:
            obs, next_obs = obs[part], next_obs[part]
            rewards, terminated = rewards[part], terminated[part]
        values = self._all_member_values(obs)
        next_values = self._all_member_values(next_obs)
        advantage, _ = one_step_td(rewards, values, next_values, terminated, self.config.gamma)
        self._awac_own = advantage
        if part is not None:
            assert self.share is not None
            advantage = self.share.all_gather(advantage, 1)
        elif self.share is not None and self.share.rank:
            # Steps that do not split: every process computed all of them, and the moments
            # summed over the processes must count them once.
            self._awac_own = advantage[:, :0]
        return advantage

    @torch.no_grad()
    def _write_awac_weights(self, storage: RolloutStorage, advantage: torch.Tensor) -> None:
        """Every member's clipped exponentiated advantage ``[M, T * E_L]`` of the leader's
        steps, into the storage's ``awac_weight`` field."""
        m = self.model.num_members
        envs = self._leader_envs(storage)
        t, n_env = storage.num_steps, envs.shape[0]
        if self.advantage_moments is not None:
            mean, std = self.advantage_moments
            advantage = (advantage - mean) / (std + 1e-8)
        weights = awac_weights(advantage, self.cpo.awac_temperature, self.cpo.awac_max_weight)
        field_ = ensure_field(storage, "awac_weight", (m,))
        field_[:, envs] = weights.t().reshape(t, n_env, m)

    def _leader_envs(self, storage: RolloutStorage) -> torch.Tensor:
        """Indices of the leader's envs (one host sync per update)."""
        return torch.nonzero(storage.member == self.leader).squeeze(1)

    def _all_member_values(self, obs: torch.Tensor) -> torch.Tensor:
        """Every member's value of the same states, ``[N, O] -> [M, N]``."""
        m = self.model.num_members
        tiled, member = tile_members(obs, m)
        return self.model.value(tiled, member, blocked=True).view(m, -1)

    # ---------------------------------------------------------------- minibatch quantities

    def advantages(self, batch: Batch) -> torch.Tensor:
        advantages = super().advantages(batch)
        if not self.cpo.kl_penalty:
            return advantages
        return kl_penalized_advantages(
            advantages,
            batch.log_probs,
            batch.extras["leader_log_prob"],
            member_rows(self.kl_coef, batch.member),
            batch.member != self.leader,
        )

    # ---------------------------------------------------------------- the set point

    @torch.no_grad()
    def follower_kl(self, storage: RolloutStorage) -> torch.Tensor:
        """``[F]``: each follower's exact ``KL(pi_f || pi_L)`` averaged over all its own states
        of the rollout, under the current weights (after an update: the post-update KL). When
        the update is split, each process sums over its own envs' states and the ``[2, M]``
        sums and counts are summed over the processes."""
        m = self.model.num_members
        obs = self.own_columns(storage.obs)
        member = self.own_columns(rollout_labels(storage).view(storage.num_steps, -1))
        obs, member = obs.reshape(-1, obs.shape[-1]), member.reshape(-1)
        own = self.model.action_params(obs, member)
        lead = self.model.action_params(obs, self.leader)
        kl = gaussian_kl(own[0], own[1], lead[0], lead[1])  # [N], 0 on the leader's rows
        sums = torch.zeros(2, m, dtype=kl.dtype, device=kl.device)
        sums[0].index_add_(0, member, kl)
        sums[1].index_add_(0, member, torch.ones_like(kl))
        if self.share is not None and obs.shape[0] != storage.num_steps * storage.num_envs:
            sums = self.share.all_reduce(sums)
        return (sums[0] / sums[1].clamp(min=1)).index_select(0, self.follower_index)

    def update(self, storage: RolloutStorage, critic_only: bool = False) -> dict[str, float]:
        """The PPO epochs, then one set-point step from the post-update KL.

        While only the critics learn (the warm-up after ``--init``) the set point neither acts
        nor steps: the couplings keep their fixed values (a strong adversarial reward while the
        fresh critics fit their first returns made the leader fail on the maze, docs/finetune.md)
        and the actors, so the KL, do not respond to the coefficients anyway.
        """
        followers = self.follower_index
        self._sync_coefficients(active=not critic_only)
        applied = {"kl_coef": self.kl_coef.index_select(0, followers)}
        if self.adversarial is not None:
            applied["adversarial_coef"] = self.adversarial_coef.index_select(0, followers)
        if self.cpo.awac:
            applied["awac_coef"] = self.cpo.awac_coef * self.awac_scale.index_select(0, followers)
        stats = super().update(storage, critic_only)
        kl = self.follower_kl(storage)
        if self.setpoint is not None and not critic_only:
            self.setpoint.step(kl)
            self._sync_coefficients()
        self.coupling_stats = self._coupling_scalars(kl, applied)
        return stats

    def _coupling_scalars(
        self, kl: torch.Tensor, applied: dict[str, torch.Tensor]
    ) -> dict[str, float]:
        """``cpo/*`` scalars: per follower (member index i) the KL after the update and the
        coefficients this update used (``[F]`` each in ``applied``); with targets also the
        target and the fraction of followers within ``[0.5, 2] x`` their target."""
        rows = [("kl", kl), *applied.items()]
        if self.setpoint is not None:
            rows.append(("kl_target", self.setpoint.targets))
        # One copy to the host for the logged figures; the band is read on the device.
        values = torch.stack([v for _, v in rows]).cpu()
        out: dict[str, float] = {}
        if self.setpoint is not None:
            out["cpo/kl_in_band"] = float(self.setpoint.in_band(kl).float().mean())
        if self.model.num_members > 16:  # per-follower curves would swamp the logs
            for j, (name, _) in enumerate(rows):
                out[f"cpo/{name}_mean"] = float(values[j].mean())
            return out
        for j, (name, _) in enumerate(rows):
            for k, i in enumerate(self.follower_index.tolist()):
                out[f"cpo/{name}/follower_{i}"] = float(values[j, k])
        return out

    def end_iteration(self, returns: np.ndarray, counts: np.ndarray) -> dict[str, float]:
        """The ``cpo/*`` scalars of the last update (the runner logs them every iteration)."""
        return dict(self.coupling_stats)

    # ---------------------------------------------------------------- checkpointing

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.adversarial is not None:
            state["discriminator"] = self.adversarial.state_dict()
        if self.setpoint is not None:
            state["kl_setpoint"] = self.setpoint.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.adversarial is not None:
            self.adversarial.load_state_dict(state["discriminator"])
        if self.setpoint is not None:
            self.setpoint.load_state_dict(state["kl_setpoint"])
            self._sync_coefficients()
