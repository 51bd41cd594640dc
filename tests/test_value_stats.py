"""Per-member return statistics for value normalisation (``population.value_stats``).

Checked against numpy on the concatenated stream, against the one-statistic
:class:`RunningMeanStd` for one group, and through the population: a member's value scale does
not move when another member's rewards change, PBT's copy and ``--init``'s load carry the
statistics with the critic, and states saved with one scalar statistic still load.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from myriad.envs import make
from myriad.nn import PopulationActorCritic
from myriad.rl import PPO, PPOConfig, RolloutCollector
from myriad.utils.running_stats import GroupMeanStd, RunningMeanStd, merge_moments
from myriad.utils.seeding import make_generator, seed_everything
from myriad.utils.tensors import member_rows

EPS = 1e-4  # the pseudo-count every statistic starts with (mean 0, variance 1)


def reference(stream: list[np.ndarray]) -> tuple[float, float]:
    """Mean and variance of the stream with the prior as a pseudo-sample of weight ``EPS``."""
    x = np.concatenate(stream).astype(np.float64)
    n = x.size
    mean = x.sum() / (n + EPS)
    # The prior contributes variance 1 at mean 0 with weight EPS.
    var = (EPS * (1.0 + mean**2) + ((x - mean) ** 2).sum()) / (n + EPS)
    return mean, var


def test_each_group_matches_numpy_on_its_own_rows():
    rng = np.random.default_rng(0)
    stats = GroupMeanStd(3)
    seen: list[list[np.ndarray]] = [[], [], []]
    for _ in range(4):
        member = rng.integers(0, 3, size=50)
        x = (
            rng.normal(size=50) * np.array([1.0, 30.0, 0.1])[member]
            + np.array([0, 100, -5])[member]
        )
        stats.update(torch.as_tensor(x), torch.as_tensor(member))
        for g in range(3):
            seen[g].append(x[member == g])
    for g in range(3):
        mean, var = reference(seen[g])
        assert stats.mean[g].item() == pytest.approx(mean, rel=1e-9, abs=1e-9)
        assert stats.var[g].item() == pytest.approx(var, rel=1e-9)
        assert stats.count[g].item() == pytest.approx(sum(a.size for a in seen[g]) + EPS)


def test_a_group_without_rows_keeps_its_statistics():
    stats = GroupMeanStd(2)
    stats.update(torch.tensor([1.0, 2.0, 3.0]), torch.tensor([0, 0, 0]))
    assert stats.mean[1].item() == 0.0 and stats.var[1].item() == 1.0
    assert stats.count[1].item() == pytest.approx(EPS)


def test_one_group_is_the_shared_statistic():
    x = torch.randn(5, 40, dtype=torch.float64) * 7 + 3
    grouped, shared = GroupMeanStd(1), RunningMeanStd((), clip=None)
    for batch in x:
        grouped.update(batch, torch.randint(0, 4, (40,)))  # members are ignored with one group
        shared.update(batch)
    torch.testing.assert_close(grouped.mean[0], shared.mean)
    torch.testing.assert_close(grouped.var[0], shared.var)
    v = torch.randn(8)
    torch.testing.assert_close(grouped.normalize(v, torch.arange(8) % 4), shared.normalize(v))


def test_merged_moments_equal_the_moments_of_the_union():
    a, b = torch.randn(30, dtype=torch.float64), torch.randn(11, dtype=torch.float64) * 4 + 2
    count, mean, var = merge_moments(
        torch.tensor(30.0, dtype=torch.float64),
        a.mean(),
        a.var(unbiased=False),
        torch.tensor(11.0, dtype=torch.float64),
        b.mean(),
        b.var(unbiased=False),
    )
    union = torch.cat([a, b])
    assert count.item() == 41
    torch.testing.assert_close(mean, union.mean())
    torch.testing.assert_close(var, union.var(unbiased=False))


def test_a_scalar_state_loads_into_every_group():
    old = RunningMeanStd((), clip=None)
    old.update(torch.randn(100) * 3 + 1)
    stats = GroupMeanStd(4)
    stats.load_state_dict(old.state_dict())
    torch.testing.assert_close(stats.mean, old.mean.expand(4))
    torch.testing.assert_close(stats.var, old.var.expand(4))


def model(scope: str, members: int = 3) -> PopulationActorCritic:
    torch.manual_seed(0)
    return PopulationActorCritic(4, 2, members, critic_hidden=(8,), value_stats=scope)


def test_a_members_scale_ignores_the_other_members_returns():
    """The leader's returns are O(1); a follower is paid 1000x more. With per-member statistics
    the leader's normalised targets are those of the leader alone; shared, they are crushed."""
    returns = torch.cat([torch.randn(64) + 1.0, torch.randn(64) * 1000.0 + 500.0])
    member = torch.arange(2).repeat_interleave(64)
    alone = model("member", 1)
    alone.value_norm.update(returns[:64], member[:64])
    per_member, shared = model("member", 2), model("shared", 2)
    for m in (per_member, shared):
        m.value_norm.update(returns, member)
    leader_targets = returns[:64]
    torch.testing.assert_close(
        per_member.value_norm.normalize(leader_targets, 0),
        alone.value_norm.normalize(leader_targets, 0),
    )
    assert per_member.value_norm.normalize(leader_targets, 0).std() > 0.9
    assert shared.value_norm.normalize(leader_targets, 0).std() < 0.01
    obs = torch.randn(5, 4)
    # Values come out in return units through each member's own statistics.
    raw = per_member.critic.single(per_member._normalize_obs(obs), 1).squeeze(-1)
    torch.testing.assert_close(
        per_member.value(obs, 1), raw * per_member.value_norm.std[1] + per_member.value_norm.mean[1]
    )


