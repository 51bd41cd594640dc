"""CPO's KL set point: the controller's rule, its bounds and state, CPO's per-follower
coefficients, exact resume, the config errors and the held KL on a small maze run."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import TINY_FINETUNE
from torch.distributions import Normal, kl_divergence

from myriad.cli import main
from myriad.finetune.api import finetune, resolve_config
from myriad.finetune.cpo import AWACPullTerm
from myriad.finetune.kl_setpoint import (
    KLSetpointConfig,
    KLSetpointController,
    fraction_in_band,
)
from myriad.finetune.runner import FinetuneRunner
from myriad.pretrain import pretrain
from myriad.utils.checkpoint import load_checkpoint
from myriad.utils.config import ConfigError
from myriad.viz.finetune_plots import kl_setpoint

CONFIG = KLSetpointConfig(
    eta=0.5,
    max_error=2.0,
    kl_coef_min=0.01,
    kl_coef_max=1.0,
    repulsion_eta=0.05,
    repulsion_max=0.3,
    damping=0.2,
    adversarial_eta=0.25,
    adversarial_coef_min=1e-3,
    adversarial_coef_max=0.05,
    low=0.5,
)


def controller(targets=(0.1, 0.3, 1.0), kl_coef=0.1, adversarial_coef=0.002):
    return KLSetpointController(targets, CONFIG, kl_coef, adversarial_coef)


# ---------------------------------------------------------------- the controller


def test_step_follows_the_rule_per_follower():
    c = controller()
    # follower 0 at 3x its target, follower 1 in [0.5, 1] x target, follower 2 at 0.2x.
    c.step(torch.tensor([0.3, 0.2, 0.2]))
    errors = [math.log(3.0), math.log(0.2 / 0.3), math.log(0.2)]
    expected_lambda = [0.1 * math.exp(0.5 * e) for e in errors]
    # c and rho: relax above the target, hold in [0.5, 1] x target, rise below half of it.
    expected_c = [0.002 * math.exp(-0.25 * errors[0]), 0.002, 0.002 * math.exp(-0.25 * errors[2])]
    expected_rho = [0.0, 0.0, -0.05 * errors[2]]
    assert c.kl_coef.tolist() == pytest.approx(expected_lambda, rel=1e-5)
    assert c.adversarial_coef.tolist() == pytest.approx(expected_c, rel=1e-5)
    assert c.repulsion.tolist() == pytest.approx(expected_rho, rel=1e-5, abs=1e-9)
    expected_penalty = [lam - rho for lam, rho in zip(expected_lambda, expected_rho)]
    assert c.penalty_coef.tolist() == pytest.approx(expected_penalty, rel=1e-5)
    assert c.kl_coef[0] > 0.1 and c.kl_coef[1] < 0.1 and c.kl_coef[2] < 0.1
    assert c.adversarial_coef[0] < 0.002 < c.adversarial_coef[2]


def test_error_is_symmetric_in_ratio_and_clipped():
    c = controller(targets=(0.1, 0.1, 0.1))
    # 4x too far and 4x too close move lambda by the same factor in opposite directions; 1000x
    # too far moves it no more than exp(max_error) x too far.
    c.step(torch.tensor([0.4, 0.025, 100.0]))
    up, down, capped = c.kl_coef.tolist()
    assert up / 0.1 == pytest.approx(0.1 / down, rel=1e-5)
    assert capped == pytest.approx(0.1 * math.exp(0.5 * 2.0), rel=1e-5)


def test_repulsion_turns_the_penalty_into_a_bonus_and_relaxes():
    c = controller(targets=(0.1, 0.1, 0.1))
    for _ in range(20):
        c.step(torch.tensor([0.001, 0.07, 0.3]))  # collapsed, inside the band, far
    assert c.penalty_coef[0] < 0 and c.repulsion[0] == pytest.approx(0.3)  # at repulsion_max
    assert c.repulsion[1] == 0 and c.repulsion[2] == 0 and c.penalty_coef[2] > 0
    for _ in range(40):
        c.step(torch.tensor([0.3, 0.07, 0.3]))  # now too far: the repulsion decays to 0
    assert c.repulsion[0] == 0 and c.penalty_coef[0] > 0


def test_damping_acts_on_the_change_of_the_error():
    c = KLSetpointController((0.1, 0.1), KLSetpointConfig(damping=0.2), 0.1, 0.002)
    c.step(torch.tensor([0.1, 0.1]))  # on target: nothing to damp yet
    assert c.penalty_coef.tolist() == pytest.approx(c.kl_coef.tolist())
    c.step(torch.tensor([0.15, 0.06]))  # one KL rising, one falling, both inside the band
    change = torch.tensor([math.log(1.5), math.log(0.6)])
    expected = c.kl_coef - c.repulsion + 0.2 * change
    torch.testing.assert_close(c.penalty_coef, expected)
    assert c.penalty_coef[0] > c.kl_coef[0] and c.penalty_coef[1] < c.kl_coef[1]
    c.step(torch.tensor([0.15, 0.06]))  # steady: the derivative term is gone again
    torch.testing.assert_close(c.penalty_coef, c.kl_coef - c.repulsion)


def test_followers_are_independent():
    a, b = controller(), controller()
    a.step(torch.tensor([0.3, 0.2, 0.2]))
    b.step(torch.tensor([0.3, 0.2, 5.0]))  # only follower 2's KL differs
    assert torch.equal(a.kl_coef[:2], b.kl_coef[:2])
    assert torch.equal(a.adversarial_coef[:2], b.adversarial_coef[:2])
    assert torch.equal(a.repulsion[:2], b.repulsion[:2])
    assert b.kl_coef[2] > a.kl_coef[2]


def test_bounds_hold_and_are_reached():
    c = controller()
    for _ in range(50):
        c.step(torch.tensor([10.0, 10.0, 10.0]))
    assert c.kl_coef.tolist() == pytest.approx([1.0] * 3)
    assert c.adversarial_coef.tolist() == pytest.approx([1e-3] * 3)
    assert c.repulsion.tolist() == [0.0] * 3
    for _ in range(50):
        c.step(torch.zeros(3))
    assert c.kl_coef.tolist() == pytest.approx([0.01] * 3)
    assert c.adversarial_coef.tolist() == pytest.approx([0.05] * 3)
    assert c.repulsion.tolist() == pytest.approx([0.3] * 3)
    # Initial values outside the bounds start clipped.
    clipped = controller(kl_coef=5.0, adversarial_coef=1.0)
    assert clipped.kl_coef.tolist() == pytest.approx([1.0] * 3)
    assert clipped.adversarial_coef.tolist() == pytest.approx([0.05] * 3)


def test_repulsion_off():
    c = KLSetpointController(
        (0.1,), KLSetpointConfig(repulsion_eta=0.0, repulsion_max=0.0), 0.1, 0.002
    )
    for _ in range(10):
        c.step(torch.zeros(1))
    assert c.repulsion.tolist() == [0.0] and c.penalty_coef.tolist() == c.kl_coef.tolist()


def test_without_adversarial_reward_only_lambda_moves():
    c = controller(adversarial_coef=None)
    c.step(torch.tensor([0.0, 0.0, 0.0]))
    assert c.adversarial_coef is None and "log_adversarial_coef" not in c.state_dict()
    assert (c.kl_coef < 0.1).all()


def test_state_round_trip_continues_exactly():
    a = controller()
    kls = torch.rand(6, 3, generator=torch.Generator().manual_seed(0))
    for kl in kls[:3]:
        a.step(kl)
    b = controller(kl_coef=0.5, adversarial_coef=0.01)
    b.load_state_dict(copy.deepcopy(a.state_dict()))
    for kl in kls[3:]:
        a.step(kl)
        b.step(kl)
    assert torch.equal(a.kl_coef, b.kl_coef)
    assert torch.equal(a.adversarial_coef, b.adversarial_coef)
    assert torch.equal(a.repulsion, b.repulsion) and bool(a.repulsion.any())
    assert torch.equal(a.penalty_coef, b.penalty_coef)  # the damping's last error came along
    with pytest.raises(ValueError, match="saved KL targets"):
        controller(targets=(0.1, 0.3, 0.5)).load_state_dict(a.state_dict())


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="KL targets must be > 0"):
        KLSetpointController([0.1, 0.0])
    with pytest.raises(ValueError, match="0 < min <= max"):
        KLSetpointConfig(kl_coef_min=1.0, kl_coef_max=0.1)
    with pytest.raises(ValueError, match=r"repulsion_max=-0\.1 must be >= 0"):
        KLSetpointConfig(repulsion_max=-0.1)
    with pytest.raises(ValueError, match="one KL per follower"):
        controller().step(torch.zeros(2))


def test_fraction_in_band():
    kl = torch.tensor([[0.05, 1.0], [0.2, 2.5], [0.21, 0.49], [0.1, 0.5]])
    assert fraction_in_band(kl, torch.tensor([0.1, 1.0])).tolist() == [0.75, 0.5]


# ---------------------------------------------------------------- CPO with the set point

TINY = [
    *TINY_FINETUNE,
    "num_envs=24",
    "population.size=3",
    "algo.discriminator.hidden=[8]",
    "plots=false",
    "tensorboard=false",
]


def tiny(tmp_path, name: str, *extra: str) -> FinetuneRunner:
    return FinetuneRunner(resolve_config("cpo", [*TINY, *extra]), tmp_path / name)


def test_coefficients_reach_the_losses_per_follower(tmp_path):
    r = tiny(tmp_path, "run", "algo.kl_targets=[0.1,1.0]")
    cpo = r.algorithm
    cpo.kl_coef.copy_(torch.tensor([0.0, 0.3, 0.7]))
    cpo.adversarial_coef.copy_(torch.tensor([0.0, 0.01, 0.04]))
    r.collector.collect(r.storage)
    reference = copy.deepcopy(cpo.adversarial)
    obs, actions = reference._inputs(r.storage)
    labels = r.storage.member.repeat(r.storage.num_steps)
    log_q, _ = reference.score(obs, actions, labels)
    bonus = cpo.reward_bonus(r.storage).bonus.reshape(-1)
    expected = torch.tensor([0.0, 0.01, 0.04])[labels] * log_q.clamp(min=-10.0)
    torch.testing.assert_close(bonus, expected)

    cpo.prepare(r.storage)
    indices = r.storage.minibatch_indices(1, True, None)
    cpo.plan_minibatches(r.storage, [indices])
    batch = r.storage.batch(indices[0], blocked=True)
    plain = super(type(cpo), cpo).advantages(batch)  # SAPG's, before the KL penalty
    penalty = batch.log_probs - batch.extras["leader_log_prob"]
    lam = torch.tensor([0.0, 0.3, 0.7])[batch.member]
    torch.testing.assert_close(cpo.advantages(batch), plain - lam * penalty)

    # The AWAC pull scales with each follower's multiplier (the set point's lambda_i / lambda_0).
    pull = next(t for t in cpo.extra_terms if isinstance(t, AWACPullTerm))
    evaluation = cpo.evaluate(batch)
    losses = []
    for scale in ([1.0, 1.0, 1.0], [1.0, 2.0, 2.0], [1.0, 0.0, 0.0]):
        cpo.awac_scale.copy_(torch.tensor(scale))
        losses.append(pull(cpo, batch, evaluation)[0].detach())
    assert float(losses[0]) != 0.0
    torch.testing.assert_close(losses[1], 2 * losses[0])
    assert float(losses[2]) == 0.0
    r.close()


def test_logged_kl_is_the_exact_kl_on_own_states(tmp_path):
    initial = ("algo.setpoint.kl_coef_init=0.1", "algo.setpoint.adversarial_coef_init=0.002")
    r = tiny(tmp_path, "run", "algo.kl_target=0.2", *initial)
    r.learn(1)
    model, storage, cpo = r.model, r.storage, r.algorithm
    scalars = r.logger.latest()
    logged = torch.tensor([scalars["cpo/kl/follower_1"], scalars["cpo/kl/follower_2"]])
    assert torch.equal(cpo.follower_kl(storage), logged)
    # Members a few tenths of a nat apart, so that the states each KL is taken on matter.
    with torch.no_grad():
        for p in model.actor.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
        model.log_std[2].add_(0.5)
    obs = storage.obs  # [T, E, O]
    kl = cpo.follower_kl(storage)
    for k, i in enumerate((1, 2)):
        own = obs[:, storage.member == i].reshape(-1, obs.shape[-1])
        with torch.no_grad():
            mean_f, log_std_f = model.action_params(own, i)
            mean_l, log_std_l = model.action_params(own, 0)
        reference = (
            kl_divergence(
                Normal(mean_f.double(), log_std_f.double().exp()),
                Normal(mean_l.double(), log_std_l.double().exp()),
            )
            .sum(-1)
            .mean()
        )
        assert reference > 0.05
        assert float(kl[k]) == pytest.approx(float(reference), rel=1e-4)
        assert scalars[f"cpo/kl_target/follower_{i}"] == pytest.approx(0.2)
    # The coefficients logged are those the update used (the initial ones), and the step that
    # followed moved them by the rule.
    kl = torch.tensor([scalars["cpo/kl/follower_1"], scalars["cpo/kl/follower_2"]])
    assert scalars["cpo/kl_coef/follower_1"] == pytest.approx(0.1)
    assert scalars["cpo/adversarial_coef/follower_2"] == pytest.approx(0.002)
    setpoint = cpo.setpoint.config
    error = (kl / 0.2).log().clamp(-setpoint.max_error, setpoint.max_error)
    expected = 0.1 * torch.exp(setpoint.eta * error)
    expected = expected.clamp(setpoint.kl_coef_min, setpoint.kl_coef_max)
    torch.testing.assert_close(cpo.setpoint.kl_coef, expected, rtol=1e-4, atol=0)
    torch.testing.assert_close(cpo.awac_scale[1:], expected / 0.1, rtol=1e-4, atol=0)
    # The losses read lambda - rho (rho > 0 only for a follower below half its target).
    rho = (-setpoint.repulsion_eta * error * (kl < 0.1)).clamp(0.0, setpoint.repulsion_max)
    torch.testing.assert_close(cpo.kl_coef[1:], expected - rho, rtol=1e-4, atol=1e-7)
    assert cpo.awac_scale[0] == 1.0
    r.close()


def test_critic_warmup_keeps_the_fixed_coefficients(tmp_path):
    r = tiny(tmp_path, "run", "algo.kl_target=0.2", "algo.setpoint.adversarial_coef_init=0.02")
    cpo = r.algorithm
    before = copy.deepcopy(cpo.setpoint.state_dict())
    r.collector.collect(r.storage)
    cpo.update(r.storage, critic_only=True)
    assert cpo.coupling_stats["cpo/adversarial_coef/follower_1"] == pytest.approx(0.002)
    for key, value in cpo.setpoint.state_dict().items():
        # no step without actor updates (the damping's last error is NaN before the first)
        torch.testing.assert_close(value, before[key], rtol=0, atol=0, equal_nan=True, msg=key)
    r.collector.collect(r.storage)
    cpo.update(r.storage)
    assert cpo.coupling_stats["cpo/adversarial_coef/follower_1"] == pytest.approx(0.02)
    assert not torch.equal(cpo.setpoint.log_kl_coef, before["log_kl_coef"])
    r.close()


def test_fixed_mode_keeps_the_preset(tmp_path):
    r = tiny(
        tmp_path, "run", "algo.kl_preset=high", "algo.adversarial_coef=0.004", "algo.kl_target=null"
    )
    r.learn(2)
    assert r.algorithm.setpoint is None
    history = r.logger.history
    assert [v for _, v in history["cpo/kl_coef/follower_2"]] == pytest.approx([0.3, 0.3])
    assert [v for _, v in history["cpo/adversarial_coef/follower_1"]] == pytest.approx([0.004] * 2)
    assert "cpo/kl_target/follower_1" not in history
    assert r.algorithm.kl_coef.tolist() == pytest.approx([0.0, 0.3, 0.3])
    r.close()


@pytest.mark.parametrize(
    ("overrides", "target", "targets"),
    [
        ([], 0.3, None),  # the packaged default: a set point at 0.3 nats
        # A coefficient is the set point's initial value: a key's meaning never depends on
        # which other keys were typed; fixed coefficients are asked for with kl_target=null.
        (["algo.kl_preset=high"], 0.3, None),
        (["algo.kl_coef=0.2"], 0.3, None),
        (["algo.adversarial_coef=0.01"], 0.3, None),
        (["algo.kl_preset=high", "algo.kl_target=null"], None, None),
        (["algo.kl_penalty=false", "algo.kl_target=null"], None, None),
        (["algo.kl_preset=high", "algo.kl_target=0.5"], 0.5, None),
        (["algo.kl_coef=0.2", "algo.kl_targets=[0.1,0.3,1.0]"], 0.3, [0.1, 0.3, 1.0]),
        (["algo.kl_target=null"], None, None),
        (["algo.setpoint.eta=0.3"], 0.3, None),  # the controller's settings keep the set point
    ],
)
def test_the_default_is_the_set_point_and_fixed_coefficients_are_explicit(
    overrides, target, targets
):
    algo = resolve_config("cpo", overrides)["algo"]
    assert algo["kl_target"] == target
    assert algo["kl_targets"] == targets
    # Other algorithms have no couplings to choose.
    assert "kl_target" not in resolve_config("sapg", [])["algo"]


def test_resume_with_the_set_point_is_exact(tmp_path):
    extra = ("algo.kl_targets=[0.01,0.5]", "algo.setpoint.eta=1.0")
    straight = tiny(tmp_path, "straight", *extra)
    straight.learn(4)
    first = tiny(tmp_path, "split", *extra)
    first.learn(2)
    first.close()
    second = tiny(tmp_path, "split", *extra)
    second.algorithm.setpoint.log_kl_coef.fill_(0.0)  # everything must come from the checkpoint
    second.resume(tmp_path / "split")
    second.learn(4)
    a, b = straight.algorithm.setpoint, second.algorithm.setpoint
    assert torch.equal(a.log_kl_coef, b.log_kl_coef)
    assert torch.equal(a.log_adversarial_coef, b.log_adversarial_coef)
    assert torch.equal(a.repulsion, b.repulsion)
    assert not torch.allclose(a.kl_coef, torch.full((2,), 0.1))  # it did move
    for key, points in straight.logger.history.items():
        if key.startswith("cpo/"):
            assert points == second.logger.history[key], key
    for key, value in straight.model.state_dict().items():
        assert torch.equal(value, second.model.state_dict()[key]), key
    straight.close()
    second.close()


def test_config_errors_name_the_fix(tmp_path, capsys):
    fix = r"has 3 entries for 2 followers .*kl_targets=\[0.3,0.3\]"
    with pytest.raises(ConfigError, match=fix):
        tiny(tmp_path, "run", "algo.kl_targets=[0.1,0.3,1.0]")
    with pytest.raises(ConfigError, match="set kl_penalty=true"):
        tiny(tmp_path, "run", "algo.kl_target=0.3", "algo.kl_penalty=false")
    with pytest.raises(ConfigError, match="must be > 0"):
        tiny(tmp_path, "run", "algo.kl_target=-1")
    args = ["finetune", "--algo", "cpo", "--run-dir", str(tmp_path / "cli"), *TINY]
    assert main([*args, "algo.kl_targets=[0.1]"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "give one per follower" in err


def test_setpoint_figure(tmp_path):
    history = {
        "train/critic_only": [(1, 1.0), (2, 0.0), (3, 0.0)],
        "cpo/kl/follower_1": [(1, 0.5), (2, 0.3), (3, 0.2)],
        "cpo/kl_target/follower_1": [(1, 0.2), (2, 0.2), (3, 0.2)],
        "cpo/kl_coef/follower_1": [(1, 0.1), (2, 0.2), (3, 0.3)],
        "cpo/adversarial_coef/follower_1": [(1, 0.002), (2, 0.0015), (3, 0.001)],
    }
    path = kl_setpoint(tmp_path / "kl_setpoint.png", history, title="t")
    assert path is not None and path.stat().st_size > 10_000
    assert kl_setpoint(tmp_path / "none.png", {"train/loss": [(1, 0.0)]}) is None
    assert not (tmp_path / "none.png").exists()


# ---------------------------------------------------------------- the set point holds, small scale

SMALL_PRETRAIN = [
    "num_envs=128",
    "iterations=8",
    "progress=false",
    "plots=false",
    "dataset.enabled=false",
    "checkpoint_every=0",
]
SMALL_FINETUNE = [
    "num_envs=256",
    "num_steps=16",
    "iterations=40",
    "init.episodes=8",
    "init.critic_warmup=3",
    "eval.every=0",
    "eval.final_episodes=8",
    "checkpoint_every=0",
    "progress=false",
    "plots=false",
    "tensorboard=false",
]
#: Iterations not scored: the critic warm-up (3) and the controller's first approach (7).
SETTLE = 10


@pytest.fixture(scope="module")
def maze_pretraining(tmp_path_factory: pytest.TempPathFactory):
    """A small K-Myriad pretraining on the default maze (8 iterations of 128 envs)."""
    folder = tmp_path_factory.mktemp("maze") / "pretrain"
    pretrain(SMALL_PRETRAIN, run_dir=folder, quiet=True)
    return folder


#: The loss form the set point's bounds below were measured with (each term a mean over its own
#: rows, separately normalised advantages, no critic fit on the off-policy rows): the test checks
#: the controller, not the loss form.
SETPOINT_CALIBRATION = [
    "algo.weighting=terms",
    "algo.advantages=separate",
    "algo.off_policy_value=false",
]


def _maze_follower_kl(pretraining, folder, target: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Followers' KL ``[I, F]`` per iteration: the controller's and the diagnostics' sample."""
    summary = finetune(
        "cpo",
        [*SMALL_FINETUNE, *SETPOINT_CALIBRATION, f"algo.kl_target={target}"],
        init=pretraining,
        run_dir=folder,
        quiet=True,
    )
    history = load_checkpoint(summary["checkpoint"])["logger"]["history"]

    def series(key: str) -> torch.Tensor:
        return torch.tensor([[v for _, v in history[key.format(i)]] for i in (1, 2, 3)]).t()

    return series("cpo/kl/follower_{}"), series("kl_to_leader/on_own_states/member_{}")


