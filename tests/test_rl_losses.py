"""GAE and the PPO loss pieces against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from myriad.nn import block_members
from myriad.rl import (
    RolloutStorage,
    adaptive_lr,
    approx_kl,
    clip_fraction,
    clipped_surrogate,
    clipped_value_loss,
    compute_gae,
    entropy_bonus,
    normalize_advantages,
)

GAMMA, LAM = 0.9, 0.8


def gae_inputs():
    # env 0 is truncated at t=1 (V(final_obs) = 4.0); env 1 terminates at t=0, where a
    # truncation value is also supplied and must be ignored because the step is not truncated.
    rewards = torch.tensor([[1.0, 1.0], [2.0, 1.0], [3.0, 1.0]])
    values = torch.tensor([[0.5, 1.0], [1.0, 1.0], [1.5, 1.0]])
    terminated = torch.tensor([[False, True], [False, False], [False, False]])
    truncated = torch.tensor([[False, False], [True, False], [False, False]])
    truncation_values = torch.tensor([[0.0, 7.0], [4.0, 0.0], [0.0, 0.0]])
    last_values = torch.tensor([2.0, 0.5])
    return rewards, values, terminated, truncated, truncation_values, last_values


# Worked by hand with gamma = 0.9, lambda = 0.8 (gamma * lambda = 0.72):
# env 0: t=2: 3 + 0.9*2.0 - 1.5 = 3.3
#        t=1 (truncated): 2 + 0.9*4.0 - 1.0 = 4.6, no carry from t=2
#        t=0: 1 + 0.9*1.0 - 0.5 = 1.4, + 0.72*4.6 = 4.712
# env 1: t=2: 1 + 0.9*0.5 - 1 = 0.45
#        t=1: 1 + 0.9*1 - 1 = 0.9, + 0.72*0.45 = 1.224
#        t=0 (terminated): 1 - 1 = 0, no bootstrap, no carry
EXPECTED_ADV = torch.tensor([[4.712, 0.0], [4.6, 1.224], [3.3, 0.45]])


def test_gae_hand_computed_with_truncation_and_termination():
    rewards, values, terminated, truncated, tv, last = gae_inputs()
    masked_tv = torch.where(truncated, tv, 0.0)
    adv, ret = compute_gae(rewards, values, terminated | truncated, last, GAMMA, LAM, masked_tv)
    torch.testing.assert_close(adv, EXPECTED_ADV)
    torch.testing.assert_close(ret, EXPECTED_ADV + values)


def test_storage_masks_truncation_values_and_computes_gae():
    rewards, values, terminated, truncated, tv, last = gae_inputs()
    storage = RolloutStorage(3, torch.tensor([0, 1]), obs_dim=1, action_dim=1)
    for t in range(3):
        storage.add(
            obs=torch.zeros(2, 1),
            actions=torch.zeros(2, 1),
            log_prob=torch.zeros(2),
            value=values[t],
            reward=rewards[t],
            terminated=terminated[t],
            truncated=truncated[t],
            truncation_value=tv[t],
        )
    assert storage.full
    storage.compute_returns(GAMMA, LAM, last_values=last)
    torch.testing.assert_close(storage.advantages, EXPECTED_ADV)
    assert storage.truncation_values[0, 1] == 0.0
    with pytest.raises(RuntimeError, match="full"):
        storage.add(
            obs=torch.zeros(2, 1),
            actions=torch.zeros(2, 1),
            log_prob=torch.zeros(2),
            value=values[0],
            reward=rewards[0],
            terminated=terminated[0],
            truncated=truncated[0],
        )


def test_clipped_surrogate_hand_computed():
    ratio = torch.tensor([1.5, 0.5, 1.1, 0.7])
    adv = torch.tensor([2.0, -1.0, 3.0, 1.0])
    old = torch.tensor([0.3, -0.2, 0.0, 1.0])
    loss = clipped_surrogate(old + ratio.log(), old, adv, clip=0.2)
    # 1.5 * 2 = 3 vs 1.2 * 2 = 2.4 -> 2.4; 0.5 * -1 = -0.5 vs 0.8 * -1 = -0.8 -> -0.8;
    # 1.1 * 3 inside the clip range -> 3.3; 0.7 * 1 = 0.7 vs 0.8 * 1 -> 0.7 (pessimistic min).
    torch.testing.assert_close(loss, torch.tensor([-2.4, 0.8, -3.3, -0.7]))
    frac = clip_fraction(old + ratio.log(), old, 0.2)
    torch.testing.assert_close(frac, torch.tensor(0.75))


def test_clipped_value_loss_hand_computed():
    values = torch.tensor([1.0, 0.4, 3.0])
    old = torch.tensor([0.0, 0.0, 2.5])
    returns = torch.tensor([0.5, 1.0, 2.0])
    # s0: (1 - .5)^2 = .25 vs clipped .2 -> (.2 - .5)^2 = .09 -> .25
    # s1: (.4 - 1)^2 = .36 vs clipped .2 -> .64 -> .64
    # s2: (3 - 2)^2 = 1 vs clipped 2.7 -> .49 -> 1
    torch.testing.assert_close(
        clipped_value_loss(values, old, returns, 0.2), torch.tensor([0.25, 0.64, 1.0])
    )
    torch.testing.assert_close(
        clipped_value_loss(values, old, returns, None), torch.tensor([0.25, 0.36, 1.0])
    )


def test_entropy_bonus_per_member_and_kl_estimators():
    entropy = torch.tensor([1.0, 2.0, 3.0, 4.0])
    member = torch.tensor([0, 0, 1, 1])
    torch.testing.assert_close(
        entropy_bonus(entropy, member, torch.tensor([0.1, 0.0])), torch.tensor(0.075)
    )
    torch.testing.assert_close(entropy_bonus(entropy, None, 0.1), torch.tensor(0.25))
    with pytest.raises(ValueError, match="member"):
        entropy_bonus(entropy, None, torch.tensor([0.1, 0.0]))
    kl = approx_kl(torch.tensor([math.log(2.0), 0.0]), torch.zeros(2))
    torch.testing.assert_close(kl, torch.tensor((1.0 - math.log(2.0)) / 2))


def test_adaptive_lr_rule():
    assert adaptive_lr(1e-3, 0.03, 0.01) == pytest.approx(1e-3 / 1.5)
    assert adaptive_lr(1e-3, 0.004, 0.01) == pytest.approx(1.5e-3)
    assert adaptive_lr(1e-3, 0.01, 0.01) == 1e-3
    assert adaptive_lr(1e-3, 0.02, 0.01) == 1e-3  # at 2 * target: unchanged
    assert adaptive_lr(1e-3, 0.005, 0.01) == 1e-3  # at target / 2: unchanged
    assert adaptive_lr(9e-3, 0.0, 0.01, max_lr=1e-2) == 1e-2
    assert adaptive_lr(1.2e-5, 1.0, 0.01, min_lr=1e-5) == 1e-5
    assert adaptive_lr(1e-3, float("nan"), 0.01) == 1e-3


def test_per_member_advantage_normalisation():
    torch.manual_seed(0)
    m, n = 3, 50
    member = block_members(m * n, m)
    adv = torch.randn(m * n) * torch.tensor([1.0, 10.0, 0.1]).repeat_interleave(n) + (
        torch.tensor([5.0, -3.0, 0.0]).repeat_interleave(n)
    )
    fast = normalize_advantages(adv, member, m, blocked=True)
    for i in range(m):
        rows = fast[member == i]
        torch.testing.assert_close(rows.mean(), torch.tensor(0.0), atol=1e-5, rtol=0)
        torch.testing.assert_close(rows.std(unbiased=False), torch.tensor(1.0), atol=1e-5, rtol=0)
    perm = torch.randperm(m * n)
    general = normalize_advantages(adv[perm], member[perm], m)
    torch.testing.assert_close(general, fast[perm], atol=1e-5, rtol=1e-5)
    whole = normalize_advantages(adv)
    torch.testing.assert_close(whole.mean(), torch.tensor(0.0), atol=1e-5, rtol=0)
    # Per-member scaling differs from whole-batch scaling when members differ in scale.
    assert not torch.allclose(whole, fast, atol=1e-2)
