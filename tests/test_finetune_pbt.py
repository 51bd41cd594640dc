"""PBT: which members are replaced, how hyperparameters mutate, per-member learning rates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from myriad.finetune.pbt import PBT, MemberScaledAdam, PBTConfig, exploit_explore
from myriad.nn import PopulationActorCritic
from myriad.rl import PPOConfig, RolloutStorage

OBJECTIVE = [5.0, 1.0, 3.0, 0.0, 4.0, 2.0, 7.0, 6.0]


def hyper(m: int = 8) -> torch.Tensor:
    return torch.stack(
        [torch.linspace(0.5, 2.0, m), torch.linspace(1e-3, 8e-3, m), torch.linspace(0.1, 0.3, m)],
        dim=1,
    )


def test_worst_quarter_copies_a_random_member_of_best_quarter():
    hp = hyper()
    decision = exploit_explore(
        OBJECTIVE, hp, torch.Generator().manual_seed(3), fraction=0.25, mutation_prob=0.15
    )
    # Ascending objective: member 3 (0.0), 1 (1.0) are the worst; 7 (6.0), 6 (7.0) the best.
    assert decision.replaced == [3, 1]
    # Replay the documented draw order with the same seed.
    g = torch.Generator().manual_seed(3)
    best = [7, 6]
    for dst, src in zip(decision.replaced, decision.sources):
        assert src == best[int(torch.randint(2, (1,), generator=g))]
        mutate = torch.rand(3, generator=g, dtype=torch.float64) < 0.15
        size = 1.1 + 0.4 * torch.rand(3, generator=g, dtype=torch.float64)
        up = torch.rand(3, generator=g, dtype=torch.float64) < 0.5
        factor = torch.where(mutate, torch.where(up, size, 1 / size), torch.ones(3).double())
        torch.testing.assert_close(decision.factors[dst], factor)
        torch.testing.assert_close(decision.hyperparameters[dst], (hp[src] * factor).float())
    untouched = [i for i in range(8) if i not in decision.replaced]
    torch.testing.assert_close(decision.hyperparameters[untouched], hp[untouched])


def test_mutation_factors_within_bounds():
    hp = hyper()
    g = torch.Generator().manual_seed(0)
    seen = []
    for _ in range(50):
        d = exploit_explore(OBJECTIVE, hp, g, fraction=0.5, mutation_prob=1.0)
        assert len(d.replaced) == 4
        f = d.factors[d.replaced].flatten()
        up, down = f[f > 1], f[f < 1]
        assert len(up) + len(down) == len(f)  # probability 1: every value mutated
        assert ((up >= 1.1) & (up <= 1.5)).all()
        assert ((1 / down >= 1.1) & (1 / down <= 1.5)).all()
        seen.append(f)
    f = torch.cat(seen)
    assert (f > 1).any() and (f < 1).any()  # both directions happen
    # Probability 0: plain copies. Bounds clamp the result.
    d = exploit_explore(OBJECTIVE, hp, g, fraction=0.25, mutation_prob=0.0)
    torch.testing.assert_close(d.hyperparameters[3], hp[d.sources[0]])
    bounds = torch.tensor([[0.9, 1.0], [0.0, 1.0], [0.0, 1.0]], dtype=torch.float64)
    d = exploit_explore(OBJECTIVE, hp, g, mutation_prob=1.0, bounds=bounds)
    assert (d.hyperparameters[:, 0] <= 1.0).all() and (d.hyperparameters[:, 0] >= 0.9).all()


def test_ties_replace_nobody():
    d = exploit_explore([1.0] * 8, hyper(), torch.Generator().manual_seed(0))
    assert d.replaced == [] and d.sources == []


def test_member_scaled_adam_is_a_per_member_learning_rate():
    torch.manual_seed(0)
    w0 = torch.randn(3, 4)
    grad = torch.randn(3, 4)

    def run(scale: list[float] | None) -> torch.Tensor:
        w = torch.nn.Parameter(w0.clone())
        if scale is None:
            opt = torch.optim.Adam([w], lr=0.1)
        else:
            opt = MemberScaledAdam([w], [w], 3, lr=0.1)
            opt.member_scale.copy_(torch.tensor(scale))
        for _ in range(3):
            w.grad = grad.clone()
            opt.step()
        return w.detach()

    plain, scaled = run(None), run([1.0, 0.0, 2.0])
    torch.testing.assert_close(scaled[0], plain[0])
    torch.testing.assert_close(scaled[1], w0[1])
    # Adam's step does not depend on the parameter value, so twice the step is twice the move.
    torch.testing.assert_close(scaled[2] - w0[2], 2 * (plain[2] - w0[2]))


def test_pbt_round_copies_weights_optimizer_state_and_hyperparameters():
    torch.manual_seed(0)
    model = PopulationActorCritic(3, 1, 4, "independent", actor_hidden=(8,), critic_hidden=(8,))
    cfg = PBTConfig(interval=2, fraction=0.25, mutation_prob=0.0)
    algo = PBT(model, PPOConfig(epochs=1, minibatches=1, schedule="fixed"), cfg)
    storage = RolloutStorage(4, torch.arange(4).repeat_interleave(2), 3, 1, num_members=4)
    for _ in range(4):
        storage.add(
            obs=torch.randn(8, 3),
            actions=torch.randn(8, 1),
            log_prob=torch.randn(8),
            value=torch.randn(8),
            reward=torch.randn(8),
            terminated=torch.zeros(8, dtype=torch.bool),
            truncated=torch.zeros(8, dtype=torch.bool),
        )
    algo.update(storage)
    before = algo.hyperparameters.clone()
    returns, counts = np.array([9.0, 1.0, 2.0, 0.0]), np.ones(4)
    assert "pbt/replaced" not in algo.end_iteration(returns, counts)  # interval not reached
    out = algo.end_iteration(returns, counts)
    assert out["pbt/replaced"] == 1.0 and algo.leader == 0
    for p in model.member_parameters():
        torch.testing.assert_close(p[3], p[0])
        for value in algo.optimizer.state[p].values():
            if value.shape == p.shape:
                torch.testing.assert_close(value[3], value[0])
    torch.testing.assert_close(algo.hyperparameters[3], before[0])
    torch.testing.assert_close(algo.hyperparameters[:3], before[:3])
    torch.testing.assert_close(algo.clip[3], before[0, 2])
    torch.testing.assert_close(algo.entropy_coef[3], before[0, 1])
    torch.testing.assert_close(algo.optimizer.member_scale[3], before[0, 0])
    assert algo.window.sum() == 0


def test_pbt_config_errors():
    with pytest.raises(ValueError, match="known: lr_scale, entropy_coef, clip"):
        PBTConfig(ranges={"gamma": (0.9, 0.99)})
    with pytest.raises(ValueError, match="mutation_factor"):
        PBTConfig(mutation_factor=(0.5, 1.5))
