"""CPO's and SAPG's minibatch losses against the authors' formulas, written out here from the
equations (docs/algorithms.md §6-7: one mean over the augmented batch, advantages normalised
once over all its rows), not by calling the loss code.

The authors' augmented batch, with the leader here as member 0 (theirs is the last block):
- every member's own rows, GAE advantages;
- off-policy rows: follower rows relabelled as the leader, ratio ``pi_L(a|s) / mu_f(a|s)``,
  one-step TD advantage and target of the leader's critic;
- AWAC rows: for each follower, a copy of the leader's rows, weight
  ``min(exp(A_f / lambda_awac), 100)`` from the follower critic's one-step TD advantage.
Every advantage is normalised with one mean and (unbiased) std over all those rows; the actor,
critic and entropy terms are each summed over their rows and divided by the total row count; the
critic is fitted on the members' own rows and the off-policy rows, not on the AWAC rows.
"""

from __future__ import annotations

import math

import pytest
import torch

from myriad.finetune.cpo import CPO, CPOConfig
from myriad.finetune.sapg import SAPG, SAPGConfig
from myriad.nn.population import PopulationActorCritic
from myriad.rl.ppo import PPOConfig
from myriad.rl.storage import RolloutStorage

M, ENVS_PER_MEMBER, T, OBS, ACT = 3, 2, 4, 3, 2
GAMMA, LAM, CLIP, VALUE_CLIP, VALUE_COEF = 0.9, 0.8, 0.2, 0.2, 2.0
ENTROPY_SCALE, KL_COEF, BETA, AWAC_TEMPERATURE = 0.02, 0.3, 0.5, 0.2


def population() -> PopulationActorCritic:
    torch.manual_seed(0)
    return PopulationActorCritic(
        OBS,
        ACT,
        M,
        actor_hidden=(8,),
        critic_hidden=(8,),
        normalize_obs=False,
        normalize_value=False,
    )


def rollout(model: PopulationActorCritic) -> RolloutStorage:
    """A hand-made rollout: random states, actions, rewards and ends; the behaviour log-probs
    and values are the model's, except the leader's log-probs, shifted so that its ratios leave
    the clip range (the followers' stay exact: their KL penalty is then the same whether it is
    read from the behaviour or the current log-probs, which the authors' code uses)."""
    member = torch.arange(M).repeat_interleave(ENVS_PER_MEMBER)
    e = member.shape[0]
    storage = RolloutStorage(T, member, OBS, ACT, num_members=M)
    storage.register_field("next_obs", (OBS,))
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _ in range(T):
            obs = torch.randn(e, OBS, generator=gen)
            actions = torch.randn(e, ACT, generator=gen)
            log_prob = model.log_prob(obs, member, actions)
            shift = torch.where(member == 0, 0.5 * torch.randn(e, generator=gen), 0.0)
            storage.add(
                obs=obs,
                actions=actions,
                log_prob=log_prob + shift,
                value=model.value(obs, member) + 0.3 * torch.randn(e, generator=gen),
                reward=torch.randn(e, generator=gen),
                terminated=torch.rand(e, generator=gen) < 0.25,
                truncated=torch.zeros(e, dtype=torch.bool),
                next_obs=torch.randn(e, OBS, generator=gen),
            )
    storage.last_values.copy_(torch.randn(e, generator=gen))
    return storage


def gae(storage: RolloutStorage) -> tuple[torch.Tensor, torch.Tensor]:
    """GAE(gamma, lambda) advantages and returns ``[T, E]``, by the recursion."""
    adv = torch.zeros(T, storage.num_envs)
    next_adv = torch.zeros(storage.num_envs)
    next_value = storage.last_values
    for t in reversed(range(T)):
        live = 1.0 - storage.dones[t].float()
        delta = storage.rewards[t] + GAMMA * live * next_value - storage.values[t]
        next_adv = delta + GAMMA * LAM * live * next_adv
        adv[t] = next_adv
        next_value = storage.values[t]
    return adv, adv + storage.values


def ppo_row(log_prob, old_log_prob, advantage):
    ratio = torch.exp(log_prob - old_log_prob)
    return torch.maximum(-advantage * ratio, -advantage * ratio.clamp(1 - CLIP, 1 + CLIP))


