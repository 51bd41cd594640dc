"""PPO's value clip with value normalisation: centred on the critics' outputs at collection.

``PPO.prepare`` folds the rollout's returns into the value normaliser before the epochs. The clip
bounds how far an update moves each critic output, so its centre is that output before the
update (the stored value normalised with the statistics of the collection), not the stored value
normalised with the updated statistics: on the latter the clip would start displaced by the
statistics' shift and stop the critic's gradient on one side.
"""

from __future__ import annotations

import torch

from myriad.envs import make
from myriad.nn import PopulationActorCritic
from myriad.nn.population import PopulationLinear
from myriad.rl import (
    PPO,
    Batch,
    PPOConfig,
    RolloutCollector,
    RolloutStorage,
    clipped_value_loss,
)
from myriad.utils.seeding import make_generator, seed_everything

NUM_ENVS, NUM_STEPS = 32, 16


def rollout(seed: int = 0) -> tuple[PopulationActorCritic, RolloutCollector, RolloutStorage]:
    """A fresh two-member population and one rollout of a dense nav task (untrained critics, so
    the returns are far from the stored values and the first statistics update shifts a lot)."""
    seed_everything(seed)
    env = make("nav-empty", NUM_ENVS, "cpu", task="dense", max_episode_steps=40)
    model = PopulationActorCritic(
        env.obs_dim, env.action_dim, 2, actor_hidden=(32, 32), critic_hidden=(32, 32)
    )
    collector = RolloutCollector(env, model, generator=make_generator(seed, "cpu"))
    storage = collector.make_storage(NUM_STEPS)
    collector.reset(seed)
    collector.collect(storage)
    return model, collector, storage


def whole_batch(storage: RolloutStorage) -> Batch:
    return next(storage.minibatches(1, True, torch.Generator().manual_seed(0)))


def critic_bias(model: PopulationActorCritic) -> torch.nn.Parameter:
    """The critics' output biases ``[M, 1]`` (shared trunk): adding ``d`` moves every critic
    output by ``d`` in the normalised scale."""
    head = model.critic.head
    assert isinstance(head, PopulationLinear)
    return head.bias


def critic_grads(model: PopulationActorCritic, loss: torch.Tensor) -> list[torch.Tensor]:
    return list(torch.autograd.grad(loss, list(model.critic.parameters()), retain_graph=True))


def test_clip_is_inactive_before_the_critic_moves_whatever_the_statistics_update():
    model, _, storage = rollout()
    vn = model.value_norm
    assert vn is not None
    rows = storage.member.expand_as(storage.values)
    before = vn.normalize(storage.values, rows)  # the critics' outputs at collection
    ppo = PPO(model, PPOConfig(value_clip=0.2))
    ppo.prepare(storage)
    # The update moved the statistics far: normalised with them, the stored values sit well
    # outside the clip range of the critics' unchanged outputs.
    assert (vn.normalize(storage.values, rows) - before).abs().mean() > 1.0
    batch = whole_batch(storage)
    evaluation = ppo.evaluate(batch)
    clipped = ppo.value_loss(batch, evaluation)
    plain = (
        (vn.normalize(evaluation.value, batch.member) - vn.normalize(batch.returns, batch.member))
        .square()
        .mean()
    )
    torch.testing.assert_close(clipped, plain)
    for a, b in zip(critic_grads(model, clipped), critic_grads(model, plain)):
        torch.testing.assert_close(a, b)


def test_clip_is_centred_on_the_critics_outputs_at_collection():
    model, _, storage = rollout(1)
    vn = model.value_norm
    assert vn is not None
    centre = vn.normalize(storage.values, storage.member.expand_as(storage.values))
    ppo = PPO(model, PPOConfig(value_clip=0.2))
    ppo.prepare(storage)
    batch = whole_batch(storage)
    old = centre.reshape(-1)[batch.index]
    returns = vn.normalize(batch.returns, batch.member)
    bias = critic_bias(model)
    for shift in (0.1, -0.15, 0.5, -0.7):  # inside and outside the clip range, both ways
        with torch.no_grad():
            bias.add_(shift)
        value = ppo.evaluate(batch).value
        expected = clipped_value_loss(vn.normalize(value, batch.member), old, returns, 0.2).mean()
        torch.testing.assert_close(ppo.value_loss(batch, ppo.evaluate(batch)), expected)
        if abs(shift) <= 0.2:
            # Within the clip range of the centre: the clipped loss is the plain one.
            plain = (vn.normalize(value, batch.member) - returns).square().mean()
            torch.testing.assert_close(ppo.value_loss(batch, ppo.evaluate(batch)), plain)
        with torch.no_grad():
            bias.sub_(shift)


def test_outside_an_update_the_centre_uses_the_current_statistics():
    model, collector, storage = rollout(2)
    ppo = PPO(model, PPOConfig(value_clip=0.2, epochs=1, minibatches=2))
    ppo.update(storage)
    vn = model.value_norm
    assert vn is not None
    collector.collect(storage)  # collected under the statistics the update left
    storage.compute_returns(0.99, 0.95)
    batch = whole_batch(storage)
    evaluation = ppo.evaluate(batch)
    plain = (
        (vn.normalize(evaluation.value, batch.member) - vn.normalize(batch.returns, batch.member))
        .square()
        .mean()
    )
    torch.testing.assert_close(ppo.value_loss(batch, evaluation), plain)


def test_without_value_normalisation_the_centre_is_the_stored_value():
    seed_everything(3)
    env = make("nav-empty", NUM_ENVS, "cpu", task="dense", max_episode_steps=40)
    model = PopulationActorCritic(
        env.obs_dim, env.action_dim, 1, critic_hidden=(16,), normalize_value=False
    )
    collector = RolloutCollector(env, model, generator=make_generator(3, "cpu"))
    storage = collector.make_storage(NUM_STEPS)
    collector.collect(storage)
    ppo = PPO(model, PPOConfig(value_clip=0.2))
    ppo.prepare(storage)
    batch = whole_batch(storage)
    with torch.no_grad():
        critic_bias(model).add_(0.5)
    evaluation = ppo.evaluate(batch)
    expected = clipped_value_loss(evaluation.value, batch.values, batch.returns, 0.2).mean()
    torch.testing.assert_close(ppo.value_loss(batch, evaluation), expected)


def critic_error(value_clip: float | None, iterations: int) -> float:
    """Critic-only updates on fresh rollouts of a fixed policy; the mean absolute error of the
    critics' values against the last rollout's returns, in units of the returns' spread."""
    model, collector, storage = rollout(4)
    ppo = PPO(
        model,
        PPOConfig(value_clip=value_clip, lr=1e-3, epochs=4, minibatches=4),
        generator=torch.Generator().manual_seed(4),
    )
    for _ in range(iterations):
        collector.collect(storage)
        ppo.update(storage, critic_only=True)
    collector.collect(storage)
    storage.compute_returns(0.99, 0.95)
    with torch.no_grad():
        values = model.value(storage.flat("obs"), storage.member.repeat(NUM_STEPS))
    returns = storage.returns.reshape(-1)
    return float((values - returns).abs().mean() / returns.std())


def test_critic_learns_with_the_clip():
    # With the clip's centre displaced by the statistics' shift, the critics stayed near their
    # initial outputs (error about the returns' whole spread); centred on their outputs they
    # fit the returns about as well as without the clip.
    clipped, plain = critic_error(0.2, 10), critic_error(None, 10)
    assert clipped < 0.6, (clipped, plain)
    assert clipped < 1.5 * plain, (clipped, plain)
