"""The population actor-critic: forward paths, member isolation, member surgery, its config and
the population layout check."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
import torch

from myriad.nn import (
    PARAMETERIZATIONS,
    PopulationActorCritic,
    PopulationConfig,
    block_members,
    gaussian_kl,
    gaussian_log_prob,
    is_blocked,
    member_blocks,
)
from myriad.nn.population import build_population, check_population, population_config
from myriad.utils.config import ConfigError
from myriad.utils.migrations import migrate_population

OBS, ACT, M = 5, 3, 4


def make_model(parameterization: str, members: int = M, **options) -> PopulationActorCritic:
    torch.manual_seed(0)
    model = PopulationActorCritic(
        OBS, ACT, members, parameterization, actor_hidden=(16, 8), critic_hidden=(12,), **options
    )
    # Non-trivial observation and value statistics, so normalisation is exercised too.
    model.update_obs_norm(torch.randn(64, OBS) * 3 + 1)
    if model.value_norm is not None:
        model.value_norm.update(torch.randn(64) * 5 - 2, torch.arange(64) % members)
    with torch.no_grad():
        model.log_std.copy_(torch.randn(members, ACT) * 0.3)
    return model


def outputs(model, obs, member, actions, blocked=False):
    ev = model.evaluate(obs, member, actions, blocked=blocked)
    return torch.cat(
        [ev.log_prob[:, None], ev.entropy[:, None], ev.value[:, None], ev.mean, ev.log_std], 1
    )


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_blocked_general_and_single_member_paths_agree(parameterization):
    model = make_model(parameterization)
    n = 6
    obs = torch.randn(M * n, OBS)
    actions = torch.randn(M * n, ACT)
    member = block_members(M * n, M)
    fast = outputs(model, obs, member, actions, blocked=True)
    general = outputs(model, obs, member, actions)
    torch.testing.assert_close(fast, general, rtol=1e-5, atol=1e-6)

    # Arbitrary order and unequal counts through the general path, checked row by row against
    # the single-member path.
    perm = torch.randperm(M * n)
    uneven = torch.tensor([0, 0, 0, 2, 2, 3, 1, 0, 3, 3, 3, 3])
    for obs_, act_, mem_ in (
        (obs[perm], actions[perm], member[perm]),
        (obs[:12], actions[:12], uneven),
    ):
        got = outputs(model, obs_, mem_, act_)
        for m in range(M):
            rows = mem_ == m
            if rows.any():
                want = outputs(model, obs_[rows], m, act_[rows])
                torch.testing.assert_close(got[rows], want, rtol=1e-5, atol=1e-6)
    # Shuffled rows give the shuffled outputs of the blocked layout.
    torch.testing.assert_close(
        outputs(model, obs[perm], member[perm], actions[perm]), fast[perm], rtol=1e-5, atol=1e-6
    )


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_member_means_and_pairwise_kl(parameterization):
    model = make_model(parameterization)
    obs = torch.randn(7, OBS)
    means = model.member_action_means(obs)
    assert means.shape == (M, 7, ACT)
    for m in range(M):
        torch.testing.assert_close(means[m], model.action_params(obs, m)[0], rtol=1e-5, atol=1e-6)
    kl = model.pairwise_kl(obs)
    log_std = model.member_log_std()
    want = torch.stack(
        [
            torch.stack(
                [
                    gaussian_kl(
                        means[i], log_std[i].expand(7, -1), means[j], log_std[j].expand(7, -1)
                    ).mean()
                    for j in range(M)
                ]
            )
            for i in range(M)
        ]
    )
    torch.testing.assert_close(kl, want, rtol=1e-5, atol=1e-6)
    assert torch.all(kl.diagonal() == 0) and torch.all(kl + torch.eye(M) > 0)


def test_independent_members_do_not_leak_gradients():
    model = make_model("independent")
    obs = torch.randn(M * 5, OBS)
    member = block_members(M * 5, M)
    actions = torch.randn(M * 5, ACT)
    for blocked in (True, False):
        model.zero_grad()
        ev = model.evaluate(obs, member, actions, blocked=blocked)
        i = 1
        rows = member == i
        (
            ev.log_prob[rows].sum() + ev.value[rows].square().sum() + ev.entropy[rows].sum()
        ).backward()
        for p in model.member_parameters():
            assert p.grad is not None
            others = [j for j in range(M) if j != i]
            assert torch.all(p.grad[others] == 0), "gradient leaked into another member"
            assert p.grad[i].abs().sum() > 0
        # No shared parameters at all in the independent parameterisation.
        member_ids = {id(p) for p in model.member_parameters()}
        assert all(id(p) in member_ids for p in model.parameters())


@pytest.mark.parametrize("parameterization", ["shared_trunk", "embedding"])
def test_shared_parameterisations_keep_member_parameters_separate(parameterization):
    model = make_model(parameterization)
    obs = torch.randn(M * 3, OBS)
    member = block_members(M * 3, M)
    ev = model.evaluate(obs, member, torch.randn(M * 3, ACT), blocked=True)
    ev.log_prob[member == 2].sum().backward()
    for p in model.member_parameters():
        if p.grad is not None:
            assert torch.all(p.grad[[0, 1, 3]] == 0)


def test_act_samples_reproducibly_and_log_prob_matches_evaluate():
    model = make_model("shared_trunk")
    obs = torch.randn(8, OBS)
    member = block_members(8, M)
    a = model.act(obs, member, generator=torch.Generator().manual_seed(3), blocked=True)
    b = model.act(obs, member, generator=torch.Generator().manual_seed(3))
    torch.testing.assert_close(a.actions, b.actions)
    torch.testing.assert_close(a.log_prob, gaussian_log_prob(a.actions, a.mean, a.log_std))
    ev = model.evaluate(obs, member, a.actions)
    torch.testing.assert_close(ev.log_prob, a.log_prob, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ev.value, model.value(obs, member))
    det = model.act(obs, member, deterministic=True)
    torch.testing.assert_close(det.actions, det.mean)


def test_normalisers_live_in_state_dict_and_change_outputs():
    model = make_model("shared_trunk")
    keys = model.state_dict().keys()
    assert {"obs_norm.mean", "obs_norm.var", "value_norm.mean", "log_std"} <= set(keys)
    obs = torch.randn(4, OBS)
    before = model.value(obs, 0)
    model.update_obs_norm(torch.randn(100, OBS) * 10)
    assert not torch.allclose(before, model.value(obs, 0))
    plain = PopulationActorCritic(OBS, ACT, 2, normalize_obs=False, normalize_value=False)
    assert plain.obs_norm is None and plain.value_norm is None
    plain.update_obs_norm(obs)


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_copy_member_and_optimizer_state(parameterization):
    model = make_model(parameterization)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    obs = torch.randn(M * 4, OBS)
    member = block_members(M * 4, M)
    model.evaluate(obs, member, torch.randn(M * 4, ACT), blocked=True).log_prob.sum().backward()
    opt.step()
    model.copy_member(2, 0, optimizer=opt)
    torch.testing.assert_close(
        outputs(model, obs, 0, obs[:, :ACT]), outputs(model, obs, 2, obs[:, :ACT])
    )
    for p in model.member_parameters():
        for v in opt.state[p].values():
            if v.shape == p.shape:
                torch.testing.assert_close(v[0], v[2])
    model.copy_member([1, 1], [2, 3])
    torch.testing.assert_close(
        outputs(model, obs, 3, obs[:, :ACT]), outputs(model, obs, 1, obs[:, :ACT])
    )


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_extract_and_load_members(parameterization):
    model = make_model(parameterization, members=5)
    obs = torch.randn(6, OBS)
    acts = torch.randn(6, ACT)
    sub = model.extract_members([3, 0, 4])
    assert sub.num_members == 3 and sub.config.parameterization == parameterization
    for k, src in enumerate([3, 0, 4]):
        torch.testing.assert_close(outputs(sub, obs, k, acts), outputs(model, obs, src, acts))
    other = PopulationActorCritic(
        OBS, ACT, 2, parameterization, actor_hidden=(16, 8), critic_hidden=(12,)
    )
    other.load_members(model, [1], into=[1])
    torch.testing.assert_close(outputs(other, obs, 1, acts), outputs(model, obs, 1, acts))
    wrong = PopulationActorCritic(OBS, ACT, 2, parameterization, actor_hidden=(32,))
    with pytest.raises(ValueError, match="actor_hidden"):
        wrong.load_members(model, [0])
    with pytest.raises(ValueError, match="out of range"):
        other.load_members(model, [7])


@pytest.mark.parametrize("parameterization", PARAMETERIZATIONS)
def test_blocks_of_some_members_agree_with_the_general_path(parameterization):
    """``blocked=slice(a, b)`` (a rank's members) gives the general path's outputs and
    gradients on rows of members ``a..b-1`` alone."""
    model = make_model(parameterization)
    n, members = 5, slice(1, 3)
    member = torch.arange(1, 3).repeat_interleave(n)
    obs, actions = torch.randn(2 * n, OBS), torch.randn(2 * n, ACT)
    assert member_blocks(member, M) == members
    fast = outputs(model, obs, member, actions, blocked=members)
    fast_grads = torch.autograd.grad(fast.square().sum(), list(model.parameters()))
    general = outputs(model, obs, member, actions)
    general_grads = torch.autograd.grad(general.square().sum(), list(model.parameters()))
    torch.testing.assert_close(fast, general, rtol=1e-5, atol=1e-6)
    for a, b in zip(fast_grads, general_grads, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    sample = model.act(obs, member, torch.Generator().manual_seed(0), blocked=members)
    again = model.act(obs, member, torch.Generator().manual_seed(0))
    torch.testing.assert_close(sample.actions, again.actions, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="multiple"):
        model.value(torch.randn(5, OBS), member[:5], blocked=members)


def test_layout_helpers_and_config_errors():
    assert block_members(6, 3).tolist() == [0, 0, 1, 1, 2, 2]
    assert is_blocked(block_members(8, 4), 4)
    assert not is_blocked(torch.tensor([0, 1, 0, 1]), 2)
    assert member_blocks(block_members(8, 4), 4) is True
    assert member_blocks(torch.tensor([2, 2, 3, 3]), 4) == slice(2, 4)
    assert member_blocks(torch.tensor([1, 1, 1]), 4) == slice(1, 2)
    for unequal in ([0, 1, 0, 1], [1, 1, 2], [1, 1, 3, 3], [0, 0, 4, 4]):
        assert member_blocks(torch.tensor(unequal), 4) is False, unequal
    assert member_blocks(torch.zeros(0, dtype=torch.long), 4) is False
    with pytest.raises(ConfigError, match="use num_envs=6 or 8"):
        block_members(7, 2)
    with pytest.raises(ValueError, match="parameterization"):
        PopulationActorCritic(3, 2, 2, "mixture")
    with pytest.raises(ValueError, match="activation"):
        PopulationActorCritic(3, 2, 2, activation="swish2")
    model = make_model("independent")
    with pytest.raises(ValueError, match="multiple"):
        model.value(torch.randn(5, OBS), torch.zeros(5, dtype=torch.long), blocked=True)


@pytest.mark.parametrize(
    ("layout", "match"),
    [
        ((4, 0), "population.size must be >= 1, got 0"),
        ((8, 16), "population.size=16 is larger than num_envs=8"),
        (
            (15, 2),
            "num_envs=15 does not split into population.size=2 equal blocks; use num_envs=14 or 16",
        ),
        ((100, 8, 32, 10), "use num_envs=96 or 104"),
        (
            (16, 8, 2, 4),
            "objective.k=4 needs more than k states per member, but each member collects 4",
        ),
    ],
)
def test_check_population_names_the_fix(layout, match):
    with pytest.raises(ConfigError, match=re.escape(match)):
        check_population(*layout)
    check_population(64, 8, 16, 10)  # 8 envs x 16 steps = 128 states per member > k


LEGACY = {
    "size": 3,
    "kind": "embedding",
    "hidden": [16, 8],
    "activation": "tanh",
    "init_log_std": -1.0,
    "obs_norm": False,
}


def test_population_config_is_built_from_its_fields_and_legacy_keys():
    fields = {
        "size": 3,
        "parameterization": "embedding",
        "actor_hidden": [16, 8],
        "critic_hidden": [16, 8],
        "activation": "tanh",
        "init_log_std": -1.0,
        "normalize_obs": False,
    }
    config = population_config(fields, OBS, ACT)
    # A config without value_stats gets the field's default.
    assert config == PopulationConfig(
        OBS,
        ACT,
        3,
        "embedding",
        (16, 8),
        (16, 8),
        "tanh",
        init_log_std=-1.0,
        normalize_obs=False,
        value_stats="member",
    )
    # Configs saved before the keys were the field names (and before value_stats, then one
    # shared statistic) load, through the migrations, to the same population.
    legacy = migrate_population(LEGACY)
    assert population_config(legacy, OBS, ACT) == replace(config, value_stats="shared")
    torch.manual_seed(0)
    a = build_population(legacy, OBS, ACT)
    torch.manual_seed(0)
    b = build_population({**fields, "value_stats": "shared"}, OBS, ACT)
    assert a.state_dict().keys() == b.state_dict().keys()
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key


@pytest.mark.parametrize(
    ("population", "match"),
    [
        (
            {"size": 2, "hiden": [8]},
            "population has no key 'hiden'; its keys: size, parameterization, actor_hidden",
        ),
        ({"size": "two"}, "population.size='two' must be an integer"),
        ({"actor_hidden": [8, "x"]}, "population.actor_hidden=[8, 'x'] must be a list of integers"),
        (
            {"log_std_bounds": [-5.0]},
            "population.log_std_bounds=[-5.0] must be a list of 2 numbers",
        ),
        ({"normalize_obs": "yes"}, "population.normalize_obs='yes' must be true or false"),
        (
            {"parameterization": "mixture"},
            "population.parameterization='mixture' is not known: it must be one of shared_trunk",
        ),
    ],
)
def test_bad_population_config_is_one_line_naming_the_key(population, match):
    with pytest.raises(ConfigError, match=re.escape(match)) as info:
        build_population(population, OBS, ACT)
    assert "\n" not in str(info.value)