def one_step(model, member, obs, next_obs, reward, terminated):
    value = model.value(obs, member)
    target = reward + GAMMA * (1.0 - terminated.float()) * model.value(next_obs, member)
    return target - value, target


def build(cls: type, model: PopulationActorCritic):
    ppo = PPOConfig(gamma=GAMMA, lam=LAM, clip=CLIP, value_clip=VALUE_CLIP, value_coef=VALUE_COEF)
    # The authors' off-policy loss is PPO's clip alone: no dual clip.
    sapg = SAPGConfig(
        entropy_scale=ENTROPY_SCALE,
        off_policy_dual_clip=None,
        off_policy_value=True,
        weighting="rows",
        advantages="augmented",
    )
    if cls is SAPG:
        return SAPG(model, ppo, sapg)
    cpo = CPOConfig(
        kl_coef=KL_COEF,
        awac_coef=BETA,
        awac_temperature=AWAC_TEMPERATURE,
        adversarial=False,
        kl_target=None,
    )
    return CPO(model, ppo, sapg, cpo)


@pytest.mark.parametrize("cls", [SAPG, CPO])
def test_minibatch_loss_is_the_authors_mean_over_the_augmented_batch(cls: type) -> None:
    model = population()
    storage = rollout(model)
    algo = build(cls, model)
    algo.prepare(storage)
    index = storage.minibatch_indices(1, True, torch.Generator().manual_seed(0))[0]
    algo.plan_minibatches(storage, [[index]])
    batch = storage.batch(index, blocked=True)
    loss, stats = algo.loss(batch)

    # ---- the authors' formulas, evaluated on the same rows ---------------------------------
    n = len(batch) // M  # rows per member in the (whole-rollout) minibatch
    own_adv, own_ret = (x.reshape(-1)[index] for x in gae(storage))
    flat = lambda name: storage.flat(name)[index]  # noqa: E731
    obs, actions, member = batch.obs, batch.actions, batch.member
    reward, terminated, next_obs = flat("rewards"), flat("terminated"), flat("next_obs")
    # Off-policy rows: the first ceil(n / (M - 1)) rows of each follower block (our sample of
    # the follower rows, as many as the leader's own rows; theirs is one follower block).
    per_follower = math.ceil(n / (M - 1))
    off = torch.cat([torch.arange(j * n, j * n + per_follower) for j in range(1, M)])
    leader_rows = torch.arange(0, n)
    with torch.no_grad():
        off_adv, off_target = one_step(
            model, 0, obs[off], next_obs[off], reward[off], terminated[off]
        )
        groups = [own_adv, off_adv]
        awac_adv = []
        if cls is CPO:
            lr = leader_rows
            awac_adv = [
                one_step(model, j, obs[lr], next_obs[lr], reward[lr], terminated[lr])[0]
                for j in range(1, M)
            ]
            groups += awac_adv
        every = torch.cat(groups)
        mean, std = every.mean(), every.std()  # one normalisation over all augmented rows
    norm = lambda a: (a - mean) / (std + 1e-8)  # noqa: E731

    evaluation = model.evaluate(obs, member, actions)
    rows_total = every.shape[0]
    # Members' own rows: the leader's PPO rows and the followers' KL-penalised ones.
    a = norm(own_adv)
    if cls is CPO:
        with torch.no_grad():
            leader_log_prob = model.log_prob(obs, 0, actions)
        penalty = KL_COEF * (evaluation.log_prob.detach() - leader_log_prob)
        a = torch.where(member == 0, a, a - penalty)
    actor = ppo_row(evaluation.log_prob, batch.log_probs, a).sum()
    # Off-policy rows: the leader's ratio on the followers' actions.
    leader_on_off = model.evaluate(obs[off], 0, actions[off])
    actor = actor + ppo_row(leader_on_off.log_prob, batch.log_probs[off], norm(off_adv)).sum()
    # AWAC rows: each follower's weighted log-likelihood of the leader's actions.
    for j, adv_j in zip(range(1, M), awac_adv):
        weight = torch.exp(norm(adv_j) / AWAC_TEMPERATURE).clamp(max=100.0)
        log_pi = model.log_prob(obs[leader_rows], j, actions[leader_rows])
        actor = actor + (BETA * weight * -log_pi).sum()
    # Critic: clipped on the members' own rows, the one-step targets on the off-policy rows.
    v, v_old = evaluation.value, batch.values
    clipped = v_old + (v - v_old).clamp(-VALUE_CLIP, VALUE_CLIP)
    critic = torch.maximum((v - own_ret).square(), (clipped - own_ret).square()).sum()
    critic = critic + (leader_on_off.value - off_target).square().sum()
    # Entropy: the followers' coefficients 0.5 * scale * i / (M - 1), the leader's (and so the
    # off-policy rows') 0.
    coef = 0.5 * ENTROPY_SCALE * member.float() / (M - 1)
    entropy = (coef * evaluation.entropy).sum()
    expected = (actor + VALUE_COEF * critic - entropy) / rows_total

    assert rows_total == len(batch) + off.shape[0] + (M - 1) * n * (cls is CPO)
    torch.testing.assert_close(loss, expected, rtol=0, atol=1e-6)
    # The gradients agree too (the weights of every group, not only the value).
    params = [p for p in model.parameters() if p.requires_grad]
    got = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    want = torch.autograd.grad(expected, params, allow_unused=True)
    for g, w in zip(got, want):
        if g is None or w is None:
            assert (g is None and w is None) or (g if w is None else w).abs().max() == 0
            continue
        # float32 sums over every row of the batch, in another order: round-off of ~1e-6.
        torch.testing.assert_close(g, w, rtol=1e-5, atol=5e-6)
    assert float(stats["loss"]) == pytest.approx(float(expected.detach()), abs=1e-6)


