"""OfflineTD3 learns from fixed data: a one-step task with a known best action, and a two-step
chain whose value needs bootstrapping through the target networks."""

import numpy as np
import torch

from myriad.rl.td3 import OfflineTD3, TD3Config


def test_td3_finds_the_best_action_of_a_bandit():
    # Reward -(a - 0.5 s)^2, one step (terminal): the best action is 0.5 s.
    rng = np.random.default_rng(0)
    n = 4000
    s = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
    a = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
    data = {
        "observations": s,
        "actions": a,
        "rewards": -((a - 0.5 * s) ** 2)[:, 0],
        "next_observations": s,
        "terminals": np.ones(n, bool),
    }
    td3 = OfflineTD3(1, 1, TD3Config(hidden=(32, 32), lr=1e-3, batch_size=128), seed=0)
    td3.fit(data, 1500)
    probe = torch.linspace(-0.8, 0.8, 9)[:, None]
    np.testing.assert_allclose(td3.act(probe).numpy(), 0.5 * probe.numpy(), atol=0.1)


def test_td3_bootstraps_through_a_chain():
    # State 0 -> state 1 (reward 0) -> terminal with reward a at state 1. The value of state 0
    # is gamma * max_a a = gamma; the policy must push a to +1 at state 1.
    rng = np.random.default_rng(1)
    n = 2000
    first = rng.random(n) < 0.5
    obs = np.where(first, 0.0, 1.0).astype(np.float32)[:, None]
    act = rng.uniform(-1, 1, (n, 1)).astype(np.float32)
    data = {
        "observations": obs,
        "actions": act,
        "rewards": np.where(first, 0.0, act[:, 0]).astype(np.float32),
        "next_observations": np.ones((n, 1), np.float32),
        "terminals": ~first,
    }
    # No target smoothing noise, so the fixed point is exactly gamma * 1.
    cfg = TD3Config(hidden=(32, 32), lr=1e-3, batch_size=128, gamma=0.9, policy_noise=0.0)
    td3 = OfflineTD3(1, 1, cfg, seed=0)
    td3.fit(data, 1500)
    assert float(td3.act(torch.ones(1, 1))) > 0.9
    with torch.no_grad():
        q0 = td3.q(td3.critics, torch.zeros(1, 1), td3.act(torch.zeros(1, 1))).min(0).values
    assert abs(float(q0) - 0.9) < 0.1
