"""CPO: SAPG plus three couplings between the followers and the leader (docs/algorithms.md §7).

- KL penalty: each follower's advantage becomes ``A_f - lambda * (log pi_f(a|s) - log pi_L(a|s))``
  (:meth:`CPO.advantages`). The penalty is subtracted after the per-member normalisation, so
  lambda is measured in advantage standard deviations whatever the reward scale.
- Advantage-weighted pull (:class:`AWACPullTerm`): on the leader's rows, every follower
  maximises ``beta * min(exp(A_f(s_L, a_L) / lambda_awac), 100) * log pi_f(a_L | s_L)``, with
  ``A_f`` the follower critic's one-step TD advantage of the leader's action.
- Adversarial diversity reward (:class:`~myriad.finetune.discriminator.AdversarialReward`): the
  followers' rewards get ``c_adv * log q(i|s,a)``; the leader's do not.

Each coupling has its own switch and coefficient.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from myriad.finetune.discriminator import AdversarialReward, DiscriminatorConfig
from myriad.finetune.losses import (
    awac_loss,
    awac_weights,
    kl_penalized_advantages,
    one_step_td,
)
from myriad.finetune.rows import leader_rows, tile_members
from myriad.finetune.sapg import SAPG, SAPGConfig, ensure_field, transitions
from myriad.nn.distributions import gaussian_log_prob
from myriad.nn.population import Evaluation, PopulationActorCritic
from myriad.rl.ppo import PPO, LossTerm, PPOConfig
from myriad.rl.storage import Batch, RolloutStorage

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
    """

    kl_penalty: bool = True
    kl_preset: str = "light"
    kl_coef: float | None = None
    awac: bool = True
    awac_coef: float = 0.01
    awac_temperature: float = 1.0
    awac_max_weight: float = 100.0
    adversarial: bool = True
    adversarial_coef: float = 0.002
    discriminator: DiscriminatorConfig = field(default_factory=DiscriminatorConfig)

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

    @property
    def kl_lambda(self) -> float:
        """The KL penalty's lambda: ``kl_coef`` when given, else the preset's."""
        return float(self.kl_coef) if self.kl_coef is not None else KL_PRESETS[self.kl_preset]


class AWACPullTerm:
    """The followers' advantage-weighted log-likelihood of the leader's actions.

    Needs ``batch.extras["awac_weight"]`` ``[B, M]``: member j's weight
    ``min(exp(A_j(s, a) / lambda_awac), max)`` of each leader row (from :meth:`CPO.prepare`).
    Every member is evaluated on the leader's rows in one batched pass; the leader's own row of
    the result is dropped.

    Args:
        coef: beta.
        leader: the leader's member index.

    Stats: ``awac_loss`` and ``awac_weight`` (mean weight over followers and leader rows).
    """

    def __init__(self, coef: float, leader: int = 0) -> None:
        self.coef = float(coef)
        self.leader = leader

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
        loss = awac_loss(log_prob, weights, self.coef, rows.weight)
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
        terms: list[LossTerm] = []
        if self.cpo.awac:
            terms.append(AWACPullTerm(self.cpo.awac_coef, self.leader))
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
            self.adversarial = AdversarialReward(
                model.obs_dim,
                model.action_dim,
                model.num_members,
                self.cpo.adversarial_coef,
                self.cpo.discriminator,
                normalize_obs=model.obs_norm.normalize if model.obs_norm is not None else None,
                generator=disc_generator,
                leader=self.leader,
                device=model.log_std.device,
            )

    # ---------------------------------------------------------------- rollout-level quantities

    def reward_bonus(self, storage: RolloutStorage) -> torch.Tensor | None:
        if self.adversarial is None:
            return None
        bonus, stats = self.adversarial(storage)
        self.prepare_stats.update(stats)
        return bonus

    def prepare(self, storage: RolloutStorage) -> None:
        super().prepare(storage)
        if self.cpo.kl_penalty:
            self._leader_log_probs(storage)
        if self.cpo.awac:
            self._awac_weights(storage)

    @torch.no_grad()
    def _leader_log_probs(self, storage: RolloutStorage) -> None:
        """The leader's log-density of every behaviour action, before this update."""
        obs, actions = storage.flat("obs"), storage.flat("actions")
        log_prob = self.model.log_prob(obs, self.leader, actions)
        ensure_field(storage, "leader_log_prob").view(-1).copy_(log_prob)

    @torch.no_grad()
    def _awac_weights(self, storage: RolloutStorage) -> None:
        """Every member's clipped exponentiated one-step advantage on the leader's steps."""
        m = self.model.num_members
        envs = self._leader_envs(storage)
        t, n_env = storage.num_steps, envs.shape[0]
        obs_all, next_all = transitions(storage)
        obs = obs_all.view(t, storage.num_envs, -1)[:, envs].reshape(t * n_env, -1)
        next_obs = next_all.view(t, storage.num_envs, -1)[:, envs].reshape(t * n_env, -1)
        rewards = storage.rewards[:, envs].reshape(-1)
        terminated = storage.terminated[:, envs].reshape(-1)
        values = self._all_member_values(obs)
        next_values = self._all_member_values(next_obs)
        advantage, _ = one_step_td(rewards, values, next_values, terminated, self.config.gamma)
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
            self.cpo.kl_lambda,
            batch.member != self.leader,
        )

    # ---------------------------------------------------------------- checkpointing

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.adversarial is not None:
            state["discriminator"] = self.adversarial.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.adversarial is not None:
            self.adversarial.load_state_dict(state["discriminator"])