def test_copy_member_carries_the_statistics():
    m = model("member", 3)
    m.value_norm.update(torch.tensor([1.0, 50.0, -7.0]), torch.tensor([0, 1, 2]))
    m.copy_member([1], [2])
    torch.testing.assert_close(m.value_norm.mean[2], m.value_norm.mean[1])
    torch.testing.assert_close(m.value_norm.count[2], m.value_norm.count[1])
    obs = torch.randn(6, 4)
    torch.testing.assert_close(m.value(obs, 2), m.value(obs, 1))


@pytest.mark.parametrize(
    ("source", "target"), [("member", "member"), ("shared", "member"), ("member", "shared")]
)
def test_loaded_members_keep_their_value_estimates(source, target):
    src = model(source, 3)
    src.value_norm.update(
        torch.tensor([1.0, 50.0, -7.0, 3.0, 60.0, -9.0]), torch.tensor([0, 1, 2] * 2)
    )
    dst = PopulationActorCritic(4, 2, 2, critic_hidden=(8,), value_stats=target)
    dst.load_members(
        src, [2, 1] if target == "member" else [2], [0, 1] if target == "member" else [0]
    )
    obs = torch.randn(6, 4)
    torch.testing.assert_close(dst.value(obs, 0), src.value(obs, 2))
    if target == "member":
        torch.testing.assert_close(dst.value(obs, 1), src.value(obs, 1))


def test_ppo_folds_each_members_returns_into_its_own_statistics():
    seed_everything(0)
    env = make("nav-empty", 16, "cpu", task="dense", max_episode_steps=20)
    m = PopulationActorCritic(env.obs_dim, env.action_dim, 2, critic_hidden=(16,))
    collector = RolloutCollector(env, m, generator=make_generator(0, "cpu"))
    storage = collector.make_storage(8)
    collector.reset(0)
    collector.collect(storage)
    storage.rewards[:, storage.member == 1] *= 100.0
    PPO(m, PPOConfig()).prepare(storage)
    for g in range(2):
        mean, var = reference([storage.returns[:, storage.member == g].reshape(-1).numpy()])
        assert m.value_norm.mean[g].item() == pytest.approx(mean, rel=1e-6)
        assert m.value_norm.var[g].item() == pytest.approx(var, rel=1e-6)


def test_a_config_saved_before_the_key_keeps_one_statistic():
    from myriad.nn.population import build_population
    from myriad.utils.migrations import migrate_population

    assert migrate_population({"size": 3})["value_stats"] == "shared"
    assert migrate_population({"size": 3, "value_stats": "member"})["value_stats"] == "member"
    old = build_population(migrate_population({"size": 3, "critic_hidden": [8]}), 4, 2)
    assert old.value_norm is not None and old.value_norm.groups == 1
    new = build_population({"size": 3, "critic_hidden": [8], "value_stats": "member"}, 4, 2)
    assert new.value_norm is not None and new.value_norm.groups == 3


@pytest.mark.parametrize("trailing", [(), (3,)])
def test_member_rows_is_advanced_indexing(trailing):
    table = torch.randn(5, *trailing, dtype=torch.float64)
    member = torch.tensor([4, 0, 0, 2, 4, 1])
    torch.testing.assert_close(member_rows(table, member), table[member], rtol=0, atol=0)
    torch.testing.assert_close(member_rows(table, 3), table[3], rtol=0, atol=0)
    torch.testing.assert_close(
        member_rows(table, torch.tensor(2)), table[torch.tensor(2)], rtol=0, atol=0
    )
