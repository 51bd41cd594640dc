"""The adversarial reward's labels follow the env-to-member mapping of the rollout exactly."""

from __future__ import annotations

import math

import torch

from myriad.finetune.discriminator import AdversarialReward, DiscriminatorConfig, rollout_labels
from myriad.rl import RolloutStorage

# A non-trivial layout: members interleaved, not in contiguous blocks.
MEMBER = torch.tensor([2, 0, 1, 1, 0, 2])
NUM_STEPS = 5


def storage_with_member_signature(seed: int) -> RolloutStorage:
    """A rollout whose observations say which member acted (one-hot of ``MEMBER[e]``)."""
    g = torch.Generator().manual_seed(seed)
    storage = RolloutStorage(NUM_STEPS, MEMBER, 3, 1, num_members=3)
    one_hot = torch.nn.functional.one_hot(MEMBER, 3).float()
    for _ in range(NUM_STEPS):
        storage.add(
            obs=one_hot + 0.05 * torch.randn(6, 3, generator=g),
            actions=torch.randn(6, 1, generator=g),
            log_prob=torch.zeros(6),
            value=torch.zeros(6),
            reward=torch.zeros(6),
            terminated=torch.zeros(6, dtype=torch.bool),
            truncated=torch.zeros(6, dtype=torch.bool),
        )
    return storage


def test_labels_follow_the_env_to_member_mapping():
    storage = storage_with_member_signature(0)
    labels = rollout_labels(storage).view(NUM_STEPS, 6)
    for t in range(NUM_STEPS):
        assert labels[t].tolist() == [2, 0, 1, 1, 0, 2]
    # Row t * E + e of the flat rollout is env e's step t.
    flat = rollout_labels(storage)
    for index in (0, 7, 17, 29):
        assert int(flat[index]) == int(MEMBER[index % 6])


def test_discriminator_learns_the_mapping_and_rewards_followers_only():
    torch.manual_seed(0)
    reward = AdversarialReward(
        3,
        1,
        3,
        coef=0.5,
        config=DiscriminatorConfig(hidden=(16,), lr=1e-2, epochs=20),
        generator=torch.Generator().manual_seed(1),
    )
    for seed in range(5):
        bonus, stats = reward(storage_with_member_signature(seed))
    # Scored before fitting each rollout: after a few rollouts it recognises every member.
    assert stats["disc_accuracy"] == 1.0
    bonus = bonus.view(NUM_STEPS, 6)
    leader_envs, follower_envs = MEMBER == 0, MEMBER != 0
    assert (bonus[:, leader_envs] == 0).all()
    # Recognised followers pay almost nothing (c_adv * log q with q near 1); a uniform guess
    # would cost them c_adv * log 3.
    assert (bonus[:, follower_envs] <= 0).all()
    assert (bonus[:, follower_envs] > -0.1 * 0.5 * math.log(3)).all()
