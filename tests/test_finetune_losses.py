"""Finetuning loss pieces against values computed by hand on tiny batches."""

from __future__ import annotations

import copy
import math
import re

import pytest
import torch

from myriad.finetune.cpo import CPO, AWACPullTerm, CPOConfig
from myriad.finetune.losses import (
    awac_loss,
    awac_weights,
    discriminator_bonus,
    effective_sample_size,
    kl_penalized_advantages,
    leader_trust_region_surrogate,
    one_step_td,
    sapg_entropy_coefficients,
)
from myriad.finetune.sapg import SAPG, LeaderOffPolicyTerm, SAPGConfig
from myriad.nn import PopulationActorCritic, gaussian_log_prob
from myriad.rl import PPOConfig, RolloutStorage
from myriad.rl.storage import Batch


def tiny_model(members: int = 2, obs_dim: int = 3, action_dim: int = 1) -> PopulationActorCritic:
    torch.manual_seed(0)
    return PopulationActorCritic(
        obs_dim,
        action_dim,
        members,
        actor_hidden=(8,),
        critic_hidden=(8,),
        normalize_obs=False,
        normalize_value=False,
    )


def test_one_step_td_bootstraps_unless_terminated():
    adv, target = one_step_td(
        rewards=torch.tensor([1.0, 0.0, 0.5]),
        values=torch.tensor([0.5, 0.2, 0.0]),
        next_values=torch.tensor([0.4, 1.0, 2.0]),
        terminated=torch.tensor([False, True, False]),
        gamma=0.9,
    )
    torch.testing.assert_close(target, torch.tensor([1.36, 0.0, 2.3]))
    torch.testing.assert_close(adv, torch.tensor([0.86, -0.2, 2.3]))


def test_effective_sample_size():
    w = torch.tensor([1.0, 2.0, 3.0])
    assert effective_sample_size(w.log()).item() == pytest.approx(36.0 / 42.0)
    # Equal weights: ESS/n = 1; one dominating weight: 1/n (no overflow at e^500).
    assert effective_sample_size(torch.full((5,), 7.0)).item() == pytest.approx(1.0)
    assert effective_sample_size(torch.tensor([0.0, 500.0])).item() == pytest.approx(0.5)
    # A mask restricts the sample: weights 1 and 3 -> 16 / (2 * 10).
    mask = torch.tensor([1.0, 0.0, 1.0])
    assert effective_sample_size(w.log(), mask).item() == pytest.approx(0.8)


def test_kl_penalty_applies_to_followers_only():
    out = kl_penalized_advantages(
        torch.tensor([1.0, 2.0, 3.0]),
        log_prob_follower=torch.tensor([-1.0, -2.0, -0.5]),
        log_prob_leader=torch.tensor([-1.5, -1.0, -4.0]),
        coef=0.2,
        is_follower=torch.tensor([True, True, False]),
    )
    torch.testing.assert_close(out, torch.tensor([0.9, 2.2, 3.0]))


def test_awac_weights_are_clipped_at_100():
    a = torch.tensor([0.0, 1.0, math.log(100.0) + 1.0, 1e4])
    torch.testing.assert_close(
        awac_weights(a, temperature=1.0), torch.tensor([1.0, math.e, 100.0, 100.0])
    )
    torch.testing.assert_close(awac_weights(torch.tensor([2.0]), 2.0), torch.tensor([math.e]))
    assert torch.isfinite(awac_weights(torch.tensor([1e30]), 1e-3)).all()
    with pytest.raises(ValueError, match="temperature"):
        awac_weights(a, 0.0)


