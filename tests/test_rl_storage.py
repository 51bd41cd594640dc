"""Rollout storage minibatches and the rollout collector."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from myriad.envs import FeatureSpec, TensorVecEnv, make
from myriad.nn import PopulationActorCritic, block_members
from myriad.rl import PPO, PPOConfig, RolloutCollector, RolloutStorage
from myriad.rl.storage import take_rows


class DriftEnv(TensorVecEnv):
    """A 1-D point that moves by the action; episodes time out after ``max_episode_steps``
    unless the point leaves [-2, 2] (termination). Contains no host syncs."""

    def __init__(self, num_envs: int, max_episode_steps: int = 3, device: str = "cpu") -> None:
        super().__init__(num_envs, device, validate=False)
        self.single_observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.single_action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.features = FeatureSpec(("x",), (-3.0,), (3.0,), cells=(6,))
        self.max_episode_steps = max_episode_steps
        self.x = torch.zeros(num_envs, device=self.device)

    def _reset_envs(self, mask):
        start = torch.rand(self.num_envs, generator=self.generator, device=self.device) - 0.5
        self.x = torch.where(mask, start, self.x)

    def _advance(self, actions):
        self.x = self.x + actions[:, 0]
        return -self.x.abs(), self.x.abs() > 2.0

    def _observe(self):
        return torch.stack([self.x, self.episode.lengths.float()], dim=1)

    def _features(self):
        return self.x[:, None].clone()


def fill(storage: RolloutStorage) -> None:
    t_, e_ = storage.num_steps, storage.num_envs
    index = torch.arange(t_ * e_, dtype=torch.float32).view(t_, e_)
    for t in range(t_):
        storage.add(
            obs=index[t, :, None].expand(-1, storage.obs_dim),
            actions=torch.zeros(e_, storage.action_dim),
            log_prob=torch.zeros(e_),
            value=index[t],
            reward=torch.ones(e_),
            terminated=torch.zeros(e_, dtype=torch.bool),
            truncated=torch.zeros(e_, dtype=torch.bool),
        )


@pytest.mark.parametrize(
    "member", [block_members(6, 3), torch.tensor([0, 1, 2, 0, 1, 2])], ids=["blocks", "strided"]
)
def test_member_major_minibatches(member):
    storage = RolloutStorage(4, member, obs_dim=2, action_dim=1)
    fill(storage)
    storage.compute_returns(0.99, 0.95, last_values=torch.zeros(6))
    seen = []
    gen = torch.Generator().manual_seed(0)
    batches = list(storage.minibatches(2, member_major=True, generator=gen))
    assert len(batches) == 2
    for batch in batches:
        assert batch.blocked and len(batch) == 12
        torch.testing.assert_close(batch.member, block_members(12, 3))
        # Each row is the stored row its index names, and belongs to its member's envs.
        torch.testing.assert_close(batch.obs[:, 0], batch.index.float())
        torch.testing.assert_close(member[batch.index % 6], batch.member)
        seen.append(batch.index)
    assert sorted(torch.cat(seen).tolist()) == list(range(24))
    # Shuffled within members: the order is not the stored one.
    assert not torch.equal(torch.cat(seen), storage._member_major_index.reshape(-1))


def test_rollout_only_fields_stay_out_of_minibatches():
    storage = RolloutStorage(3, torch.tensor([0, 0, 1, 1]), obs_dim=2, action_dim=1)
    per_row = storage.register_field("weight")
    storage.register_field("next_obs", (2,), in_batch=False)
    per_row.copy_(torch.arange(12.0).view(3, 4))
    batch = storage.batch(torch.tensor([1, 6, 11]))
    assert set(batch.extras) == {"weight"}
    torch.testing.assert_close(batch.extras["weight"], torch.tensor([1.0, 6.0, 11.0]))
    assert storage.flat("next_obs").shape == (12, 2)  # still there for whole-rollout reads


def test_plain_shuffle_and_unequal_members():
    storage = RolloutStorage(3, torch.tensor([0, 0, 0, 1]), obs_dim=1, action_dim=1)
    fill(storage)
    storage.compute_returns(0.99, 0.95)
    with pytest.raises(ValueError, match="equal env counts"):
        next(storage.minibatches(2, member_major=True))
    batches = list(storage.minibatches(3, member_major=False))
    assert not any(b.blocked for b in batches)
    index = torch.cat([b.index for b in batches])
    assert sorted(index.tolist()) == list(range(12))
    torch.testing.assert_close(torch.cat([b.member for b in batches]), (index % 4 == 3).long())


def test_collector_bootstraps_truncations_and_tracks_episodes():
    torch.manual_seed(0)
    env = DriftEnv(8, max_episode_steps=3)
    model = PopulationActorCritic(
        2, 1, 2, actor_hidden=(8,), critic_hidden=(8,), normalize_obs=False
    )
    with torch.no_grad():
        model.log_std.fill_(-2.0)  # stay inside [-2, 2]: every episode is truncated
    collector = RolloutCollector(env, model, generator=torch.Generator().manual_seed(1))
    assert collector.blocked
    storage = collector.make_storage(5)
    assert storage.features is not None and storage.features.shape == (5, 8, 1)
    collector.reset(seed=3)
    collector.collect(storage)
    assert storage.full
    # Episodes start at length 0 and are truncated on their third step (t = 2).
    assert storage.truncated[2].all() and not storage.truncated[[0, 1, 3, 4]].any()
    assert not storage.terminated.any()
    final = torch.stack([storage.obs[2, :, 0] + storage.actions[2, :, 0], torch.full((8,), 3.0)], 1)
    torch.testing.assert_close(
        storage.truncation_values[2], model.value(final, collector.member), rtol=1e-5, atol=1e-6
    )
    assert torch.all(storage.truncation_values[[0, 1, 3, 4]] == 0)
    # After a reset the observation restarts the episode clock.
    assert torch.all(storage.obs[3, :, 1] == 0)
    torch.testing.assert_close(storage.last_values, model.value(collector.obs, collector.member))


def test_truncation_bootstrap_evaluates_the_truncated_steps_only(monkeypatch):
    torch.manual_seed(0)
    env = DriftEnv(8, max_episode_steps=3)
    model = PopulationActorCritic(2, 1, 2, actor_hidden=(8,), critic_hidden=(8,))
    with torch.no_grad():
        model.log_std.fill_(-2.0)  # every episode is truncated, at t = 2
    collector = RolloutCollector(env, model, generator=torch.Generator().manual_seed(1))
    storage = collector.make_storage(5)
    collector.reset(seed=3)
    collector.collect_steps(storage)
    # The loop leaves the bootstraps at 0 and keeps the final observations.
    assert torch.all(storage.truncation_values == 0)
    rows: list[int] = []
    value = model.value

    def counted(obs, member, blocked=False):  # type: ignore[no-untyped-def]
        rows.append(obs.shape[0])
        return value(obs, member, blocked)

    monkeypatch.setattr(model, "value", counted)
    collector.bootstrap_truncations(storage)
    assert rows == [8]  # the eight truncated steps, not the 40 steps of the rollout
    monkeypatch.undo()
    # Without bootstrapping, truncations get nothing (kept transitions or not).
    for store in (False, True):
        plain = RolloutCollector(env, model, bootstrap_truncated=False, store_transitions=store)
        unbootstrapped = plain.make_storage(5)
        plain.reset(seed=3)
        plain.collect(unbootstrapped)
        assert unbootstrapped.truncated.any()
        assert torch.all(unbootstrapped.truncation_values == 0)
    final = torch.stack([storage.obs[2, :, 0] + storage.actions[2, :, 0], torch.full((8,), 3.0)], 1)
    torch.testing.assert_close(
        storage.truncation_values[2], model.value(final, collector.member), rtol=1e-5, atol=1e-6
    )
    assert torch.all(storage.truncation_values[[0, 1, 3, 4]] == 0)
    stats = collector.episodes.summary()
    assert stats["episode/count"] == 8.0 and stats["episode/length"] == 3.0
    torch.testing.assert_close(
        torch.tensor(stats["episode/return"]),
        storage.rewards[:3].sum(0).mean(),
        rtol=1e-5,
        atol=1e-6,
    )
    assert set(stats) >= {"episode/return/member_0", "episode/return/member_1"}
    assert collector.episodes.summary()["episode/count"] == 0.0


def test_collect_runs_without_host_syncs_and_feeds_an_update(monkeypatch):
    torch.manual_seed(0)
    env = DriftEnv(8)
    model = PopulationActorCritic(2, 1, 4, "independent", actor_hidden=(8,), critic_hidden=(8,))
    collector = RolloutCollector(env, model, generator=torch.Generator().manual_seed(1))
    storage = collector.make_storage(6)
    collector.reset(seed=0)

    def forbidden(*args, **kwargs):
        raise AssertionError("host sync inside the rollout loop")

    for name in ("item", "tolist", "numpy", "cpu", "__bool__", "__float__", "__int__"):
        monkeypatch.setattr(torch.Tensor, name, forbidden)
    collector.collect_steps(storage)
    monkeypatch.undo()
    collector.bootstrap_truncations(storage)  # after the loop: reads the truncation count
    stats = PPO(model, PPOConfig(epochs=1, minibatches=2)).update(storage)
    assert all(np.isfinite(v) for v in stats.values())


def test_collector_on_nav_env_and_ppo_update_stats():
    torch.manual_seed(0)
    env = make("nav-empty", 8, "cpu", task="dense", max_episode_steps=5)
    model = PopulationActorCritic(
        env.obs_dim, env.action_dim, 2, "embedding", actor_hidden=(16,), critic_hidden=(16,)
    )
    collector = RolloutCollector(env, model)
    storage = collector.make_storage(8)
    collector.collect(storage)
    assert storage.truncated.any()
    ppo = PPO(model, PPOConfig(epochs=2, minibatches=2, entropy_coef=[0.0, 0.01]))
    before = [p.detach().clone() for p in model.parameters()]
    obs_count = model.obs_norm.count.clone()
    stats = ppo.update(storage)
    assert {
        "policy_loss",
        "value_loss",
        "entropy",
        "kl",
        "approx_kl",
        "clip_fraction",
        "grad_norm",
        "lr",
        "loss",
        "explained_variance",
    } <= set(stats)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert model.obs_norm.count == obs_count + 8 * 8
    with pytest.raises(ValueError, match="entropy_coef"):
        ppo.set_entropy_coef([0.1, 0.2, 0.3])


def test_extra_loss_terms_are_added():
    torch.manual_seed(0)
    env = DriftEnv(4)
    model = PopulationActorCritic(2, 1, 2, actor_hidden=(8,), critic_hidden=(8,))
    collector = RolloutCollector(env, model)
    storage = collector.make_storage(4)
    collector.collect(storage)
    calls = []

    def pull_to_zero(algorithm, batch, evaluation):
        calls.append(batch.blocked)
        loss = evaluation.mean.square().mean()
        return 10.0 * loss, {"pull": loss.detach()}

    ppo = PPO(
        model, PPOConfig(epochs=1, minibatches=2, schedule="fixed"), extra_terms=[pull_to_zero]
    )
    stats = ppo.update(storage)
    assert calls == [True, True] and "pull" in stats
    batch = next(storage.minibatches(1))
    total, parts = ppo.loss(batch)
    base, _ = PPO.ppo_loss(ppo, batch, ppo.evaluate(batch))
    torch.testing.assert_close(total, base + 10.0 * parts["pull"])
    with pytest.raises(ValueError, match="schedule"):
        PPOConfig(schedule="cosine")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_rollout_loop_never_synchronises():
    torch.manual_seed(0)
    env = DriftEnv(64, device="cuda")
    for parameterization in ("shared_trunk", "embedding", "independent"):
        model = PopulationActorCritic(2, 1, 4, parameterization, actor_hidden=(16,)).cuda()
        collector = RolloutCollector(env, model, generator=torch.Generator("cuda").manual_seed(0))
        storage = collector.make_storage(8)
        collector.reset(seed=0)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            collector.collect_steps(storage)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        collector.bootstrap_truncations(storage)
        stats = PPO(model, PPOConfig(epochs=1, minibatches=2)).update(storage)
        assert all(np.isfinite(v) for v in stats.values())


@pytest.mark.parametrize(
    ("shape", "dtype"),
    [
        ((50, 2), torch.float32),
        ((50, 4), torch.float32),
        ((50, 3), torch.float32),
        ((50, 2, 2), torch.float32),
        ((50, 2), torch.float64),
        ((50,), torch.bool),
    ],
)
def test_take_rows_gives_index_select_bit_for_bit(shape, dtype):
    gen = torch.Generator().manual_seed(0)
    rows = (torch.randn(shape, generator=gen) * 10).to(dtype)
    if dtype.is_floating_point:
        rows.view(-1)[::7] = float("nan")
    index = torch.randint(0, shape[0], (80,), generator=gen)  # repeats included
    got, want = take_rows(rows, index), rows.index_select(0, index)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
