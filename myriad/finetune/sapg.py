"""SAPG: a leader that learns from its followers' data (docs/algorithms.md §6).

Member 0 is the leader, members 1..M-1 the followers. Every member runs PPO on its own rows with
its own entropy coefficient (:func:`~myriad.finetune.losses.sapg_entropy_coefficients`). The
leader also learns from the followers' rows through :class:`LeaderOffPolicyTerm`: a clipped
surrogate with the ratio ``pi_L(a|s) / pi_f_old(a|s)`` and the one-step TD advantage of the
leader's critic, ``r + gamma * V_L(s') - V_L(s)``, whose target also trains that critic.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from myriad.finetune.base import FinetuneAlgorithm
from myriad.finetune.losses import (
    dual_clipped_surrogate,
    effective_sample_size,
    leader_trust_region_surrogate,
    normalize,
    one_step_td,
    pooled_moments,
    sapg_entropy_coefficients,
)
from myriad.finetune.rows import Rows, follower_rows, leader_rows, sampled_follower_part
from myriad.nn.distributions import gaussian_kl
from myriad.nn.population import Evaluation, PopulationActorCritic
from myriad.rl.ppo import PPO, LossTerm, PPOConfig, RewardBonus
from myriad.rl.row_share import RowShare
from myriad.rl.storage import Batch, RolloutStorage
from myriad.utils.settings import at_least, check_fields, one_of, positive, setting

LEADER = 0
WEIGHTINGS = ("rows", "terms")
ADVANTAGE_MODES = ("augmented", "separate")
TRUST_REGIONS = ("behaviour", "leader")


def ensure_field(
    storage: RolloutStorage, name: str, trailing_shape: tuple[int, ...] = ()
) -> torch.Tensor:
    """The storage's extra field ``name`` ``[T, E, *trailing_shape]``, registered on first use."""
    if name in storage.extras:
        return storage.extras[name]
    return storage.register_field(name, trailing_shape)


def transitions(storage: RolloutStorage) -> tuple[torch.Tensor, torch.Tensor]:
    """``(obs, next_obs)`` of every step, ``[T * E, O]`` each, time-major.

    Raises:
        ValueError: the rollout was collected without ``store_transitions=True``.
    """
    if "next_obs" not in storage.extras:
        raise ValueError(
            "this algorithm needs the observation reached by every step: collect with "
            "RolloutCollector(..., store_transitions=True)"
        )
    return storage.flat("obs"), storage.flat("next_obs")


@torch.no_grad()
def state_and_next_values(
    model: PopulationActorCritic, member: int, storage: RolloutStorage
) -> tuple[torch.Tensor, torch.Tensor]:
    """``member``'s values ``V(s)`` and ``V(s')`` of every step of the rollout, ``[T * E]`` each,
    time-major (what :func:`transitions` pairs).

    The observation a step reaches is the next step's observation unless the episode ended there
    (then it is the final observation before the reset), so one critic pass over the states
    covers all but those steps and the last step's; only they are evaluated again. Which rows
    repeat is read by comparing the observations bit for bit, whatever the env; selecting the
    others reads their count from the device (one host sync).
    """
    obs, next_obs = transitions(storage)
    e = storage.num_envs
    values = model.value(obs, member)
    repeated = (next_obs[:-e] == obs[e:]).all(dim=1)  # [(T - 1) * E]
    last = torch.arange(obs.shape[0] - e, obs.shape[0], device=obs.device)
    others = torch.cat([torch.nonzero(~repeated).squeeze(1), last])
    next_values = torch.empty_like(values)
    next_values[:-e] = values[e:]
    next_values.index_copy_(0, others, model.value(next_obs.index_select(0, others), member))
    return values, next_values