def test_awac_loss_value_and_mask():
    log_prob = torch.tensor([[-1.0, -2.0], [-0.5, -4.0]], requires_grad=True)  # [F=2, N=2]
    weights = torch.tensor([[1.0, 100.0], [2.0, 0.5]])
    loss = awac_loss(log_prob, weights, coef=0.1)
    # -0.1 * mean(-1, -200, -1, -2) = 0.1 * 204 / 4
    assert loss.item() == pytest.approx(5.1)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, -0.1 * weights / 4)
    masked = awac_loss(log_prob.detach(), weights, coef=0.1, mask=torch.tensor([1.0, 0.0]))
    assert masked.item() == pytest.approx(0.1 * (1.0 + 1.0) / 2)


def test_discriminator_bonus():
    bonus = discriminator_bonus(
        torch.tensor([-0.1, -3.0, -50.0]),
        torch.tensor([0, 1, 2]),
        coef=0.5,
        leader=0,
        floor=-10.0,
    )
    expected = torch.tensor([0.0, 0.5 * -3.0, 0.5 * -10.0])
    torch.testing.assert_close(bonus, expected)


def test_sapg_entropy_coefficients():
    torch.testing.assert_close(
        sapg_entropy_coefficients(5, 0.1), torch.tensor([0.0, 0.0125, 0.025, 0.0375, 0.05])
    )


def _batch(model: PopulationActorCritic, member: list[int], blocked: bool, **extras) -> Batch:
    torch.manual_seed(1)
    n = len(member)
    obs = torch.randn(n, model.obs_dim)
    actions = torch.randn(n, model.action_dim)
    zeros = torch.zeros(n)
    return Batch(
        obs=obs,
        actions=actions,
        log_probs=zeros.clone(),
        values=zeros.clone(),
        advantages=zeros.clone(),
        returns=zeros.clone(),
        member=torch.tensor(member),
        index=torch.arange(n),
        blocked=blocked,
        num_members=model.num_members,
        extras=dict(extras),
    )


@pytest.mark.parametrize("blocked", [True, False])
def test_leader_off_policy_term_clips_ratio_and_uses_td_advantages(blocked):
    model = tiny_model()
    algo = SAPG(model, PPOConfig(clip=0.2, value_coef=0.5))
    # Rows 0, 1: the leader's own; rows 2, 3: follower 1's (blocked layout). The unblocked
    # variant lists the same rows in another order.
    member = [0, 0, 1, 1] if blocked else [1, 0, 1, 0]
    rows_f = [2, 3] if blocked else [0, 2]
    batch = _batch(
        model,
        member,
        blocked,
        leader_td_advantage=torch.zeros(4),
        leader_td_target=torch.tensor([9.0, 9.0, 1.0, -1.0]),
    )
    batch.extras["leader_td_advantage"][rows_f] = torch.tensor([3.0, 1.0])  # normalised: 1, -1
    leader = model.evaluate(batch.obs, 0, batch.actions)
    ratio = torch.tensor([1.5, 0.9])  # pi_L / pi_f_old on the two follower rows
    batch.log_probs[rows_f] = leader.log_prob[rows_f].detach() - ratio.log()
    term = LeaderOffPolicyTerm(coef=2.0, fit_value=True, leader=0)
    loss, stats = term(algo, batch, None)
    # A = +1: -min(1.5, 1.2) = -1.2; A = -1: -min(-0.9, -0.9) = 0.9.
    surrogate = (-1.2 + 0.9) / 2
    value_loss = (
        (leader.value[rows_f].detach() - batch.extras["leader_td_target"][rows_f]).square().mean()
    )
    assert stats["off_policy_loss"].item() == pytest.approx(surrogate, abs=1e-5)
    assert loss.item() == pytest.approx(2.0 * (surrogate + 0.5 * value_loss.item()), abs=1e-5)
    assert stats["leader_ess"].item() == pytest.approx(2.4**2 / (2 * (1.5**2 + 0.9**2)), 1e-5)
    assert stats["off_policy_clip_fraction"].item() == pytest.approx(0.5)
    # The clipped row (ratio 1.5 > 1.2 with A > 0) passes no policy gradient: only row 0.9 does.
    model.zero_grad()
    LeaderOffPolicyTerm(coef=1.0, fit_value=False)(algo, batch, None)[0].backward()
    head = model.actor.head.weight.grad
    assert head[1].abs().sum() == 0  # the follower's head is untouched by the leader's loss
    assert head[0].abs().sum() > 0


