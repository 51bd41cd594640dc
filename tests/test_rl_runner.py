"""The runner base: run directory, exact resume, config checks, atomic checkpoints."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
import yaml

from myriad.envs import make
from myriad.nn import PopulationActorCritic
from myriad.rl import PPO, ConfigMismatchError, EpisodeTracker, OnPolicyRunner, PPOConfig
from myriad.rl.runner import _ProgressBar
from myriad.utils.checkpoint import (
    atomic_write_bytes,
    config_diff,
    latest_checkpoint,
    load_checkpoint,
)
from myriad.utils.migrations import migrate_checkpoint
from myriad.utils.seeding import seed_everything

CONFIG = {
    "seed": 0,
    "num_iterations": 4,
    "env": {"name": "nav-empty", "num_envs": 16, "task": "dense"},
    "population": {"num_members": 2, "parameterization": "shared_trunk"},
    "algo": {"clip": 0.2, "epochs": 2, "minibatches": 2},
}


def build(run_dir, config=CONFIG, init_seed=0, **options) -> OnPolicyRunner:
    seed_everything(init_seed)
    env = make("nav-empty", 16, "cpu", task="dense", max_episode_steps=12)
    model = PopulationActorCritic(
        env.obs_dim, env.action_dim, 2, actor_hidden=(16,), critic_hidden=(16,)
    )
    ppo = PPO(
        model,
        PPOConfig(epochs=2, minibatches=2, lr=3e-3, entropy_coef=[0.0, 0.01]),
        generator=torch.Generator().manual_seed(init_seed + 1),
    )
    options.setdefault("progress", False)
    options.setdefault("tensorboard", False)
    options.setdefault("plots", False)
    return OnPolicyRunner(env, model, ppo, config, run_dir, num_steps=8, seed=init_seed, **options)


def test_resume_is_bit_identical(tmp_path):
    straight = build(tmp_path / "straight")
    straight.learn(4)

    first = build(tmp_path / "split", checkpoint_every=2)
    first.learn(2)
    first.close()
    # Different initial weights and seeds: everything must come from the checkpoint.
    second = build(tmp_path / "split", init_seed=123)
    source = second.resume(tmp_path / "split")
    assert source.name == "iter_000002.pt"
    assert second.iteration_count == 2 and second.env_steps == 2 * 8 * 16
    second.learn(4)

    a, b = straight.model.state_dict(), second.model.state_dict()
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    opt_a = straight.algorithm.optimizer.state_dict()["state"]
    opt_b = second.algorithm.optimizer.state_dict()["state"]
    for i in opt_a:
        for k in opt_a[i]:
            assert torch.equal(opt_a[i][k], opt_b[i][k])
    assert straight.algorithm.lr == second.algorithm.lr
    assert torch.equal(straight.collector.obs, second.collector.obs)
    hist_a, hist_b = straight.logger.history, second.logger.history
    for key in hist_a:
        if not key.startswith("perf/iteration_time") and not key.startswith("perf/steps_per"):
            assert hist_a[key] == hist_b[key], key


def test_resume_with_a_different_config_lists_the_keys(tmp_path):
    runner = build(tmp_path / "run")
    runner.learn(1)
    changed = {
        **CONFIG,
        "num_iterations": 100,  # allowed: extending a run
        "algo": {**CONFIG["algo"], "clip": 0.3},
        "population": {**CONFIG["population"], "parameterization": "independent"},
    }
    other = build(tmp_path / "run", config=changed)
    with pytest.raises(ConfigMismatchError) as err:
        other.resume(tmp_path / "run")
    text = str(err.value)
    assert "2 key(s)" in text
    assert "algo.clip: checkpoint=0.2, now=0.3" in text
    assert "population.parameterization: checkpoint='shared_trunk', now='independent'" in text
    assert "num_iterations:" not in text.split("Keys allowed")[0]
    assert other.iteration_count == 0
    assert yaml.safe_load((tmp_path / "run" / "config.yaml").read_text()) == CONFIG
    extended = build(tmp_path / "run", config={**CONFIG, "num_iterations": 100})
    extended.resume(tmp_path / "run")
    assert extended.iteration_count == 1
    assert config_diff({"a": {"b": 1}}, {"a": {"c": 1}}) == [
        ("a.b", 1, "<absent>"),
        ("a.c", "<absent>", 1),
    ]


def test_run_directory_contents(tmp_path):
    run_dir = tmp_path / "run"
    runner = build(run_dir, tensorboard=True, plots=True, checkpoint_every=1, keep_checkpoints=2)
    scalars = runner.learn(3)
    runner.close()
    assert yaml.safe_load((run_dir / "config.yaml").read_text()) == CONFIG
    ckpts = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert ckpts == ["iter_000002.pt", "iter_000003.pt"]
    assert latest_checkpoint(run_dir / "checkpoints").name == "iter_000003.pt"
    payload = load_checkpoint(run_dir / "checkpoints" / "iter_000003.pt")
    assert payload["iteration"] == 3 and payload["config"] == CONFIG
    assert {"torch", "numpy", "python", "myriad"} <= set(payload["versions"])
    assert {"model", "algorithm", "collector"} <= set(payload["state"])
    assert any(p.name.startswith("events.out.tfevents") for p in run_dir.iterdir())
    assert list((run_dir / "plots").glob("*.png"))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["iterations"] == 3 and summary["env_steps"] == 3 * 8 * 16
    assert summary["scalars"]["train/lr"] == pytest.approx(scalars["train/lr"])
    assert "episode/return" in summary["scalars"]
    assert not [p for p in run_dir.rglob("*.tmp")]


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    target = tmp_path / "ckpt.pt"
    atomic_write_bytes(target, b"old")

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_bytes(target, b"new")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt.pt"]


def test_resume_errors_and_progress_bar_off_the_terminal(tmp_path):
    runner = build(tmp_path / "run", progress=True)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        runner.resume(tmp_path / "run")
    # Under pytest stdout is not a terminal: the bar stays inert even when requested.
    bar = _ProgressBar(True, 0, 10)
    assert bar._progress is None
    bar.advance(1.0)
    bar.close()


def test_run_to_completion_trains_finishes_and_closes(tmp_path):
    from myriad.rl.runner import run_to_completion

    runner = build(tmp_path / "run")
    closed = []
    runner.close = lambda: closed.append(True)  # type: ignore[method-assign]
    summary = run_to_completion(runner, 2)
    assert summary["iterations"] == 2 and closed == [True]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["iterations"] == 2


def test_env_state_of_earlier_checkpoints_restores_episode_statistics():
    from myriad.rl.collector import env_state_dict, load_env_state_dict

    env = make("nav-empty", 4, "cpu", task="dense", max_episode_steps=12)
    env.reset(3)
    for _ in range(5):
        env.step(torch.rand(4, env.action_dim) * 2 - 1)
    state = env_state_dict(env)
    # The layout written before EpisodeStats: the statistics were env tensor attributes.
    legacy = {k: v for k, v in state.items() if k != "episode"}
    legacy["tensors"] = {
        **state["tensors"],
        "episode_return": state["episode"]["returns"],
        "episode_length": state["episode"]["lengths"],
    }
    # Format 1 checkpoints get the current layout when read (myriad.utils.migrations).
    old = {
        "format": 1,
        "state": {
            "collector": {
                "env": legacy,
                "episodes": {"sums": torch.zeros(4, 1), "has_success": False},
            }
        },
    }
    migrated = migrate_checkpoint(old)["state"]["collector"]["env"]
    assert migrated.keys() == state.keys()
    for saved in (state, migrated):
        fresh = make("nav-empty", 4, "cpu", task="dense", max_episode_steps=12)
        fresh.reset(0)
        load_env_state_dict(fresh, saved)
        assert torch.equal(fresh.episode.lengths, env.episode.lengths)
        assert torch.equal(fresh.episode.returns, env.episode.returns)
        assert int(fresh.episode.lengths[0]) == 5
        assert not hasattr(fresh, "episode_length")


def test_print_report_aligns_rows_and_keeps_paths_on_one_line(capsys):
    from myriad.utils.logging import print_report

    long_path = "runs/pretrain/" + "x" * 150 + "/checkpoints/iter_000150.pt"
    print_report(
        "done", [("env steps", "1,024"), ("wall time", "2.0 s")], [("checkpoint", long_path)]
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "done"
    assert lines[1] == "  env steps  1,024" and lines[2] == "  wall time  2.0 s"
    assert lines[3] == f"  checkpoint  {long_path}"


def test_episode_tracker_sums_per_member_and_loads_earlier_checkpoints():
    tracker = EpisodeTracker(2, "cpu")
    member = torch.tensor([0, 0, 1, 1])
    done = torch.tensor([True, False, True, True])
    success = torch.tensor([True, True, False, True])  # env 1 has not finished: not counted
    tracker.record(
        member, done, torch.tensor([1.0, 5.0, 2.0, 4.0]), torch.tensor([3, 9, 4, 6]), success
    )
    # An env that reports no success flag: its episodes count, their successes do not.
    done = torch.tensor([False, True, False, False])
    tracker.record(member, done, torch.tensor([0.0, 7.0, 0.0, 0.0]), torch.tensor([0, 2, 0, 0]))
    sums = tracker.read(reset=False)
    np.testing.assert_array_equal(sums.returns, [8.0, 6.0])
    np.testing.assert_array_equal(sums.lengths, [5.0, 10.0])
    np.testing.assert_array_equal(sums.successes, [1.0, 1.0])
    np.testing.assert_array_equal(sums.counts, [2.0, 2.0])
    assert tracker.has_success
    assert tracker.summary() == {
        "episode/count": 4.0,
        "episode/return": 3.5,
        "episode/length": 3.75,
        "episode/return/member_0": 4.0,
        "episode/return/member_1": 3.0,
    }
    assert tracker.summary() == {"episode/count": 0.0}  # read and reset
    # A format 1 checkpoint's tracker: [return, length, count], no success row.
    env = {"tensors": {}, "episode": {}}
    sums = torch.tensor([[8.0, 6.0], [5.0, 10.0], [2.0, 2.0]])
    old = {"format": 1, "state": {"collector": {"env": env, "episodes": {"sums": sums}}}}
    earlier = EpisodeTracker(2, "cpu")
    earlier.load_state_dict(migrate_checkpoint(old)["state"]["collector"]["episodes"])
    read = earlier.read()
    np.testing.assert_array_equal(read.successes, [0.0, 0.0])
    np.testing.assert_array_equal(read.counts, [2.0, 2.0])
    assert not earlier.has_success
