"""Adapters both ways between myriad VecEnvs and Gymnasium vector envs."""

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.wrappers.vector import RecordEpisodeStatistics

from myriad.envs import make
from myriad.envs.checker import check_env
from myriad.envs.gymnasium import GymnasiumVecEnv, VecEnvToGymnasium, make_gymnasium


def test_wrapped_pendulum_matches_gymnasium():
    """Same seed and actions: the wrapper's obs/rewards equal Gymnasium's, with actions in
    [-1, 1] mapped onto Pendulum's [-2, 2]."""
    env = make_gymnasium(3, env_id="Pendulum-v1")
    ref = gym.make_vec("Pendulum-v1", num_envs=3, vectorization_mode="sync")
    obs = env.reset(seed=5)
    ref_obs, _ = ref.reset(seed=5)
    np.testing.assert_allclose(obs.numpy(), ref_obs, rtol=1e-6)
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        a = torch.rand(3, 1, generator=gen) * 2 - 1
        obs, rew, *_ = env.step(a)
        ref_obs, ref_rew, *_ = ref.step(2.0 * a.numpy())
        np.testing.assert_allclose(obs.numpy(), ref_obs, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(rew.numpy(), ref_rew, rtol=1e-5, atol=1e-6)


def test_wrapped_env_final_obs_on_truncation():
    env = make_gymnasium(2, env_id="Pendulum-v1", max_episode_steps=5)
    env.reset(seed=0)
    for _ in range(4):
        env.step(torch.zeros(2, 1))
    obs, _, term, trunc, info = env.step(torch.zeros(2, 1))
    assert trunc.all() and not term.any()
    assert not torch.equal(info["final_obs"], obs)
    assert info["episode_length"].tolist() == [5, 5]


def test_wrapped_ant_v5_passes_checker():
    env = make_gymnasium(2, env_id="Ant-v5", max_episode_steps=20, feature_indices=(0, 1))
    check_env(env, steps=8)
    assert env.obs_dim == 105 and env.action_dim == 8


def test_requires_same_step_autoreset():
    vec = gym.make_vec("Pendulum-v1", num_envs=2, vectorization_mode="sync")
    with pytest.raises(ValueError, match="SAME_STEP"):
        GymnasiumVecEnv(vec)


def test_myriad_env_as_gymnasium_vector_env():
    genv = VecEnvToGymnasium(make("nav-u-maze", 4, max_episode_steps=10))
    assert isinstance(genv, gym.vector.VectorEnv)
    wrapped = RecordEpisodeStatistics(genv)
    obs, _ = wrapped.reset(seed=0)
    assert obs.shape == (4, 4) and genv.observation_space.contains(obs.astype(np.float32))
    for _ in range(10):
        obs, rew, term, trunc, info = wrapped.step(genv.action_space.sample())
        assert isinstance(obs, np.ndarray) and rew.shape == (4,)
    assert trunc.all()
    assert info["_final_obs"].all() and info["final_obs"][0].shape == (4,)
    assert len(wrapped.return_queue) == 4


def test_round_trip_keeps_trajectories():
    """myriad -> Gymnasium -> myriad reproduces the original env's trajectory."""
    native = make("nav-two-rooms", 3)
    round_trip = GymnasiumVecEnv(VecEnvToGymnasium(make("nav-two-rooms", 3)), max_episode_steps=200)
    a0, b0 = native.reset(seed=1), round_trip.reset(seed=1)
    assert torch.equal(a0, b0)
    gen = torch.Generator().manual_seed(1)
    for _ in range(30):
        act = torch.rand(3, 2, generator=gen) * 2 - 1
        assert torch.equal(native.step(act)[0], round_trip.step(act)[0])