def test_off_policy_subsample_takes_equal_share_of_each_follower():
    model = tiny_model(members=3)
    algo = SAPG(model, PPOConfig())
    batch = _batch(
        model,
        [0] * 4 + [1] * 4 + [2] * 4,
        True,
        leader_td_advantage=torch.arange(12.0),
        leader_td_target=torch.zeros(12),
    )
    seen = {}

    def spy(obs, member, actions, blocked=False):
        seen["obs"] = obs
        return PopulationActorCritic.evaluate(model, obs, member, actions, blocked)

    model.evaluate = spy  # type: ignore[method-assign]
    LeaderOffPolicyTerm(ratio=1.0)(algo, batch, None)
    # ratio 1: as many follower rows as leader rows (4), two from each follower's block.
    torch.testing.assert_close(seen["obs"], batch.obs[[4, 5, 8, 9]])


def _storage(member: list[int], num_steps: int = 3, obs_dim: int = 3) -> RolloutStorage:
    storage = RolloutStorage(num_steps, torch.tensor(member), obs_dim, 1, num_members=2)
    storage.register_field("next_obs", (obs_dim,))
    torch.manual_seed(2)
    for _ in range(num_steps):
        storage.add(
            obs=torch.randn(len(member), obs_dim),
            actions=torch.randn(len(member), 1),
            log_prob=torch.randn(len(member)),
            value=torch.randn(len(member)),
            reward=torch.randn(len(member)),
            terminated=torch.rand(len(member)) < 0.3,
            truncated=torch.zeros(len(member), dtype=torch.bool),
            next_obs=torch.randn(len(member), obs_dim),
        )
    return storage


def test_sapg_prepare_writes_leader_td_targets():
    # Every follower row in the off-policy loss: the targets of every row are stored.
    model = tiny_model()
    algo = SAPG(model, PPOConfig(gamma=0.9), SAPGConfig(off_policy_ratio=None))
    storage = _storage([0, 1, 1, 0])
    algo.prepare(storage)
    obs, next_obs = storage.flat("obs"), storage.flat("next_obs")
    with torch.no_grad():
        v, v_next = model.value(obs, 0), model.value(next_obs, 0)
    r, term = storage.rewards.reshape(-1), storage.terminated.reshape(-1).float()
    target = r + 0.9 * (1 - term) * v_next
    torch.testing.assert_close(storage.flat("leader_td_target"), target)
    torch.testing.assert_close(storage.flat("leader_td_advantage"), target - v)
    torch.testing.assert_close(algo.entropy_coef, torch.tensor([0.0, 0.005]))


def test_sampled_leader_targets_are_the_stored_ones_of_the_planned_rows():
    # A sampled off-policy loss (the default ratio) computes, before the first minibatch, the
    # targets of the rows it will read: the values the stored path writes.
    model = tiny_model()
    stored = SAPG(copy.deepcopy(model), PPOConfig(gamma=0.9), SAPGConfig(off_policy_ratio=None))
    sampled = SAPG(model, PPOConfig(gamma=0.9))
    storage = _storage([0, 1, 1, 0])
    sampled_storage = copy.deepcopy(storage)
    stored.prepare(storage)
    advantage = storage.flat("leader_td_advantage").clone()
    target = storage.flat("leader_td_target").clone()
    sampled.prepare(sampled_storage)
    assert sampled.off_policy.targets is None and "leader_td_target" not in sampled_storage.extras
    # Minibatches of 4 member-major rows, 2 per member: with one follower and ratio 1 the term
    # reads both of the follower's rows, and none of the leader's.
    epochs = [
        [torch.tensor([0, 3, 1, 2]), torch.tensor([4, 7, 6, 5])],
        [torch.tensor([8, 11, 9, 10])],
    ]
    sampled.plan_minibatches(sampled_storage, epochs)
    targets = sampled.off_policy.targets
    assert targets is not None and stored.off_policy.targets is None
    planned = torch.tensor([1, 2, 6, 5, 9, 10])
    got_advantage, got_target = targets(planned)
    torch.testing.assert_close(got_advantage, advantage[planned])
    torch.testing.assert_close(got_target, target[planned])
    # A row outside the plan reads NaN rather than a plausible number.
    assert torch.isnan(targets(torch.tensor([0]))[1]).all()
    # Minibatches that are not member-major select every follower row: the targets are stored.
    unequal = SAPG(tiny_model(), PPOConfig(gamma=0.9))
    assert not unequal.samples_leader_targets(_storage([0, 1, 1, 1]))
    assert sampled.samples_leader_targets(storage)


