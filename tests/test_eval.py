"""``myriad eval``: per-member return, success and length with 95% intervals, through the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from scipy import stats

from myriad.cli import main
from myriad.rl.saved_population import load_population
from myriad.tools.evaluate import mean_interval, wilson_interval
from myriad.viz.rollout import record_episodes


@pytest.mark.parametrize("n", [2, 5, 40])
def test_mean_interval_matches_scipy_t_interval(n):
    values = np.random.default_rng(n).normal(3.0, 2.0, size=n)
    got = mean_interval(values.tolist())
    ci = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
    assert got["mean"] == pytest.approx(values.mean(), rel=1e-12)
    assert got["low"] == pytest.approx(ci.low, rel=1e-9)
    assert got["high"] == pytest.approx(ci.high, rel=1e-9)
    assert mean_interval([1.0])["low"] is None


@pytest.mark.parametrize(("k", "n"), [(0, 8), (3, 8), (8, 8), (17, 128)])
def test_wilson_interval_matches_scipy(k, n):
    got = wilson_interval(k, n)
    ci = stats.binomtest(k, n).proportion_ci(0.95, method="wilson")
    assert got["mean"] == k / n
    assert got["low"] == pytest.approx(ci.low, abs=1e-12)
    assert got["high"] == pytest.approx(ci.high, abs=1e-12)


def test_mean_interval_covers_the_mean_95_percent_of_the_time():
    """The interval's coverage by simulation: 2,000 samples of 10 from N(1, 1)."""
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(2000):
        ci = mean_interval(rng.normal(1.0, 1.0, size=10).tolist())
        hits += ci["low"] <= 1.0 <= ci["high"]
    assert 0.93 <= hits / 2000 <= 0.97


def test_eval_pretraining_run_on_a_task(tiny_pretrain, tmp_path, capsys):
    out = tmp_path / "eval.json"
    argv = ["eval", str(tiny_pretrain.path), "--episodes", "3", "--members", "0,2"]
    code = main([*argv, "--seed", "5", "--out", str(out), "env.options.task=dense"])
    assert code == 0
    printed = capsys.readouterr().out
    assert "return (95% CI)" in printed and str(out) in printed
    result = json.loads(out.read_text())
    assert result["kind"] == "pretrain" and result["deterministic"] is True
    assert result["env"]["options"]["task"] == "dense"
    assert [r["member"] for r in result["members"]] == [0, 2]
    # The returns against an independent rollout (myriad.viz.rollout sums the rewards itself)
    # of the same members, episodes, seed and env.
    saved = load_population(tiny_pretrain.path)
    from myriad.envs import make_from_config

    env = make_from_config(result["env"], 6)
    rec = record_episodes(
        saved.model, env, [0, 2], 3, lambda e: e.current_features(), deterministic=True, seed=5
    )
    for k, row in enumerate(result["members"]):
        expected = rec.returns[k * 3 : (k + 1) * 3]
        assert row["return"]["mean"] == pytest.approx(float(expected.mean()), abs=1e-4)
        assert row["return"]["n"] == 3 and row["length"]["n"] == 3
        lengths = rec.steps[k * 3 : (k + 1) * 3]
        assert row["length"]["mean"] == pytest.approx(float(lengths.mean()))
        assert row["success"]["n"] == 3


def test_eval_finetuning_run_leader_and_default_output(tiny_cpo, capsys):
    assert main(["eval", str(tiny_cpo), "--members", "leader", "--episodes", "2"]) == 0
    result = json.loads((tiny_cpo / "eval.json").read_text())
    assert result["kind"] == "finetune"
    (row,) = result["members"]
    assert row["member"] == 0 and row["leader"] is True
    assert 0.0 <= row["success"]["low"] <= row["success"]["mean"] <= row["success"]["high"] <= 1
    assert "(leader)" in capsys.readouterr().out
    # The file exists now: refused without --overwrite, replaced with it.
    assert main(["eval", str(tiny_cpo), "--episodes", "2"]) == 2
    assert "--overwrite" in capsys.readouterr().err
    assert main(["eval", str(tiny_cpo), "--episodes", "2", "--sample", "--overwrite"]) == 0
    result = json.loads((tiny_cpo / "eval.json").read_text())
    assert result["deterministic"] is False and len(result["members"]) == 4


def test_pretraining_run_without_task_has_no_success(tiny_pretrain, tmp_path, capsys):
    out = tmp_path / "e.json"
    assert main(["eval", str(tiny_pretrain.path), "--episodes", "1", "--out", str(out)]) == 0
    assert "no task reward" in capsys.readouterr().out
    result = json.loads(out.read_text())
    assert result["task_reward"] is False
    assert all(r["success"] is None for r in result["members"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--members", "9"], "out of range: the population has 4 members"),
        (["--members", "x"], "--members takes member indices"),
        (["--members", "leader"], "pretraining checkpoint: it has no leader"),
        (["--episodes", "0"], "--episodes must be >= 1"),
        (["--episodes", "many"], "--episodes takes an integer"),
        (["foo"], "eval takes env overrides"),
        (["env.nme=x"], "has no env.nme"),
        (["--deterministic", "--sample"], "not allowed with argument"),
    ],
)
def test_bad_input_is_one_line(tiny_pretrain, tmp_path, capsys, args, message):
    try:
        code = main(["eval", str(tiny_pretrain.path), "--out", str(tmp_path / "e.json"), *args])
    except SystemExit as exc:  # argparse's own errors
        code = exc.code
    err = capsys.readouterr().err
    assert code == 2
    assert message in err
    assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "e.json").exists()


def test_missing_run(tmp_path, capsys):
    assert main(["eval", str(tmp_path / "none")]) == 2
    assert "no checkpoint at" in capsys.readouterr().err
