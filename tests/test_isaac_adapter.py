"""Isaac adapters against fake envs that follow Isaac Lab's and IsaacGymEnvs' published APIs."""

import sys

import gymnasium as gym
import numpy as np
import pytest
import torch

from myriad.envs.checker import run_checks
from myriad.envs.isaac import (
    IsaacGymVecEnv,
    IsaacLabVecEnv,
    make_isaacgym_env,
    make_isaaclab_env,
)
from myriad.utils.optional import MissingDependencyError

E, O, A, LIMIT = 6, 5, 3, 7


class FakeIsaacLabEnv:
    """A ``DirectRLEnv``-like point mass: auto-resets inside ``step``, obs under "policy"."""

    def __init__(self):
        self.num_envs, self.device, self.max_episode_length = E, "cpu", LIMIT
        self.single_observation_space = gym.spaces.Dict(
            {"policy": gym.spaces.Box(-np.inf, np.inf, (O,))}
        )
        self.single_action_space = gym.spaces.Box(-np.inf, np.inf, (A,))
        self.state = torch.zeros(E, O)
        self.t = torch.zeros(E, dtype=torch.long)
        self.closed = False

    def _initial(self, n: int) -> torch.Tensor:
        return torch.randn(n, O, generator=self.gen)

    def reset(self, seed=None, options=None):
        self.gen = torch.Generator().manual_seed(0 if seed is None else seed)
        self.state = self._initial(E)
        self.t.zero_()
        return {"policy": self.state.clone()}, {}

    def step(self, action):
        self.state[:, :A] += 0.1 * action
        self.t += 1
        terminated = self.state[:, 0] > 1.5
        truncated = (self.t >= self.max_episode_length) & ~terminated
        reward = -self.state.norm(dim=1)
        done = terminated | truncated
        n = int(done.sum())
        if n:
            self.state[done] = self._initial(n)
            self.t[done] = 0
        return {"policy": self.state.clone()}, reward, terminated, truncated, {"log": {}}

    def close(self):
        self.closed = True


class FakeVecTask:
    """An IsaacGymEnvs ``VecTask``-like task: resets lazily at the start of the next step."""

    def __init__(self):
        self.num_envs, self.num_obs, self.num_actions = E, O, A
        self.device, self.max_episode_length = "cpu", LIMIT
        self.gen = torch.Generator().manual_seed(0)
        self.obs = torch.zeros(E, O)
        self.progress = torch.zeros(E, dtype=torch.long)
        self.reset_buf = torch.ones(E, dtype=torch.long)

    def seed(self, seed):
        self.gen = torch.Generator().manual_seed(seed)

    def _reset_idx(self, ids: torch.Tensor) -> None:
        self.obs[ids] = torch.randn(len(ids), O, generator=self.gen)
        self.progress[ids] = 0
        self.reset_buf[ids] = 0

    def reset(self):
        self._reset_idx(torch.arange(E))
        return {"obs": self.obs.clone()}

    def step(self, actions):
        ids = self.reset_buf.nonzero().flatten()
        if len(ids):
            self._reset_idx(ids)
        self.obs[:, :A] += 0.1 * actions
        self.progress += 1
        fell = self.obs[:, 0] > 1.5
        time_outs = self.progress >= self.max_episode_length
        self.reset_buf = (fell | time_outs).long()
        reward = -self.obs.norm(dim=1)
        return {"obs": self.obs.clone()}, reward, self.reset_buf.clone(), {"time_outs": time_outs}


def test_isaaclab_adapter_contract():
    fake = FakeIsaacLabEnv()
    env = IsaacLabVecEnv(fake, feature_indices=(0, 1), feature_low=-5.0, feature_high=5.0)
    assert (env.num_envs, env.obs_dim, env.action_dim, env.max_episode_steps) == (E, O, A, LIMIT)
    obs = env.reset(seed=1)
    assert obs.shape == (E, O) and obs.dtype == torch.float32
    ones = torch.ones(E, A)
    total = torch.zeros(E)
    for _ in range(LIMIT):
        obs, rew, term, trunc, info = env.step(ones)
        total += rew
        assert info["final_obs_is_reset_obs"]
        assert torch.equal(info["features"], info["final_obs"][:, :2].clamp(-5, 5))
    assert trunc.any() or term.any()
    ended = info["done"]
    assert torch.equal(ended, term | trunc)
    assert torch.allclose(info["episode_return"][ended], total[ended])
    env.close()
    assert fake.closed


def test_isaacgym_adapter_contract_and_time_outs():
    env = IsaacGymVecEnv(FakeVecTask(), feature_low=-5.0, feature_high=5.0)
    start = env.reset(seed=2)
    push = torch.zeros(E, A)
    push[:, 1] = 1.0  # moves obs[1] by 0.1 per step; obs[0] (the fall test) stays put
    for _ in range(LIMIT):
        obs, rew, term, trunc, info = env.step(push)
    assert (trunc | term).all() and trunc.any()
    # VecTask resets lazily, so the observation of a truncated env is its terminal state (LIMIT
    # pushes from the start), not a fresh reset.
    torch.testing.assert_close(info["final_obs"][trunc, 1], start[trunc, 1] + 0.1 * LIMIT)
    assert (info["episode_length"][trunc] == LIMIT).all()
    *_, info = env.step(push)
    assert (env.episode.lengths[~info["done"]] == 1).all()


@pytest.mark.parametrize("factory", [FakeIsaacLabEnv, FakeVecTask])
def test_adapters_validate_actions_and_features(factory):
    adapter = IsaacLabVecEnv if factory is FakeIsaacLabEnv else IsaacGymVecEnv
    env = adapter(factory(), feature_low=-5.0, feature_high=5.0)
    env.reset(seed=0)
    with pytest.raises(ValueError, match="shape"):
        env.step(torch.zeros(E, A + 1))
    with pytest.raises(ValueError, match="feature_indices"):
        adapter(factory(), feature_indices=(O,))


def test_isaaclab_adapter_checker_report():
    """Every check passes except auto-reset: Isaac Lab does not expose the final observation,
    so ``final_obs`` is the reset observation for envs that ended (documented)."""
    env = IsaacLabVecEnv(FakeIsaacLabEnv(), feature_low=-50.0, feature_high=50.0)
    report = run_checks(env, steps=8)
    failed = [name for name, ok, _ in report.rows if not ok]
    assert failed == ["auto-reset"]


@pytest.mark.parametrize(
    ("factory", "module"), [(make_isaaclab_env, "isaaclab"), (make_isaacgym_env, "isaacgym")]
)
def test_missing_isaac_is_one_line(monkeypatch, factory, module):
    monkeypatch.setitem(sys.modules, module, None)
    monkeypatch.setitem(sys.modules, f"{module}.app", None)
    with pytest.raises(MissingDependencyError) as err:
        factory("Isaac-Cartpole-v0", 4)
    assert "\n" not in str(err.value) and "not installed" in str(err.value)