def test_cpo_prepare_writes_the_leaders_log_probs_of_every_action():
    model = tiny_model()
    algo = CPO(model, PPOConfig(), cpo=CPOConfig(awac=False, adversarial=False))
    storage = _storage([0, 1, 1, 0])
    algo.prepare(storage)
    obs, actions = storage.flat("obs"), storage.flat("actions")
    with torch.no_grad():
        expected = model.evaluate(obs, 0, actions).log_prob
        own = model.evaluate(obs, storage.member.repeat(storage.num_steps), actions).log_prob
    torch.testing.assert_close(storage.flat("leader_log_prob"), expected)
    assert not torch.allclose(expected, own)  # the followers' rows really use the leader


def test_log_prob_is_evaluate_without_the_critic():
    model = tiny_model()
    obs, actions = torch.randn(6, 3), torch.randn(6, 1)
    member = torch.tensor([0, 1, 1, 0, 1, 0])
    torch.testing.assert_close(
        model.log_prob(obs, member, actions), model.evaluate(obs, member, actions).log_prob
    )


def test_cpo_kl_penalty_on_minibatch_advantages():
    model = tiny_model()
    algo = CPO(
        model,
        PPOConfig(advantage_normalization="none"),
        cpo=CPOConfig(kl_preset="high", awac=False, adversarial=False),
    )
    batch = _batch(model, [0, 0, 1, 1], True, leader_log_prob=torch.tensor([0.0, 0.0, -1.0, 1.0]))
    batch.advantages = torch.tensor([1.0, 2.0, 3.0, 4.0])
    batch.log_probs = torch.tensor([5.0, 5.0, -2.0, 0.5])
    # Followers: 3 - 0.3 * (-2 + 1) = 3.3 and 4 - 0.3 * (0.5 - 1) = 4.15; leader unchanged.
    torch.testing.assert_close(algo.advantages(batch), torch.tensor([1.0, 2.0, 3.3, 4.15]))
    explicit = CPOConfig(kl_preset="light", kl_coef=0.5)
    assert explicit.kl_lambda == 0.5 and CPOConfig(kl_preset="balanced").kl_lambda == 0.2
    with pytest.raises(ValueError, match=re.escape("light (0.1), balanced (0.2), high (0.3)")):
        CPOConfig(kl_preset="medium")


def test_awac_term_pairs_each_follower_with_its_weights():
    model = tiny_model(members=3)
    algo = CPO(
        model, PPOConfig(), cpo=CPOConfig(adversarial=False, kl_penalty=False, kl_target=None)
    )
    weights = torch.zeros(6, 3)
    weights[:2] = torch.tensor([[7.0, 1.0, 100.0], [7.0, 3.0, 0.5]])  # leader rows 0, 1
    batch = _batch(model, [0, 0, 1, 1, 2, 2], True, awac_weight=weights)
    loss, stats = AWACPullTerm(coef=0.1, leader=0)(algo, batch, None)
    expected = 0.0
    with torch.no_grad():
        for f in (1, 2):
            mean, log_std = model.action_params(batch.obs[:2], f)
            lp = gaussian_log_prob(batch.actions[:2], mean, log_std)
            expected += (weights[:2, f] * lp).sum()
    assert loss.item() == pytest.approx(-0.1 * expected.item() / 4, rel=1e-5)
    assert stats["awac_weight"].item() == pytest.approx((1 + 3 + 100 + 0.5) / 4)


