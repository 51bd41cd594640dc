"""benchmarks/rsl_rl_compare.py: the adapter that drives rsl_rl on a myriad env counts rewards
and episodes as myriad's episode tracker does, and both learners run through the interleaving."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch

from myriad.rl.collector import EpisodeTracker

pytest.importorskip("rsl_rl", reason="rsl-rl-lib not installed (extra: bench)")

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "rsl_rl_compare.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("rsl_rl_compare", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_adapter_reports_what_myriads_tracker_measures_on_a_twin_env(bench) -> None:
    env, twin = bench.nav_env(32), bench.nav_env(32)
    obs = env.reset(seed=3)
    twin.reset(seed=3)
    bench.desync(env)
    bench.desync(twin)
    adapter = bench.RslRlNavEnv(env, obs)
    tracker = EpisodeTracker(1, "cpu", per_member=False)
    member = torch.zeros(32, dtype=torch.long)
    gen = torch.Generator().manual_seed(0)
    reward_sum, steps = 0.0, 0
    for _ in range(120):
        actions = torch.rand(32, 2, generator=gen) * 2 - 1
        td, reward, dones, extras = adapter.step(actions)
        _, twin_reward, _, truncated, info = twin.step(actions)
        assert torch.equal(td["policy"], adapter.obs) and torch.equal(reward, twin_reward)
        assert torch.equal(dones.bool(), info["done"])
        assert torch.equal(extras["time_outs"].bool(), truncated)
        tracker.record(member, info["done"], info["episode_return"], info["episode_length"])
        reward_sum += float(twin_reward.double().sum())
        steps += 32
    mean_reward, mean_return = adapter.summary()
    expected = tracker.summary()
    assert expected["episode/count"] > 0
    assert mean_return == pytest.approx(expected["episode/return"], rel=1e-9)
    assert mean_reward == pytest.approx(reward_sum / steps, rel=1e-9)
    assert math.isnan(adapter.summary()[1])  # counters restart after each summary


def test_trend_compares_the_first_and_last_finite_values(bench) -> None:
    out = bench.trend([1.0, math.nan, 2.0, 3.0, 5.0], window=2)
    assert out == {"first": 1.5, "last": 4.0, "change": 2.5}


def test_both_learners_run_interleaved_and_report_the_ratio(bench) -> None:
    result = bench.compare_rsl_rl(num_envs=64, threads=1, repeats=2, iterations=1)
    for name in ("myriad", "rsl_rl"):
        record = result[name]
        assert len(record["steps_per_s"]) == 2 and record["median_steps_per_s"] > 0
        assert len(record["mean_reward"]) == 3  # warm-up + 2 blocks of 1 iteration
    ratios = [
        a / b for a, b in zip(result["myriad"]["steps_per_s"], result["rsl_rl"]["steps_per_s"])
    ]
    assert result["block_ratios"] == pytest.approx(ratios)
    assert result["ratio"] == pytest.approx(
        result["myriad"]["median_steps_per_s"] / result["rsl_rl"]["median_steps_per_s"]
    )
