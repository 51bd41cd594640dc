"""SAPG's leader targets, stored from one critic pass or computed for the sampled rows: the
same targets and updates.

When the off-policy loss reads every follower row, :meth:`SAPG.prepare` stores the leader's
one-step targets ``r + gamma V_L(s')`` of every row with
:func:`~myriad.finetune.sapg.state_and_next_values`, which evaluates ``V_L(s')`` only where
``s'`` is not the next step's ``s`` (episode ends, the last step). The reference values below were
recorded with the two full critic passes (``V_L`` over every ``s``, then over every ``s'``) on
the same seeds, before that change; the updates are compared with updates from the two passes
run in the test. With a sampled off-policy loss (the default ratio) the targets of the sampled
rows are computed from a frozen copy of the critic: the updates equal those with stored targets.
"""

from __future__ import annotations

import pytest
import torch

import myriad.finetune.sapg as sapg_module
from myriad.envs import make
from myriad.finetune.losses import one_step_td
from myriad.finetune.sapg import SAPG, SAPGConfig, state_and_next_values, transitions
from myriad.nn import PopulationActorCritic
from myriad.rl import PPOConfig, RolloutCollector, RolloutStorage
from myriad.utils.seeding import make_generator, seed_everything

# (envs, steps, off_policy_value): 1,024 rows in one chunk of the MLP, and 5,120 rows in two,
# with the leader critic's fit on follower data on. Episodes of at most 12 steps started at
# random phases: 92 and 434 episode ends in the first rollouts.
CASES = ((64, 16, False), (128, 40, True))

# Recorded from the two-pass targets: sums of the advantages and targets after the first
# prepare (signed, absolute).
TARGET_SUMS = {
    (64, 16, False): (-491.7250831127167, 535.3125503063202, -2730.701481103897),
    (128, 40, True): (-2450.6720938682556, 2698.404456138611, -15008.325352668762),
}


def setup(
    num_envs: int,
    num_steps: int,
    fit_value: bool,
    seed: int = 0,
    ratio: float | None = None,
) -> tuple[PopulationActorCritic, SAPG, RolloutCollector, RolloutStorage]:
    seed_everything(seed)
    env = make("nav-empty", num_envs, "cpu", task="dense", max_episode_steps=12)
    # One return statistic for the population: the target sums were recorded with it (the
    # one-pass and two-pass targets agree under either scope; the first assertions check that).
    model = PopulationActorCritic(
        env.obs_dim,
        env.action_dim,
        4,
        actor_hidden=(32, 32),
        critic_hidden=(32, 32),
        value_stats="shared",
        init_log_std=0.0,  # the target sums were recorded with it
    )
    algo = SAPG(
        model,
        # A fixed rate: the adaptive one branches on each minibatch's KL.
        PPOConfig(schedule="fixed", lr=1e-3, epochs=2, minibatches=2),
        # Separate normalisation: the augmented moments pool the advantages of the rows each
        # path reads, which differ by construction (the planned rows or every follower row).
        SAPGConfig(off_policy_value=fit_value, off_policy_ratio=ratio, advantages="separate"),
        generator=make_generator(seed + 1, "cpu"),
    )
    collector = RolloutCollector(
        env, model, generator=make_generator(seed, "cpu"), store_transitions=True
    )
    storage = collector.make_storage(num_steps)
    collector.reset(seed)
    env.randomize_episode_progress()  # type: ignore[attr-defined]
    return model, algo, collector, storage