def test_cpo_awac_weights_from_follower_critics():
    model = tiny_model()
    # Raw advantages: the weights of the normalised ones are checked in test_cpo_fidelity.py.
    algo = CPO(
        model,
        PPOConfig(gamma=0.5),
        SAPGConfig(advantages="separate"),
        CPOConfig(adversarial=False, awac_temperature=0.5),
    )
    storage = _storage([1, 0, 0, 1])
    algo.prepare(storage)
    algo.plan_minibatches(storage, [storage.minibatch_indices(1, True, None)])
    leader_envs = [1, 2]
    obs = storage.obs[:, leader_envs].reshape(-1, 3)
    next_obs = storage.extras["next_obs"][:, leader_envs].reshape(-1, 3)
    r = storage.rewards[:, leader_envs].reshape(-1)
    term = storage.terminated[:, leader_envs].reshape(-1).float()
    with torch.no_grad():
        a = r + 0.5 * (1 - term) * model.value(next_obs, 1) - model.value(obs, 1)
    expected = torch.exp(a / 0.5).clamp(max=100.0)
    got = storage.extras["awac_weight"][:, leader_envs, 1].reshape(-1)
    torch.testing.assert_close(got, expected)


def test_learning_rate_schedule_follows_the_leaders_kl():
    model = tiny_model()
    batch = _batch(model, [0, 0, 1, 1], True)
    with torch.no_grad():
        mean, log_std = model.action_params(batch.obs, batch.member, blocked=True)
    batch.means = mean + torch.tensor([[0.1], [0.2], [3.0], [3.0]])  # followers moved far
    batch.log_stds = log_std.clone()
    evaluation = model.evaluate(batch.obs, batch.member, batch.actions, blocked=True)
    leader_only = SAPG(model, PPOConfig(), SAPGConfig(schedule_kl="leader"))
    every_row = SAPG(model, PPOConfig(), SAPGConfig(schedule_kl="all"))
    std2 = torch.exp(2 * log_std[:2, 0].detach())
    expected = (torch.tensor([0.1, 0.2]) ** 2 / (2 * std2)).mean()
    kl = leader_only.ppo_loss(batch, evaluation)[1]["kl"]
    assert kl.item() == pytest.approx(expected.item(), rel=1e-4)
    assert every_row.ppo_loss(batch, evaluation)[1]["kl"] > 10 * kl


