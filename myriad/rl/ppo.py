"""PPO over a shared rollout, structured so other algorithms add loss terms, not loops.

:meth:`PPO.update` owns the epochs-over-minibatches loop. Each minibatch goes through
:meth:`PPO.loss`, which evaluates the model once (:meth:`PPO.evaluate`), builds the PPO terms
(:meth:`PPO.ppo_loss`, with advantages from :meth:`PPO.advantages`) and adds every extra
:class:`LossTerm`. An algorithm built on PPO either passes extra terms (for example a KL penalty
toward a leader) or overrides ``advantages`` / ``loss`` and calls ``super()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, Protocol

import torch

from myriad.nn.population import Evaluation, PopulationActorCritic
from myriad.rl import losses
from myriad.rl.gae import compute_gae
from myriad.rl.row_share import RowShare
from myriad.rl.storage import Batch, RolloutStorage
from myriad.utils.settings import (
    Check,
    at_least,
    between,
    check_fields,
    from_config,
    one_of,
    positive,
    setting,
)
from myriad.utils.tensors import member_rows

SCHEDULES = ("adaptive", "fixed")
ADVANTAGE_NORMALIZATIONS = ("member", "batch", "none")
KL_ESTIMATORS = ("exact", "approx")


def advantage_sums(
    advantages: torch.Tensor,
    member: torch.Tensor,
    num_members: int,
    blocked: bool,
    per_member: bool,
) -> torch.Tensor:
    """``[G, 3]`` float64 count, sum and sum of squares of a minibatch's ``advantages [B]``
    (rows of ``member [B]``, member-major when ``blocked``) per normalisation group: one group
    (``per_member`` False or one member) or one per member."""
    v = advantages.detach().double()
    if not per_member or num_members == 1:
        return torch.stack([v.new_tensor(float(v.shape[0])), v.sum(), v.square().sum()])[None]
    if blocked:
        a = v.view(num_members, -1)
        return torch.stack(
            [torch.full_like(a[:, 0], a.shape[1]), a.sum(dim=1), a.square().sum(dim=1)], dim=1
        )
    sums = v.new_zeros(num_members, 3)
    return sums.index_add_(0, member, torch.stack([torch.ones_like(v), v, v.square()], 1))


@dataclass
class PPOConfig:
    """PPO hyperparameters.

    Attributes:
        clip: ratio clip range c (policy surrogate).
        epochs: passes over each rollout.
        minibatches: minibatches per pass.
        lr: initial Adam learning rate.
        gamma, lam: discount and GAE lambda.
        value_coef: weight of the value loss.
        entropy_coef: entropy bonus weight, one float or one per member.
        max_grad_norm: global gradient-norm clip.
        desired_kl: target KL of the adaptive schedule.
        schedule: ``"adaptive"`` (KL-driven learning rate) or ``"fixed"``.
        value_clip: clip range of the value loss around the behaviour values, in the critic's
            output scale (normalised returns with value normalisation); None: unclipped.
        advantage_normalization: ``"member"`` (per member, per minibatch), ``"batch"`` or
            ``"none"``.
        member_major: member-major minibatches (model fast path) when the env layout allows.
        kl_estimator: KL driving the adaptive schedule: ``"exact"`` Gaussian KL from the stored
            behaviour distribution (falls back to ``"approx"`` when it is not stored) or
            ``"approx"`` (``(r - 1) - log r``).
        lr_factor, min_lr, max_lr: step and bounds of the adaptive schedule.
        adam_eps: Adam epsilon.
        update_obs_norm: fold each rollout's observations into the model's observation
            statistics after the update, so the ratios of an update are computed under the same
            normalisation as the rollout.
    """

    clip: float = setting(0.2, help="ratio clip range of the policy surrogate", check=positive())
    epochs: int = setting(4, help="passes over each rollout", check=at_least(1))
    minibatches: int = setting(4, help="minibatches per pass", check=at_least(1))
    lr: float = setting(3e-4, help="initial Adam learning rate", check=positive())
    gamma: float = setting(0.99, help="discount", check=between(0, 1))
    lam: float = setting(0.95, help="GAE lambda", check=between(0, 1))
    value_coef: float = setting(1.0, help="weight of the value loss", check=at_least(0))
    entropy_coef: float | Sequence[float] = setting(
        0.0, help="entropy bonus weight (one number, or one per member)"
    )
    max_grad_norm: float = setting(1.0, help="global gradient-norm clip", check=positive())
    desired_kl: float | None = setting(
        0.01,
        help="KL target of the adaptive learning rate (null: fixed rate, schedule=fixed)",
        check=positive(),
    )
    schedule: str = setting("adaptive", help="learning-rate schedule", check=one_of(*SCHEDULES))
    value_clip: float | None = setting(
        0.2,
        help="clip of the value loss around the behaviour values (null: unclipped)",
        check=positive(),
    )
    advantage_normalization: str = setting(
        "member",
        help="advantages normalised per member and minibatch, per batch, or not",
        check=one_of(*ADVANTAGE_NORMALIZATIONS),
    )
    member_major: bool = setting(
        True, help="member-major minibatches (the model's fast path) where the layout allows"
    )
    kl_estimator: str = setting(
        "exact",
        help="KL of the adaptive schedule: exact Gaussian KL, or approx (r - 1) - log r",
        check=one_of(*KL_ESTIMATORS),
    )
    lr_factor: float = setting(
        1.5, help="step of the adaptive schedule", check=Check(lambda v: v > 1, "> 1")
    )
    min_lr: float = setting(1e-5, help="floor of the adaptive learning rate", check=positive())
    max_lr: float = setting(
        1e-3,
        help="ceiling of the adaptive learning rate",
        check=positive(),
    )
    adam_eps: float = setting(1e-8, help="Adam epsilon", check=positive())
    update_obs_norm: bool = setting(
        True, help="fold each rollout's observations into the running statistics after the update"
    )

    def __post_init__(self) -> None:
        if self.desired_kl is None:
            self.schedule = "fixed"
        check_fields(self)


class RewardBonus(NamedTuple):
    """What an algorithm adds to the rewards before GAE (:meth:`PPO.reward_bonus`).

    Attributes:
        bonus: ``[T, E]`` added to the rollout's rewards.
        stats: scalars about it, returned by :meth:`PPO.update` with the update's own.
    """

    bonus: torch.Tensor
    stats: dict[str, float]


class LossTerm(Protocol):
    """An extra loss term: ``(algorithm, batch, evaluation) -> (loss, stats)``.

    ``evaluation`` is the model's output on the batch (shared with the PPO terms); ``stats`` are
    detached scalars averaged and logged by :meth:`PPO.update`.
    """

    def __call__(
        self, algorithm: PPO, batch: Batch, evaluation: Evaluation
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


class PPO:
    """Clipped PPO for a :class:`PopulationActorCritic`.

    Args:
        model: the population.
        config: hyperparameters.
        extra_terms: loss terms added to every minibatch loss.
        generator: randomness of the minibatch shuffling (None: torch's global generator).
        optimizer: default Adam over all model parameters.
    """

    def __init__(
        self,
        model: PopulationActorCritic,
        config: PPOConfig | None = None,
        *,
        extra_terms: Iterable[LossTerm] = (),
        generator: torch.Generator | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        self.model = model
        self.config = config or PPOConfig()
        self.extra_terms = list(extra_terms)
        self.generator = generator
        #: Called with each minibatch's stats after ``backward``, before clipping and the step:
        #: torchrun ranks average gradients and stats there (myriad.distributed.torchdist). It
        #: may return a call that completes the average, made after the next minibatch's rows
        #: are gathered, so that the wait for the other processes overlaps that work.
        self.grad_sync: Callable[[dict[str, torch.Tensor]], Callable[[], None] | None] | None = None
        #: This process's share of every minibatch when processes holding the same rollout
        #: split the update (torchrun ranks, :mod:`myriad.rl.row_share`); None: all rows.
        self.share: RowShare | None = None
        self.optimizer = optimizer or torch.optim.Adam(
            model.parameters(), lr=self.config.lr, eps=self.config.adam_eps
        )
        self.lr = float(self.config.lr)
        self.set_lr(self.lr)
        self.entropy_coef = torch.zeros(model.num_members, device=model.log_std.device)
        self.set_entropy_coef(self.config.entropy_coef)
        #: Value-normaliser (mean, std) of the rollout being learned from, set by prepare.
        self._behaviour_value_stats: tuple[torch.Tensor, torch.Tensor] | None = None
        #: ``(mean, std)`` that normalise every advantage of the current update (scalars), when
        #: an algorithm normalises them once per update (SAPG and CPO as their authors do);
        #: None: ``advantage_normalization`` per minibatch.
        self.advantage_moments: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def parameters(self) -> list[torch.nn.Parameter]:
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def set_share(self, share: RowShare | None) -> None:
        """Learn from ``share``'s rows of every minibatch (None: all of them); the caller
        averages the gradients over the processes through :attr:`grad_sync`."""
        self.share = share

    def set_lr(self, lr: float) -> None:
        self.lr = float(lr)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr

    def set_entropy_coef(self, coef: float | Sequence[float] | torch.Tensor) -> None:
        """One coefficient for all members, or ``[M]`` per-member coefficients."""
        if not isinstance(coef, (torch.Tensor, int, float)):
            coef = [float(c) for c in coef]  # YAML / OmegaConf lists
        coef_t = torch.as_tensor(coef, dtype=torch.float32).to(self.entropy_coef.device)
        if coef_t.ndim == 1 and coef_t.shape[0] != self.model.num_members:
            raise ValueError(
                f"entropy_coef has {coef_t.shape[0]} entries for {self.model.num_members} members"
            )
        self.entropy_coef.copy_(coef_t.expand_as(self.entropy_coef))

    # ---------------------------------------------------------------- hooks

    def reward_bonus(self, storage: RolloutStorage) -> RewardBonus | None:
        """Added to the rewards for GAE; None (here): the rewards alone."""
        return None

    def prepare(self, storage: RolloutStorage) -> dict[str, float]:
        """Before the epochs: GAE on the rewards plus :meth:`reward_bonus`, then
        value-normaliser statistics from the new returns. Returns scalars that
        :meth:`update` reports with its own (the bonus's)."""
        cfg, extra = self.config, self.reward_bonus(storage)
        bonus = None if extra is None else extra.bonus
        if bonus is None:
            storage.compute_returns(cfg.gamma, cfg.lam)
        else:
            advantages, returns = compute_gae(
                storage.rewards + bonus,
                storage.values,
                storage.dones,
                storage.last_values,
                cfg.gamma,
                cfg.lam,
                storage.truncation_values,
            )
            storage.advantages.copy_(advantages)
            storage.returns.copy_(returns)
        vn = self.model.value_norm
        if vn is not None:
            # The statistics the rollout's values were de-normalised with: they map the stored
            # values back to the critics' outputs at collection, the centre of the value clip.
            self._behaviour_value_stats = (vn.mean.clone(), vn.std.clone())
            vn.update(storage.returns, storage.member.expand_as(storage.returns))
        return {} if extra is None else dict(extra.stats)

    def plan_minibatches(self, storage: RolloutStorage, epochs: list[list[torch.Tensor]]) -> None:
        """After :meth:`prepare`, before the epochs: the rows every minibatch of this update
        will read (time-major flat indices, ``[B]`` each, epoch by epoch), for an algorithm that
        computes something of exactly those rows in one pass. Nothing here."""

    def finish(self, storage: RolloutStorage) -> None:
        """After the epochs: observation statistics from the rollout just learned from."""
        self._behaviour_value_stats = None
        self.advantage_moments = None
        if self.config.update_obs_norm:
            self.model.update_obs_norm(storage.obs)

    def evaluate(self, batch: Batch) -> Evaluation:
        return self.model.evaluate(batch.obs, batch.member, batch.actions, blocked=batch.blocked)

    def advantages(self, batch: Batch) -> torch.Tensor:
        """The advantages entering the surrogate, ``[B]`` (normalised as configured, or with
        :attr:`advantage_moments` when an algorithm set them for the whole update)."""
        if self.advantage_moments is not None:
            mean, std = self.advantage_moments
            return (batch.advantages - mean) / (std + 1e-8)
        mode = self.config.advantage_normalization
        if mode == "none":
            return batch.advantages
        if self.share is not None:
            return self._shared_normalization(batch, mode == "member")
        member = batch.member if mode == "member" else None
        return losses.normalize_advantages(
            batch.advantages, member, batch.num_members, blocked=batch.blocked
        )

    def _shared_normalization(self, batch: Batch, per_member: bool) -> torch.Tensor:
        """:func:`normalize_advantages` of the whole minibatch when each process holds a share
        of it: the moments are summed over the processes (population std, as in one process)."""
        assert self.share is not None
        adv = batch.advantages
        sums = batch.advantage_sums
        if sums is None:
            local = advantage_sums(adv, batch.member, batch.num_members, batch.blocked, per_member)
            sums = self.share.all_reduce(local)
        n, total, square = sums.unbind(dim=1)
        n = n.clamp(min=1.0)
        mean = total / n
        std = (square / n - mean.square()).clamp(min=0.0).sqrt()
        mean, std = mean.to(adv.dtype), std.to(adv.dtype)
        if not per_member or batch.num_members == 1:
            return (adv - mean) / (std + 1e-8)
        if batch.blocked:
            a = adv.view(batch.num_members, -1)
            return ((a - mean[:, None]) / (std[:, None] + 1e-8)).view(-1)
        return (adv - member_rows(mean, batch.member)) / (member_rows(std, batch.member) + 1e-8)

    def _plan_advantage_sums(
        self, storage: RolloutStorage, epochs: list[list[torch.Tensor]], blocked: bool
    ) -> list[list[torch.Tensor | None]]:
        """Each minibatch's :attr:`Batch.advantage_sums`, summed over the processes in one
        collective, when a split update normalises advantages per minibatch (None for each
        otherwise): the advantages are fixed for the update, so every minibatch's moments are
        known before the epochs, and the minibatch loop then waits for the other processes once
        (the gradient average) rather than twice."""
        mode = self.config.advantage_normalization
        if self.share is None or self.advantage_moments is not None or mode == "none":
            return [[None] * len(indices) for indices in epochs]
        flat, m = storage.advantages.reshape(-1), storage.num_members
        local = [
            advantage_sums(
                flat.index_select(0, index),
                storage.member.index_select(0, index % storage.num_envs),
                m,
                blocked,
                mode == "member",
            )
            for indices in epochs
            for index in indices
        ]
        sums = iter(self.share.all_reduce(torch.cat(local)).split([x.shape[0] for x in local]))
        return [[next(sums) for _ in indices] for indices in epochs]

    def _value_scale(self, v: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
        """Values ``[B]`` of rows of ``member [B]`` in the critics' training scale (normalised
        with each member's statistics when value normalisation is on)."""
        vn = self.model.value_norm
        return v if vn is None else vn.normalize(v, member)

    def _behaviour_value_scale(self, v: torch.Tensor, member: torch.Tensor) -> torch.Tensor:
        """Stored behaviour values ``[B]`` (rows of ``member [B]``) in the critic's output scale
        at collection.

        With value normalisation these are the critics' own outputs before the update:
        normalised with the statistics of the collection, which :meth:`prepare` keeps before it
        folds in the new returns (outside an update, the current ones). Normalising them with
        the updated statistics instead would move the clip's centre by the statistics' shift,
        which the clip then forbids the critic to follow.
        """
        if self.model.value_norm is None:
            return v
        if self._behaviour_value_stats is None:
            return self._value_scale(v, member)
        group = self.model.value_norm.group_of(member)
        mean, std = (member_rows(s.to(v.dtype), group) for s in self._behaviour_value_stats)
        return (v - mean) / std

    def clip_range(self, batch: Batch) -> float | torch.Tensor:
        """The ratio clip range of each row: the configured one (PBT gives one per member)."""
        return self.config.clip

    def value_loss(self, batch: Batch, evaluation: Evaluation) -> torch.Tensor:
        """The critics' (clipped) regression loss toward the returns, a scalar.

        Predictions and returns are in the current training scale; the clip is centred on the
        critics' outputs at collection (:meth:`_behaviour_value_scale`), so it bounds how far
        this update moves each output, as without value normalisation.
        """
        return losses.clipped_value_loss(
            self._value_scale(evaluation.value, batch.member),
            self._behaviour_value_scale(batch.values, batch.member),
            self._value_scale(batch.returns, batch.member),
            self.config.value_clip,
        ).mean()

    def ppo_loss(
        self, batch: Batch, evaluation: Evaluation
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Clipped surrogate + value loss - entropy bonus on one minibatch."""
        cfg = self.config
        clip = self.clip_range(batch)
        surrogate = losses.clipped_surrogate(
            evaluation.log_prob, batch.log_probs, self.advantages(batch), clip
        ).mean()
        value_loss = self.value_loss(batch, evaluation)
        bonus = losses.entropy_bonus(evaluation.entropy, batch.member, self.entropy_coef)
        loss = surrogate + cfg.value_coef * value_loss - bonus
        with torch.no_grad():
            stats = {
                "policy_loss": surrogate.detach(),
                "value_loss": value_loss.detach(),
                "entropy": evaluation.entropy.mean(),
                "approx_kl": losses.approx_kl(evaluation.log_prob, batch.log_probs),
                "clip_fraction": losses.clip_fraction(evaluation.log_prob, batch.log_probs, clip),
            }
            stats["kl"] = self.schedule_kl(batch, evaluation, stats["approx_kl"])
        return loss, stats

    def schedule_kl(
        self, batch: Batch, evaluation: Evaluation, approx: torch.Tensor
    ) -> torch.Tensor:
        """The KL that drives the adaptive learning rate (scalar, no gradient): the exact
        Gaussian KL over the minibatch with ``kl_estimator="exact"`` and stored behaviour
        distributions, else ``approx`` (the sample estimate)."""
        # The storage keeps the behaviour means and log-stds together, or neither.
        if (
            self.config.kl_estimator == "exact"
            and batch.means is not None
            and batch.log_stds is not None
        ):
            return losses.exact_gaussian_kl(
                batch.means, batch.log_stds, evaluation.mean, evaluation.log_std
            )
        return approx

    def loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Total minibatch loss and its detached scalar stats."""
        evaluation = self.evaluate(batch)
        loss, stats = self.ppo_loss(batch, evaluation)
        extras = []
        for term in self.extra_terms:
            extra, extra_stats = term(self, batch, evaluation)
            extras.append((term, extra))
            stats.update(extra_stats)
        loss = self.combine(batch, loss, extras)
        stats["loss"] = loss.detach()
        return loss, stats

    def combine(
        self, batch: Batch, ppo: torch.Tensor, extras: Sequence[tuple[LossTerm, torch.Tensor]]
    ) -> torch.Tensor:
        """The minibatch loss from the PPO terms and each extra term's loss: their sum here."""
        for _, extra in extras:
            ppo = ppo + extra
        return ppo

    # ---------------------------------------------------------------- the loop

    def critic_loss(self, batch: Batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The value loss alone (actors get no gradient) and its stats."""
        value_loss = self.value_loss(batch, self.evaluate(batch))
        loss = self.config.value_coef * value_loss
        return loss, {"value_loss": value_loss.detach(), "loss": loss.detach()}

    def update(self, storage: RolloutStorage, critic_only: bool = False) -> dict[str, float]:
        """Run the configured epochs over ``storage``'s rollout; returns mean stats.

        With the adaptive schedule the learning rate is adjusted before each optimiser step
        from that minibatch's KL, which reads one scalar from the device per minibatch; nothing
        else leaves the device until the stats are averaged at the end.

        ``critic_only`` fits the critics and leaves the actors (and the learning rate) as they
        are: the warm-up of trained actors paired with fresh critics, whose first advantages
        would otherwise be noise that undoes what the actors know.

        With :attr:`share` set, every process draws the same minibatches and learns from its
        share of each (:class:`~myriad.rl.row_share.RowShare`).
        """
        cfg = self.config
        prepared = self.prepare(storage)
        member_major = cfg.member_major and storage.equal_counts
        epochs = [
            storage.minibatch_indices(cfg.minibatches, member_major, self.generator)
            for _ in range(cfg.epochs)
        ]
        if self.share is not None:
            share, m = self.share, storage.num_members
            epochs = [[share.rows(i, m, member_major) for i in indices] for indices in epochs]
        self.plan_minibatches(storage, epochs)
        planned = self._plan_advantage_sums(storage, epochs, member_major)
        sums: dict[str, torch.Tensor] = {}
        count = 0
        steps = [
            (index, moment_sums)
            for indices, epoch_sums in zip(epochs, planned)
            for index, moment_sums in zip(indices, epoch_sums)
        ]

        def rows(k: int) -> Batch:
            batch = storage.batch(steps[k][0], blocked=member_major)
            batch.advantage_sums = steps[k][1]
            return batch

        # The rollout does not change during the update, so a minibatch's rows can be taken
        # before the previous step; they are, while the processes average gradients.
        batch = rows(0)
        for k in range(len(steps)):
            loss, stats = self.critic_loss(batch) if critic_only else self.loss(batch)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            # Ranks average gradients and stats (so the KL below).
            averaging = None if self.grad_sync is None else self.grad_sync(stats)
            if k + 1 < len(steps):
                batch = rows(k + 1)
            if averaging is not None:
                averaging()
            if cfg.desired_kl is not None and cfg.schedule == "adaptive" and not critic_only:
                self.set_lr(
                    losses.adaptive_lr(
                        self.lr,
                        float(stats["kl"]),
                        cfg.desired_kl,
                        cfg.lr_factor,
                        cfg.min_lr,
                        cfg.max_lr,
                    )
                )
            stats["grad_norm"] = torch.nn.utils.clip_grad_norm_(
                self.parameters, cfg.max_grad_norm
            ).detach()
            self.optimizer.step()
            for key, value in stats.items():
                sums[key] = sums[key] + value if key in sums else value.clone()
            count += 1
        keys = sorted(sums)
        means = (torch.stack([sums[k].float() for k in keys]) / count).tolist()
        result = dict(zip(keys, means))
        result.update(prepared)
        result["lr"] = self.lr
        result["explained_variance"] = float(
            losses.explained_variance(storage.values.flatten(), storage.returns.flatten())
        )
        self.finish(storage)
        return result

    # ---------------------------------------------------------------- checkpointing

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "optimizer": self.optimizer.state_dict(),
            "lr": self.lr,
            "entropy_coef": self.entropy_coef.detach().cpu().clone(),
        }
        if self.generator is not None:
            state["generator"] = self.generator.get_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.set_lr(state["lr"])
        self.set_entropy_coef(state["entropy_coef"])
        if self.generator is not None and "generator" in state:
            self.generator.set_state(state["generator"])


def ppo_config(cfg: Mapping[str, Any]) -> PPOConfig:
    """:class:`PPOConfig` from the ``ppo`` block (``desired_kl: null`` is a fixed rate, see
    :class:`PPOConfig`).

    Raises:
        ConfigError: an unknown key, or a value of the wrong type or range.
    """
    return from_config(PPOConfig, dict(cfg["ppo"]), "ppo")