class SampledLeaderTargets:
    """The leader's one-step TD advantages and targets of the rollout rows a sampled
    off-policy loss will read, computed before the update's first minibatch.

    With ``off_policy_ratio`` set, the off-policy term reads a sample of the follower rows of
    each minibatch (as many as the leader's own rows), so :meth:`SAPG.plan_minibatches` computes
    the targets of those rows only, from the critic as it is when the update begins (the
    values the stored path writes), in one critic pass over ``2 R`` states for ``R`` planned
    rows; :meth:`__call__` looks them up.

    Args:
        model: the population.
        leader: the leader's member index.
        storage: the rollout, collected with ``store_transitions=True``.
        gamma: the discount.
        rows: ``[R]`` time-major flat indices of the rows to compute (repeats allowed).
        log_probs: also the leader's log-probabilities of the rows' actions as the update
            begins (:attr:`old_log_prob`, for ``off_policy_trust_region="leader"``), one actor
            pass over the ``R`` rows, or read from ``rollout_log_prob``.
        rollout_log_prob: ``[T * E]`` those of every row, when the update computed them for
            another use (:meth:`SAPG.rollout_leader_log_prob`).
    """

    @torch.no_grad()
    def __init__(
        self,
        model: PopulationActorCritic,
        leader: int,
        storage: RolloutStorage,
        gamma: float,
        rows: torch.Tensor,
        log_probs: bool = False,
        rollout_log_prob: torch.Tensor | None = None,
    ) -> None:
        obs, next_obs = transitions(storage)
        r = rows.shape[0]
        #: ``[T * E]`` the leader's log-probabilities of the planned rows (NaN elsewhere), or None.
        self.old_log_prob: torch.Tensor | None = None
        if log_probs:
            if rollout_log_prob is not None:
                log_prob = rollout_log_prob.index_select(0, rows)
            else:
                actions = storage.flat("actions").index_select(0, rows)
                log_prob = model.log_prob(obs.index_select(0, rows), leader, actions)
            self.old_log_prob = log_prob.new_full((obs.shape[0],), math.nan)
            self.old_log_prob.index_copy_(0, rows, log_prob)
        values = model.value(
            torch.cat([obs.index_select(0, rows), next_obs.index_select(0, rows)]), leader
        )
        advantage, target = one_step_td(
            storage.rewards.reshape(-1).index_select(0, rows),
            values[:r],
            values[r:],
            storage.terminated.reshape(-1).index_select(0, rows),
            gamma,
        )
        # Rows outside the plan read NaN, so that a lookup the plan missed cannot pass as 0.
        self.advantage = values.new_full((obs.shape[0],), math.nan).index_copy_(0, rows, advantage)
        self.target = values.new_full((obs.shape[0],), math.nan).index_copy_(0, rows, target)

    def __call__(self, index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(advantage [B], target [B])`` of the planned rollout rows ``index [B]``."""
        return self.advantage.index_select(0, index), self.target.index_select(0, index)


def critic_scale(
    model: PopulationActorCritic, values: torch.Tensor, member: torch.Tensor | int
) -> torch.Tensor:
    """Values ``[N]`` of ``member``'s critic in the scale it is trained in (normalised with that
    member's statistics when value normalisation is on), like the PPO value loss."""
    return values if model.value_norm is None else model.value_norm.normalize(values, member)


@dataclass
class SAPGConfig:
    """SAPG's settings on top of :class:`~myriad.rl.PPOConfig`.

    Attributes:
        entropy_scale: the followers' entropy coefficients are ``0.5 * scale * i / (M - 1)``,
            the leader's 0.
        off_policy_coef: weight of the leader's loss on follower data.
        off_policy_value: also fit the leader's critic to the one-step targets
            ``r + gamma * V_L(s')`` on follower data (the authors do; off by default, see
            ``weighting``).
        off_policy_ratio: follower rows in the leader's off-policy loss per leader row of the
            minibatch, drawn equally from every follower (1: as much off-policy as on-policy
            data, as in SAPG); None uses every follower row.
        off_policy_dual_clip: bound of the off-policy loss of a negative-advantage sample, in
            units of ``|A|`` (dual-clip PPO); None leaves it unbounded as in plain PPO.
        off_policy_trust_region: the policy whose ratio PPO's clip bounds on the follower rows.
            ``"behaviour"`` (default, the authors'): ``pi_L / pi_f_old`` clipped at
            ``1 +- clip``. On rows where that ratio is already outside the clip, only the
            advantages of one sign pass a gradient, those that move ``pi_L`` towards ``pi_f``:
            with zero-mean advantages that carry no information about the action the leader is
            still pulled towards the followers' action distributions, wider when they are
            wider (docs/algorithms.md §6). ``"leader"``: the ratio ``pi_L / pi_L_old`` to the leader
            as the update begins, clipped at ``1 +- clip``, each row weighted by
            ``min(pi_L_old / pi_f_old, off_policy_truncation)`` (the trust region of GePPO,
            Queeney et al. 2021, with a truncated importance weight as in V-trace): no pull
            from zero-mean advantages that carry no information about the action.
        off_policy_truncation: the cap of that importance weight (``"leader"`` only).
        off_policy_normalize: normalise the one-step advantages over the minibatch's follower
            rows. Off by default: the leader's critic has not been trained on the followers'
            states, and normalising turns its errors there into unit-scale noise.
        schedule_kl: the KL that drives the adaptive learning rate: ``"leader"`` (the leader's
            rows only, so followers pulled toward the leader do not throttle its learning
            rate) or ``"all"`` (every row, as in PPO).
        weighting: ``"rows"``: the minibatch loss is one mean over every row of the augmented
            minibatch (the members' own rows, the leader's off-policy rows, CPO's AWAC rows),
            so each group weighs its share of the rows, as in the authors' code: at
            ``off_policy_ratio=1`` the leader's off-policy rows weigh as much as its own.
            ``"terms"`` (default): each term is the mean over its own rows times its
            coefficient (the off-policy term then weighs M times the leader's own PPO term).
            On the maze from a K-Myriad population the authors' form (``rows``, ``augmented``
            advantages, the critic fitted on the off-policy rows) left the leader at 0% in 5 of
            5 seeds of SAPG and CPO, this one reached 100% in 5 of 5 (SAPG) and 2 of 5 (CPO)
            (docs/finetune.md); the authors' form is the paper presets' (``algo=cpo_paper``).
        advantages: ``"augmented"``: every advantage of an update (the members' GAE
            advantages, the leader's one-step off-policy ones, CPO's AWAC ones) is normalised
            with one mean and std over the augmented batch, once per update, as the authors
            do. ``"separate"``: the on-policy rows per ``ppo.advantage_normalization``, the
            off-policy rows per ``off_policy_normalize``, AWAC advantages raw.
    """

    entropy_scale: float = setting(
        0.01,
        help="follower i's entropy coefficient is 0.5 scale i / (M - 1); the leader's 0",
        check=at_least(0),
    )
    off_policy_coef: float = setting(
        1.0, help="weight of the leader's loss on the followers' data", check=at_least(0)
    )
    off_policy_value: bool = setting(
        False, help="also fit the leader's critic to r + gamma V_L(s') there (the authors: true)"
    )
    off_policy_ratio: float | None = setting(
        1.0, help="follower rows per leader row in that loss (null: all of them)", check=positive()
    )
    off_policy_dual_clip: float | None = setting(
        3.0,
        help="bound of a negative-advantage sample's loss, x |A| (null: none)",
        check=positive(),
    )
    off_policy_trust_region: str = setting(
        "behaviour",
        help="behaviour: clip pi_L / pi_follower (the authors') | leader: clip pi_L / pi_L_old "
        "(the leader at the update's start), rows weighted by min(pi_L_old / pi_follower, "
        "truncation)",
        check=one_of(*TRUST_REGIONS),
    )
    off_policy_truncation: float = setting(
        1.0, help="cap of that weight (trust region leader only)", check=positive()
    )
    off_policy_normalize: bool = setting(
        False, help="normalise the one-step advantages over the follower rows"
    )
    schedule_kl: str = setting(
        "leader",
        help="KL of the adaptive learning rate: the leader's rows or all rows",
        check=one_of("leader", "all"),
    )
    weighting: str = setting(
        "terms",
        help="terms: each term a mean over its own rows | rows: one mean over the augmented "
        "minibatch (the authors')",
        check=one_of(*WEIGHTINGS),
    )
    advantages: str = setting(
        "separate",
        help="separate: per member and minibatch | augmented: one mean / std per update over "
        "every advantage (the authors')",
        check=one_of(*ADVANTAGE_MODES),
    )

    def __post_init__(self) -> None:
        check_fields(self)


class LeaderOffPolicyTerm:
    """The leader's PPO loss on the followers' rows of a minibatch.

    The one-step advantages and targets of the selected rows come from :attr:`targets` when
    :meth:`SAPG.plan_minibatches` set it (a sampled loss), else from
    ``batch.extras["leader_td_advantage"]`` and ``["leader_td_target"]`` (``[B]``, stored by
    :meth:`SAPG.prepare`).

    Args:
        coef: weight of the term.
        fit_value: add the leader critic's squared error to the one-step targets.
        leader: the leader's member index.
        ratio: follower rows used per leader row (None: all); see :class:`SAPGConfig`.
        dual_clip: bound of a negative-advantage sample's loss in units of ``|A|`` (None: none).
        normalize_advantages: normalise the advantages over the follower rows.
        trust_region: ``"behaviour"`` or ``"leader"``, see :class:`SAPGConfig`.
        truncation: the cap of the importance weight with ``trust_region="leader"``.

    Stats: ``off_policy_loss``, ``off_policy_value_loss``, ``off_policy_clip_fraction`` (the
    fraction of the rows whose clipped ratio lies outside ``1 +- clip``: ``pi_L / pi_f_old``
    with ``trust_region="behaviour"``, ``pi_L / pi_L_old`` with ``"leader"``) and
    ``leader_ess``, the normalised effective sample size ``(sum w)^2 / (n sum w^2)`` of the
    weights ``w = pi_L / pi_f_old`` on the minibatch's follower rows.
    """

    def __init__(
        self,
        coef: float = 1.0,
        fit_value: bool = True,
        leader: int = LEADER,
        ratio: float | None = None,
        dual_clip: float | None = None,
        normalize_advantages: bool = True,
        trust_region: str = "behaviour",
        truncation: float = 1.0,
    ) -> None:
        if trust_region not in TRUST_REGIONS:
            raise ValueError(f"trust_region must be one of {TRUST_REGIONS}, got {trust_region!r}")
        self.coef = float(coef)
        self.trust_region = trust_region
        self.truncation = float(truncation)
        self.fit_value = fit_value
        self.leader = leader
        self.ratio = ratio
        self.dual_clip = dual_clip
        self.normalize_advantages = normalize_advantages
        #: The targets of sampled rows, when the rollout does not store them.
        self.targets: SampledLeaderTargets | None = None
        #: Processes that split each minibatch (:class:`~myriad.rl.row_share.RowShare`): the
        #: sample per follower is sized from the whole minibatch and split between them.
        self.shards = 1

    def _td(self, batch: Batch, rows: Rows) -> tuple[torch.Tensor, torch.Tensor]:
        """The leader's one-step ``(advantage, target)`` of the selected rows."""
        if self.targets is not None:
            return self.targets(rows.take(batch.index))
        if "leader_td_advantage" not in batch.extras:
            raise RuntimeError("SAPG.update sets the leader's targets before the first minibatch")
        extras = batch.extras
        return rows.take(extras["leader_td_advantage"]), rows.take(extras["leader_td_target"])

    def _old_log_prob(self, batch: Batch, rows: Rows) -> torch.Tensor:
        """The leader's log-probabilities of the selected rows' actions as the update began."""
        if self.targets is not None:
            assert self.targets.old_log_prob is not None  # planned with log_probs=True
            return self.targets.old_log_prob.index_select(0, rows.take(batch.index))
        return rows.take(batch.extras["leader_old_log_prob"])

    def augmented_rows(self, batch: Batch) -> float | torch.Tensor:
        """How many rows the term adds to the augmented minibatch: the follower rows it
        reads (a count, or a sum of the row mask)."""
        per_follower = self.per_follower(len(batch), batch.num_members)
        rows = follower_rows(batch, self.leader, per_follower)
        if rows.weight is not None:
            return rows.weight.sum()
        return float(rows.take(batch.member).shape[0])

    def per_follower(self, rows: int, num_members: int) -> int | None:
        """Follower rows the term reads per follower from a blocked minibatch of ``rows`` rows
        (None: all of them). When :attr:`shards` processes hold ``rows`` rows each of one
        minibatch, the sample is sized from the whole minibatch and each process reads its
        share, rounded up (the one-process sample when ``shards`` divides it)."""
        if self.ratio is None or num_members < 2:
            return None
        n = rows // num_members
        whole = n * self.shards
        sample = min(whole, max(1, math.ceil(self.ratio * whole / (num_members - 1))))
        return min(n, math.ceil(sample / self.shards))

    def __call__(
        self, algorithm: PPO, batch: Batch, evaluation: Evaluation
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        per_follower = self.per_follower(len(batch), batch.num_members)
        rows = follower_rows(batch, self.leader, per_follower)
        cfg = algorithm.config
        behaviour = rows.take(batch.log_probs)
        model = algorithm.model
        obs, actions = rows.take(batch.obs), rows.take(batch.actions)
        # The leader's critic is only needed when it is fitted here.
        leader_eval = model.evaluate(obs, self.leader, actions) if self.fit_value else None
        log_prob = (
            leader_eval.log_prob
            if leader_eval is not None
            else model.log_prob(obs, self.leader, actions)
        )
        advantages, target = self._td(batch, rows)
        if algorithm.advantage_moments is not None:
            mean, std = algorithm.advantage_moments
            advantages = (advantages - mean) / (std + 1e-8)
        elif self.normalize_advantages:
            advantages = normalize(advantages, rows.weight)
        if self.trust_region == "leader":
            anchor = self._old_log_prob(batch, rows)
            per_row = leader_trust_region_surrogate(
                log_prob, anchor, behaviour, advantages, cfg.clip, self.dual_clip, self.truncation
            )
        else:
            anchor = behaviour
            per_row = dual_clipped_surrogate(
                log_prob, behaviour, advantages, cfg.clip, self.dual_clip
            )
        surrogate = rows.mean(per_row)
        loss = surrogate
        stats: dict[str, torch.Tensor] = {}
        if leader_eval is not None:
            value_loss = rows.mean(
                (
                    critic_scale(model, leader_eval.value, self.leader)
                    - critic_scale(model, target, self.leader)
                ).square()
            )
            loss = loss + cfg.value_coef * value_loss
            stats["off_policy_value_loss"] = value_loss.detach()
        with torch.no_grad():
            log_w = log_prob - behaviour
            stats["off_policy_loss"] = surrogate.detach()
            stats["leader_ess"] = effective_sample_size(log_w, rows.weight)
            outside = ((torch.exp(log_prob - anchor) - 1.0).abs() > cfg.clip).to(log_w.dtype)
            stats["off_policy_clip_fraction"] = rows.mean(outside)
        return self.coef * loss, stats


class SAPG(FinetuneAlgorithm):
    """PPO for a leader (member 0) and followers, with the leader also learning off-policy.

    Args:
        model: the population, M >= 2.
        config: PPO hyperparameters (its ``entropy_coef`` is replaced by SAPG's schedule).
        sapg: SAPG's settings.
        extra_terms: further loss terms, after the leader's off-policy term.
        generator: minibatch shuffling.
        optimizer: default Adam over the model.

    Needs rollouts collected with ``store_transitions=True`` (``next_obs``).
    """

    needs_transitions = True
    rank_split = "rows"

    @property
    def leader(self) -> int:
        return LEADER

    def __init__(
        self,
        model: PopulationActorCritic,
        config: PPOConfig | None = None,
        sapg: SAPGConfig | None = None,
        *,
        extra_terms: Iterable[LossTerm] = (),
        generator: torch.Generator | None = None,
        optimizer: torch.optim.Optimizer | None = None,
    ) -> None:
        if model.num_members < 2:
            raise ValueError(
                f"{type(self).__name__} needs a leader and at least one follower: "
                f"population size >= 2, got {model.num_members}"
            )
        self.sapg = sapg or SAPGConfig()
        self.off_policy = off_policy = LeaderOffPolicyTerm(
            self.sapg.off_policy_coef,
            self.sapg.off_policy_value,
            self.leader,
            self.sapg.off_policy_ratio,
            self.sapg.off_policy_dual_clip,
            self.sapg.off_policy_normalize,
            self.sapg.off_policy_trust_region,
            self.sapg.off_policy_truncation,
        )
        super().__init__(
            model,
            config,
            extra_terms=[off_policy, *extra_terms],
            generator=generator,
            optimizer=optimizer,
        )
        self.set_entropy_coef(sapg_entropy_coefficients(model.num_members, self.sapg.entropy_scale))

    def set_share(self, share: RowShare | None) -> None:
        super().set_share(share)
        self.off_policy.shards = 1 if share is None else share.world_size

    def own_columns(self, x: torch.Tensor) -> torch.Tensor:
        """``x [T, E, ...]`` restricted to this process's block of envs when the update is
        split (the part of a per-row quantity this process computes), else all of it."""
        block = None if self.share is None else self.share.block(x.shape[1])
        return x if block is None else x[:, block]

    def schedule_kl(
        self, batch: Batch, evaluation: Evaluation, approx: torch.Tensor
    ) -> torch.Tensor:
        """With ``schedule_kl="leader"`` and stored behaviour distributions, the exact KL on the
        leader's rows; else PPO's."""
        # The storage keeps the behaviour means and log-stds together, or neither.
        if self.sapg.schedule_kl != "leader" or batch.means is None or batch.log_stds is None:
            return super().schedule_kl(batch, evaluation, approx)
        rows = leader_rows(batch, self.leader)
        kl = gaussian_kl(
            rows.take(batch.means),
            rows.take(batch.log_stds),
            rows.take(evaluation.mean),
            rows.take(evaluation.log_std),
        )
        return rows.mean(kl)

    def reward_bonus(self, storage: RolloutStorage) -> RewardBonus | None:
        """Rewards added to the task reward for the members' own returns (None: nothing). The
        leader's off-policy targets always use the task reward alone."""
        return None

    def prepare(self, storage: RolloutStorage) -> dict[str, float]:
        """PPO's preparation (GAE on the rewards plus :meth:`reward_bonus`, value statistics),
        then the leader's one-step targets of every row, unless they are sampled."""
        stats = super().prepare(storage)
        self.off_policy.targets = None
        if not self.samples_leader_targets(storage):
            self._store_leader_targets(storage)
        return stats

    def rollout_leader_log_prob(self, storage: RolloutStorage) -> torch.Tensor | None:
        """``[T * E]`` the leader's log-probabilities of every row's action as this update
        begins, when the update computed them for another use before :meth:`prepare`'s
        targets (CPO's KL penalty), else None."""
        return None

    def samples_leader_targets(self, storage: RolloutStorage) -> bool:
        """Whether the leader's targets are computed for the sampled follower rows only
        (:class:`SampledLeaderTargets`) rather than stored for every row: when the off-policy
        loss samples (``off_policy_ratio`` set) from member-major minibatches. Other
        minibatches select every follower row by mask, and every row's targets are needed."""
        member_major = self.config.member_major and storage.equal_counts
        return self.sapg.off_policy_ratio is not None and member_major

    def plan_minibatches(self, storage: RolloutStorage, epochs: list[list[torch.Tensor]]) -> None:
        """With sampled targets: those of every row the off-policy term will read. Then, with
        ``advantages="augmented"``, the moments that normalise every advantage of the update."""
        planned: torch.Tensor | None = None
        if self.samples_leader_targets(storage):
            m = self.model.num_members
            parts = []
            for index in (index for indices in epochs for index in indices):
                per_follower = self.off_policy.per_follower(index.shape[0], m)
                assert per_follower is not None  # off_policy_ratio is set
                part = sampled_follower_part(
                    index.shape[0], m, self.leader, per_follower, index.device
                )
                parts.append(index.index_select(0, part))
            planned = torch.cat(parts)
            self.off_policy.targets = SampledLeaderTargets(
                self.model,
                self.leader,
                storage,
                self.config.gamma,
                planned,
                log_probs=self.off_policy.trust_region == "leader",
                rollout_log_prob=self.rollout_leader_log_prob(storage),
            )
        if self.sapg.advantages == "augmented":
            groups = self.advantage_groups(storage, planned, len(epochs))
            reduce = None if self.share is None else self.share.all_reduce
            self.advantage_moments = pooled_moments(groups, all_reduce=reduce)

    def advantage_groups(
        self, storage: RolloutStorage, planned: torch.Tensor | None, epochs: int
    ) -> list[tuple[torch.Tensor, float]]:
        """The groups of advantages of the augmented batch, ``(sample, rows per pass)``: the
        members' GAE advantages (every row) and the leader's one-step advantages of the
        follower rows its off-policy loss reads (the planned rows, or every follower row).
        When the update is split, this process's part of each (its envs' rows, its planned
        rows), which :func:`pooled_moments` sums over the processes."""
        on_policy = self.own_columns(storage.advantages).reshape(-1)
        groups = [(on_policy, float(on_policy.shape[0]))]
        if self.off_policy.targets is not None and planned is not None:
            groups.append((self.off_policy.targets.advantage[planned], planned.shape[0] / epochs))
        else:
            follower = storage.member != self.leader
            is_follower = self.own_columns(follower.expand_as(storage.rewards)).reshape(-1)
            td = self.own_columns(storage.extras["leader_td_advantage"]).reshape(-1)
            td = td[is_follower]
            groups.append((td, float(td.shape[0])))
        return groups

    def combine(
        self, batch: Batch, ppo: torch.Tensor, extras: Sequence[tuple[LossTerm, torch.Tensor]]
    ) -> torch.Tensor:
        """With ``weighting="rows"``: one mean over the augmented minibatch. Every term's loss
        is a mean over its own rows; a term that adds rows (``augmented_rows``) enters with its
        row count, any other as a per-row addition to the members' own rows."""
        if self.sapg.weighting == "terms":
            return super().combine(batch, ppo, extras)
        own = float(len(batch))
        total: float | torch.Tensor = own
        weighted = ppo * own
        for term, extra in extras:
            rows = getattr(term, "augmented_rows", None)
            n = own if rows is None else rows(batch)
            if rows is not None:
                total = total + n
            weighted = weighted + extra * n
        return weighted / total

    @torch.no_grad()
    def _store_leader_targets(self, storage: RolloutStorage) -> None:
        values, next_values = state_and_next_values(self.model, self.leader, storage)
        advantage, target = one_step_td(
            storage.rewards.reshape(-1),
            values,
            next_values,
            storage.terminated.reshape(-1),
            self.config.gamma,
        )
        ensure_field(storage, "leader_td_advantage").view(-1).copy_(advantage)
        ensure_field(storage, "leader_td_target").view(-1).copy_(target)
        if self.off_policy.trust_region == "leader":
            log_prob = self.rollout_leader_log_prob(storage)
            if log_prob is None:
                obs, actions = storage.flat("obs"), storage.flat("actions")
                log_prob = self.model.log_prob(obs, self.leader, actions)
            ensure_field(storage, "leader_old_log_prob").view(-1).copy_(log_prob)