def test_leader_trust_region_clips_the_step_from_the_leader_and_weights_each_row():
    # off_policy_trust_region="leader": the clip bounds pi_L / pi_L_old, and each follower row
    # counts with min(pi_L_old / pi_f_old, truncation).
    model = tiny_model()
    algo = SAPG(model, PPOConfig(clip=0.2))
    batch = _batch(
        model,
        [0, 0, 1, 1],
        True,
        leader_td_advantage=torch.tensor([0.0, 0.0, 1.0, -1.0]),
        leader_td_target=torch.zeros(4),
        leader_old_log_prob=torch.zeros(4),
    )
    current = model.log_prob(batch.obs, 0, batch.actions).detach()
    step = torch.tensor([1.5, 0.9])  # pi_L / pi_L_old on the follower rows 2, 3
    weight = torch.tensor([2.0, 0.25])  # pi_L_old / pi_f_old there, before truncation at 1
    batch.extras["leader_old_log_prob"][2:] = current[2:] - step.log()
    batch.log_probs[2:] = batch.extras["leader_old_log_prob"][2:] - weight.log()
    term = LeaderOffPolicyTerm(
        fit_value=False, leader=0, normalize_advantages=False, trust_region="leader"
    )
    _, stats = term(algo, batch, None)
    # A = +1, step 1.5: -min(1.5, 1.2) = -1.2, weight min(2, 1) = 1; A = -1, step 0.9:
    # -min(-0.9, -0.9) = 0.9, weight 0.25.
    assert stats["off_policy_loss"].item() == pytest.approx((-1.2 + 0.25 * 0.9) / 2, abs=1e-5)
    # The clip fraction counts the step from the leader's start (1.5 is outside, 0.9 inside).
    assert stats["off_policy_clip_fraction"].item() == pytest.approx(0.5)
    # The truncation is a setting; the behaviour form reads the ratio to pi_f_old instead.
    wide = LeaderOffPolicyTerm(
        fit_value=False, normalize_advantages=False, trust_region="leader", truncation=4.0
    )
    assert wide(algo, batch, None)[1]["off_policy_loss"].item() == pytest.approx(
        (-1.2 * 2.0 + 0.25 * 0.9) / 2, abs=1e-5
    )
    behaviour = LeaderOffPolicyTerm(fit_value=False, normalize_advantages=False)
    ratio = step * weight  # pi_L / pi_f_old: 3.0 (A = +1: clipped at 1.2), 0.225 (A = -1)
    # A = -1 with ratio 0.225 < 0.8: -min(-0.225, -0.8) = 0.8, a constant (no gradient).
    expected = (-1.2 + 0.8) / 2
    assert ratio[1].item() == pytest.approx(0.225)
    assert behaviour(algo, batch, None)[1]["off_policy_loss"].item() == pytest.approx(
        expected, abs=1e-5
    )
    with pytest.raises(ValueError, match="trust_region"):
        LeaderOffPolicyTerm(trust_region="follower")


def test_leader_trust_region_plans_the_leaders_log_probs():
    # The leader's log-probabilities as the update begins: of the planned rows (sampled loss),
    # or of every row (stored targets); the behaviour form computes neither.
    model = tiny_model()
    config = SAPGConfig(off_policy_trust_region="leader")
    sampled = SAPG(model, PPOConfig(gamma=0.9), config)
    storage = _storage([0, 1, 1, 0])
    sampled.prepare(storage)
    epochs = [[torch.tensor([0, 3, 1, 2]), torch.tensor([4, 7, 6, 5])]]
    sampled.plan_minibatches(storage, epochs)
    targets = sampled.off_policy.targets
    assert targets is not None and targets.old_log_prob is not None
    with torch.no_grad():
        every = model.log_prob(storage.flat("obs"), 0, storage.flat("actions"))
    planned = torch.tensor([1, 2, 6, 5])
    torch.testing.assert_close(targets.old_log_prob[planned], every[planned])
    assert torch.isnan(targets.old_log_prob[0])
    stored = SAPG(
        model,
        PPOConfig(gamma=0.9),
        SAPGConfig(off_policy_trust_region="leader", off_policy_ratio=None),
    )
    stored_storage = _storage([0, 1, 1, 0])
    stored.prepare(stored_storage)
    torch.testing.assert_close(stored_storage.flat("leader_old_log_prob"), every)
    plain = SAPG(model, PPOConfig(gamma=0.9))
    plain_storage = _storage([0, 1, 1, 0])
    plain.prepare(plain_storage)
    plain.plan_minibatches(plain_storage, epochs)
    assert plain.off_policy.targets is not None and plain.off_policy.targets.old_log_prob is None