def test_followers_are_held_near_their_target_on_the_maze(maze_pretraining, tmp_path):
    """Targets 0.1 and 0.5 at small scale. At this scale (64 envs per member, members 8
    pretraining iterations apart) the KL swings more than on the full maze run, where
    benchmarks/cpo_setpoint.py measures the 80%-per-follower criterion (docs/finetune.md); here
    the followers must sit in the band most of the time and the two targets must give two
    clearly different distances. Over seeds 0-5 (twelve runs, before and after a change of the
    minibatch shuffle's random stream) the lowest mean in-band fraction was 0.62, the lowest of
    one follower 0.40, and the median KL of a follower ranged from 0.95 to 2.27 times the target
    0.1 and 0.84 to 1.5 times the target 0.5; the bounds are 0.6, 1/3 and [0.5, 2.5] times the
    target."""
    medians = {}
    for target in (0.1, 0.5):
        kl, sampled = _maze_follower_kl(maze_pretraining, tmp_path / f"kl{target}", target)
        assert kl.shape == (40, 3)
        scored = kl[SETTLE:]
        inside = fraction_in_band(scored, torch.full((3,), target))
        assert float(inside.mean()) >= 0.6 and (inside >= 1 / 3).all(), (target, inside.tolist())
        per_follower = scored.median(dim=0).values
        assert bool(((per_follower >= 0.5 * target) & (per_follower <= 2.5 * target)).all()), (
            target,
            per_follower.tolist(),
        )
        medians[target] = float(scored.median())
        # The diagnostics' sample of the same states tells the same story.
        torch.testing.assert_close(sampled, kl, rtol=0.5, atol=0.02)
    assert medians[0.5] >= 2.5 * medians[0.1], medians


def test_closing_report_lists_the_followers_kl_and_targets():
    from myriad.finetune.api import coupling_rows

    scalars = {f"cpo/kl/follower_{i}": 0.1 * i for i in (1, 2, 10)}
    scalars |= {f"cpo/kl_target/follower_{i}": 0.3 for i in (10, 1, 2)}
    scalars["cpo/kl_in_band"] = 1.0
    assert coupling_rows({"scalars": scalars}) == [
        ("followers' KL to the leader", "0.1, 0.2, 1 nats (targets 0.3, 0.3, 0.3)")
    ]
    fixed = {k: v for k, v in scalars.items() if "kl_target" not in k}
    assert coupling_rows({"scalars": fixed})[0][1] == "0.1, 0.2, 1 nats"
    assert coupling_rows({"scalars": {"train/return": 1.0}}) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_in_band_takes_followers_kl_from_the_host() -> None:
    """CPO logs the in-band fraction from KLs copied to the host while the controller's targets
    stay on the device (the first CPO update on a GPU failed on this)."""
    controller = KLSetpointController([0.1, 1.0], device="cuda")
    in_band = controller.in_band(torch.tensor([0.1, 5.0]))
    assert in_band.device.type == "cuda" and in_band.tolist() == [True, False]