@pytest.mark.parametrize(("weighting", "ratio"), [("rows", 1.0), ("terms", M)])
def test_leader_off_policy_rows_weigh_as_its_own_rows(weighting: str, ratio: float) -> None:
    """With every row identical, the gradient on the leader's log-std from its off-policy rows
    equals that from its own rows under the row weighting (1:1, as the authors'), and is M times
    it when each term is a mean over its own rows."""
    model = population()
    storage = rollout(model)
    algo = build(SAPG, model)
    algo.sapg.weighting = weighting
    algo.prepare(storage)
    index = storage.minibatch_indices(1, True, torch.Generator().manual_seed(0))[0]
    batch = storage.batch(index, blocked=True)
    first = lambda x: x[:1].expand_as(x).clone()  # noqa: E731
    batch.obs, batch.actions, batch.member = first(batch.obs), first(batch.actions), batch.member
    with torch.no_grad():
        batch.log_probs = model.log_prob(batch.obs, batch.member, batch.actions)
    batch.advantages = torch.ones(len(batch))
    batch.extras["leader_td_advantage"] = torch.ones(len(batch))
    batch.extras["leader_td_target"] = batch.values.clone()
    algo.off_policy.targets = None
    algo.advantage_moments = (torch.tensor(0.0), torch.tensor(1.0))
    algo.set_entropy_coef(0.0)
    with torch.no_grad():  # the leader's ratio on the followers' (identical) rows is 1 too
        batch.log_probs.copy_(model.log_prob(batch.obs, 0, batch.actions))
    evaluation = algo.evaluate(batch)
    own, _ = algo.ppo_loss(batch, evaluation)
    extra, _ = algo.off_policy(algo, batch, evaluation)
    assert algo.off_policy.augmented_rows(batch) == len(batch) // M  # as many as the leader's
    full = algo.combine(batch, own, [(algo.off_policy, extra)])
    scale = algo.combine(batch, torch.tensor(1.0), [(algo.off_policy, torch.tensor(0.0))])
    g_full = torch.autograd.grad(full, model.log_std, retain_graph=True)[0][0]
    g_own = torch.autograd.grad(own, model.log_std)[0][0] * scale
    g_off = g_full - g_own
    assert float(g_own.abs().sum()) > 0
    torch.testing.assert_close(g_off, ratio * g_own, rtol=1e-4, atol=1e-7)