def two_pass_targets(
    model: PopulationActorCritic, storage: RolloutStorage, gamma: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The leader's one-step advantages and targets from a critic pass over every ``s`` and
    another over every ``s'``, ``[T * E]`` each."""
    obs, next_obs = transitions(storage)
    with torch.no_grad():
        return one_step_td(
            storage.rewards.reshape(-1),
            model.value(obs, 0),
            model.value(next_obs, 0),
            storage.terminated.reshape(-1),
            gamma,
        )


@pytest.mark.parametrize("case", CASES)
def test_leader_targets_match_two_critic_passes(case):
    model, algo, collector, storage = setup(*case)
    collector.collect(storage)
    ends = int(storage.dones.sum())
    assert 0 < ends < storage.dones.numel()  # both kinds of rows occur
    algo.prepare(storage)
    advantage, target = two_pass_targets(model, storage, algo.config.gamma)
    torch.testing.assert_close(storage.flat("leader_td_advantage"), advantage)
    torch.testing.assert_close(storage.flat("leader_td_target"), target)
    adv = storage.flat("leader_td_advantage").double()
    total = float(storage.flat("leader_td_target").double().sum())
    actual = (float(adv.sum()), float(adv.abs().sum()), total)
    assert actual == pytest.approx(TARGET_SUMS[case], rel=1e-5)


def _two_iterations(
    case: tuple[int, int, bool], ratio: float | None = None
) -> tuple[dict[str, float], dict[str, float]]:
    """The update's mean stats and the sum of every parameter after two iterations of collect
    + update."""
    model, algo, collector, storage = setup(*case, ratio=ratio)
    for _ in range(2):
        collector.collect(storage)
        stats = algo.update(storage)
    return stats, {n: float(p.detach().double().sum()) for n, p in model.named_parameters()}


@pytest.mark.parametrize("case", CASES)
def test_updates_match_the_two_pass_updates(case, monkeypatch):
    stats, params = _two_iterations(case)

    def two_passes(model, member, storage):  # type: ignore[no-untyped-def]
        obs, next_obs = transitions(storage)
        return model.value(obs, member), model.value(next_obs, member)

    monkeypatch.setattr(sapg_module, "state_and_next_values", two_passes)
    expected_stats, expected_params = _two_iterations(case)
    assert "off_policy_loss" in stats and ("off_policy_value_loss" in stats) == case[2]
    for key, value in expected_stats.items():
        assert stats[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
    for name, total in expected_params.items():
        assert params[name] == pytest.approx(total, rel=1e-4, abs=1e-6), name


@pytest.mark.parametrize("case", CASES)
def test_sampled_targets_give_the_updates_of_stored_targets(case, monkeypatch):
    stats, params = _two_iterations(case, ratio=1.0)
    assert "off_policy_loss" in stats
    # The same sampled loss reading targets stored for every row at prepare.
    monkeypatch.setattr(SAPG, "samples_leader_targets", lambda self, storage: False)
    expected_stats, expected_params = _two_iterations(case, ratio=1.0)
    for key, value in expected_stats.items():
        assert stats[key] == pytest.approx(value, rel=1e-4, abs=1e-7), key
    for name, total in expected_params.items():
        assert params[name] == pytest.approx(total, rel=1e-4, abs=1e-6), name


def test_next_values_where_no_observation_repeats():
    # Random next observations: every s' is evaluated on its own.
    seed_everything(5)
    model = PopulationActorCritic(3, 1, 2, critic_hidden=(8,))
    member = torch.tensor([0, 1, 1, 0])
    storage = RolloutStorage(3, member, 3, 1)
    storage.register_field("next_obs", (3,))
    for _ in range(3):
        storage.add(
            obs=torch.randn(4, 3),
            actions=torch.randn(4, 1),
            log_prob=torch.randn(4),
            value=torch.randn(4),
            reward=torch.randn(4),
            terminated=torch.zeros(4, dtype=torch.bool),
            truncated=torch.zeros(4, dtype=torch.bool),
            next_obs=torch.randn(4, 3),
        )
    obs, next_obs = transitions(storage)
    values, next_values = state_and_next_values(model, 1, storage)
    with torch.no_grad():
        torch.testing.assert_close(values, model.value(obs, 1))
        torch.testing.assert_close(next_values, model.value(next_obs, 1))