@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_leader_trust_region_surrogate_is_the_weighted_ppo_loss_and_stays_finite(dual_clip):
    # On ordinary rows: min(pi_old / mu, c) times PPO's loss of the step ratio pi / pi_old.
    g = torch.Generator().manual_seed(0)
    log_prob = torch.randn(64, generator=g, dtype=torch.float64, requires_grad=True)
    anchor = log_prob.detach() + 0.3 * torch.randn(64, generator=g, dtype=torch.float64)
    behaviour = anchor + torch.randn(64, generator=g, dtype=torch.float64)
    advantages = torch.randn(64, generator=g, dtype=torch.float64)
    got = leader_trust_region_surrogate(log_prob, anchor, behaviour, advantages, 0.2, dual_clip)
    weight = (anchor - behaviour).exp().clamp(max=1.0)
    step = (log_prob - anchor).exp()
    ppo = -torch.minimum(step * advantages, step.clamp(0.8, 1.2) * advantages)
    if dual_clip is not None:
        ppo = torch.where(advantages < 0, torch.minimum(ppo, -dual_clip * advantages), ppo)
    torch.testing.assert_close(got, weight * ppo)
    # A row the leader would almost never have taken (weight e^-200, underflowing to 0 in
    # float32) whose probability then rose by e^200 (a step ratio that overflows): the loss
    # and its gradient stay finite (w * ratio = pi / mu = 1).
    log_prob = torch.tensor([0.0, 0.0], requires_grad=True)
    anchor = torch.tensor([-200.0, 0.0])
    behaviour = torch.tensor([0.0, 0.0])
    loss = leader_trust_region_surrogate(
        log_prob, anchor, behaviour, torch.tensor([-1.0, 1.0]), 0.2, dual_clip
    )
    loss.sum().backward()
    assert torch.isfinite(loss).all() and torch.isfinite(log_prob.grad).all()
    assert loss[0].item() == pytest.approx(0.0 if dual_clip is not None else 1.0, abs=1e-6)


def test_cpo_leader_trust_region_reads_the_kl_penaltys_log_probs():
    # CPO's KL penalty computes the leader's log-probabilities of every action before the
    # targets: the trust region reads those (no second actor pass), the same values.
    model = tiny_model()
    sapg = SAPGConfig(off_policy_trust_region="leader")
    algo = CPO(model, PPOConfig(gamma=0.9), sapg, CPOConfig(awac=False, adversarial=False))
    storage = _storage([0, 1, 1, 0])
    calls = []
    log_prob = model.log_prob

    def counting(*args, **kwargs):
        calls.append(args[0].shape[0])
        return log_prob(*args, **kwargs)

    model.log_prob = counting  # type: ignore[method-assign]
    algo.prepare(storage)
    algo.plan_minibatches(storage, [[torch.tensor([0, 3, 1, 2])]])
    assert calls == [12]  # one pass over the 3 x 4 rows: the penalty's
    targets = algo.off_policy.targets
    assert targets is not None and targets.old_log_prob is not None
    planned = torch.tensor([1, 2])
    torch.testing.assert_close(
        targets.old_log_prob[planned], storage.flat("leader_log_prob")[planned]
    )


@pytest.mark.parametrize("trust_region", ["behaviour", "leader"])
def test_a_leader_unlike_its_followers_starts_inside_its_own_trust_region(trust_region):
    # A whole update (one epoch, one minibatch) with a leader whose std differs from the
    # followers' that acted: around the leader's own policy every off-policy row starts inside
    # the clip; around the followers' policies most rows start outside it.
    model = tiny_model()
    storage = _storage([0, 1, 1, 0])
    with torch.no_grad():
        member = storage.member.expand(storage.num_steps, -1).reshape(-1)
        behaviour = model.log_prob(storage.flat("obs"), member, storage.flat("actions"))
        storage.log_probs.copy_(behaviour.view_as(storage.log_probs))
        model.log_std[0] += 1.0  # the leader widens after the rollout
    algo = SAPG(
        model,
        PPOConfig(gamma=0.9, epochs=1, minibatches=1),
        SAPGConfig(off_policy_trust_region=trust_region),
    )
    stats = algo.update(storage)
    if trust_region == "leader":
        assert stats["off_policy_clip_fraction"] == 0.0
    else:
        assert stats["off_policy_clip_fraction"] > 0.5
