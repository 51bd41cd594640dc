"""OfflineTD3 learns from fixed data: a one-step task with a known best action, and a two-step
chain whose value needs bootstrapping through the target networks; its batched critics and fused
optimiser compute the updates of the equations written out with separate networks."""

import copy

import numpy as np
import torch

from myriad.rl.td3 import OfflineTD3, TD3Config, TwinCritic, adam, mlp


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


def test_twin_critic_is_the_two_networks_it_was_built_from():
    torch.manual_seed(3)
    nets = [mlp(5, 1, (16, 8)) for _ in range(2)]
    twin = TwinCritic(nets)
    x = torch.randn(7, 5)
    expected = torch.stack([n(x).squeeze(-1) for n in nets])
    torch.testing.assert_close(twin(x), expected)
    torch.testing.assert_close(twin.first(x), expected[0])


def _reference_updates(obs_dim, act_dim, cfg, seed, data, steps):
    """TD3's updates written out with two separate critic networks, torch's per-parameter Adam
    and a parameter-by-parameter Polyak average: the module docstring's equations, drawing the
    same random numbers in the same order as OfflineTD3."""
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    actor = torch.nn.Sequential(mlp(obs_dim, act_dim, cfg.hidden), torch.nn.Tanh())
    critics = [mlp(obs_dim + act_dim, 1, cfg.hidden) for _ in range(2)]
    actor_t = copy.deepcopy(actor)
    critics_t = copy.deepcopy(critics)
    critic_params = [p for c in critics for p in c.parameters()]
    a_opt = torch.optim.Adam(actor.parameters(), lr=cfg.lr, foreach=False)
    c_opt = torch.optim.Adam(critic_params, lr=cfg.lr, foreach=False)
    n = data["rewards"].shape[0]
    for step in range(1, steps + 1):
        i = torch.randint(n, (cfg.batch_size,), generator=gen)
        s, a, r = data["observations"][i], data["actions"][i], data["rewards"][i]
        s2, d = data["next_observations"][i], data["terminals"][i]
        with torch.no_grad():
            eps = torch.randn(a.shape, generator=gen) * cfg.policy_noise
            a2 = (actor_t(s2) + eps.clamp(-cfg.noise_clip, cfg.noise_clip)).clamp(-1, 1)
            x2 = torch.cat([s2, a2], 1)
            y = r + cfg.gamma * (1 - d) * torch.minimum(
                critics_t[0](x2).squeeze(-1), critics_t[1](x2).squeeze(-1)
            )
        x = torch.cat([s, a], 1)
        loss = sum(((c(x).squeeze(-1) - y) ** 2).mean() for c in critics)
        c_opt.zero_grad()
        loss.backward()
        c_opt.step()
        if step % cfg.policy_delay == 0:
            actor_loss = -critics[0](torch.cat([s, actor(s)], 1)).mean()
            a_opt.zero_grad()
            actor_loss.backward()
            a_opt.step()
            with torch.no_grad():
                pairs = [(actor, actor_t), *zip(critics, critics_t)]
                for net, targ in pairs:
                    for p, pt in zip(net.parameters(), targ.parameters()):
                        pt.mul_(1 - cfg.tau).add_(cfg.tau * p)
    return actor, critics, actor_t, critics_t


def test_updates_match_the_equations_written_out():
    rng = np.random.default_rng(4)
    n, obs_dim, act_dim = 500, 3, 2
    data = {
        "observations": torch.as_tensor(rng.normal(size=(n, obs_dim)), dtype=torch.float32),
        "actions": torch.as_tensor(rng.uniform(-1, 1, (n, act_dim)), dtype=torch.float32),
        "rewards": torch.as_tensor(rng.normal(size=n), dtype=torch.float32),
        "next_observations": torch.as_tensor(rng.normal(size=(n, obs_dim)), dtype=torch.float32),
        "terminals": torch.as_tensor(rng.random(n) < 0.1, dtype=torch.float32),
    }
    cfg = TD3Config(hidden=(16, 16), lr=1e-3, batch_size=32, tau=0.05)
    td3 = OfflineTD3(obs_dim, act_dim, cfg, seed=2)
    td3.fit(data, 6)
    actor, critics, actor_t, critics_t = _reference_updates(obs_dim, act_dim, cfg, 2, data, 6)
    probe = torch.randn(9, obs_dim)
    torch.testing.assert_close(td3.act(probe), actor(probe).detach(), rtol=1e-5, atol=1e-5)
    x = torch.cat([probe, td3.act(probe)], 1)
    with torch.no_grad():
        expected = torch.stack([c(x).squeeze(-1) for c in critics])
        torch.testing.assert_close(td3.critics(x), expected, rtol=1e-5, atol=1e-5)
        expected_targ = torch.stack([c(x).squeeze(-1) for c in critics_t])
        torch.testing.assert_close(td3.critics_targ(x), expected_targ, rtol=1e-5, atol=1e-5)
    # The target networks, parameter by parameter (their outputs move too little in 6 updates
    # to show a missing average).
    for got, want in zip(td3.actor_targ.parameters(), actor_t.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)
    twin = TwinCritic(critics_t)
    for got, want in zip(td3.critics_targ.parameters(), twin.parameters()):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_adam_falls_back_where_torch_has_no_fused_cpu_kernel(monkeypatch):
    # torch 2.2-2.3 refuse fused=True for CPU tensors when the optimiser is built.
    real = torch.optim.Adam

    def no_fused(params, **kwargs):
        if kwargs.get("fused"):
            raise RuntimeError("`fused=True` requires all the params to be CUDA tensors")
        return real(params, **kwargs)

    monkeypatch.setattr(torch.optim, "Adam", no_fused)
    opt = adam([torch.nn.Parameter(torch.zeros(3))], 1e-3)
    assert opt.defaults["foreach"] is True and not opt.defaults.get("fused")
