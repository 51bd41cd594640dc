"""Sweeps through the CLI: ``myriad pretrain|finetune -m``, ``--cfg job``, ``sweep summarize``."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from scipy import stats

from myriad.cli import main
from myriad.tools.sweep import expand

TINY = [
    "env=empty",
    "iterations=2",
    "num_envs=16",
    "num_steps=8",
    "population.size=2",
    "population.actor_hidden=[16]",
    "population.critic_hidden=[16]",
    "plots=false",
    "progress=false",
    "env.options.max_episode_steps=10",
]


def test_expand_is_the_cartesian_product_in_order():
    combos = expand(["seed=0,1", "objective.beta=0.5,1", "env=maze", "+x=range(0,2)"])
    assert len(combos) == 8
    assert combos[0] == ["seed=0", "objective.beta=0.5", "env=maze", "+x=0"]
    assert combos[-1] == ["seed=1", "objective.beta=1", "env=maze", "+x=1"]
    assert expand(["env=maze"]) == [["env=maze"]]


def test_pretrain_sweep_and_its_summary(tmp_path, capsys):
    sweep = tmp_path / "sweep"
    argv = ["pretrain", "-m", "seed=0,1", "objective.beta=0.5,1", *TINY, "--run-dir", str(sweep)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert out.count("myriad: sweep run ") == 4
    state = json.loads((sweep / "sweep.json").read_text())
    assert [r["state"] for r in state["runs"]] == ["done"] * 4
    assert state["swept"] == ["seed", "objective.beta"]
    for run in state["runs"]:
        config = yaml.safe_load((sweep / run["name"] / "config.yaml").read_text())
        seed, beta = (o.split("=")[1] for o in run["overrides"][:2])
        assert config["seed"] == int(seed) and config["objective"]["beta"] == float(beta)

    assert main(["sweep", "summarize", str(sweep)]) == 0
    printed = capsys.readouterr().out
    assert "| objective.beta=0.5 | 2 |" in printed
    result = json.loads((sweep / "summary.json").read_text())
    assert (sweep / "summary.md").read_text() in printed
    assert len(result["runs"]) == 4 and not result["unfinished"]
    label = "collective entropy"
    for setting in result["settings"]:
        # Mean and interval against the runs' own summary.json files and SciPy's t interval.
        values = [
            json.loads((sweep / r["name"] / "summary.json").read_text())["eval_entropy_collective"]
            for r in state["runs"]
            if setting["setting"] in r["overrides"]
        ]
        assert len(values) == setting["runs"] == 2
        stat = setting[label]
        ci = stats.ttest_1samp(values, 0.0).confidence_interval(0.95)
        assert stat["mean"] == pytest.approx(np.mean(values))
        assert (stat["low"], stat["high"]) == pytest.approx((ci.low, ci.high))


def test_finetune_multirun_and_refused_folder(tmp_path, capsys):
    sweep = tmp_path / "ft"
    argv = ["finetune", "--multirun", "--algo", "ppo", "seed=3,4", *TINY]
    argv = [a for a in argv if a != "population.size=2"] + ["population.size=1"]
    argv += ["eval.every=0", "eval.final_episodes=2", "--run-dir", str(sweep)]
    assert main(argv) == 0
    state = json.loads((sweep / "sweep.json").read_text())
    assert state["command"] == "finetune" and state["algo"] == "ppo"
    assert [r["name"] for r in state["runs"]] == ["000_seed=3", "001_seed=4"]
    assert main(["sweep", "summarize", str(sweep)]) == 0
    assert "leader success" in capsys.readouterr().out
    # The folder holds a sweep now: refused without --overwrite.
    assert main(argv) == 2
    assert "--overwrite" in capsys.readouterr().err


def test_parallel_runs_in_processes(tmp_path, capsys):
    sweep = tmp_path / "par"
    argv = ["pretrain", "-m", "--jobs", "2", "seed=0,1", *TINY, "--run-dir", str(sweep)]
    assert main(argv) == 0
    state = json.loads((sweep / "sweep.json").read_text())
    assert [r["state"] for r in state["runs"]] == ["done", "done"]
    for seed, run in enumerate(state["runs"]):
        config = yaml.safe_load((sweep / run["name"] / "config.yaml").read_text())
        assert config["seed"] == seed
        log = (sweep / f"{run['name']}.log").read_text()
        assert "K-Myriad pretraining finished" in log
    assert capsys.readouterr().out.count("done") >= 2


def test_cfg_job_prints_the_resolved_config(capsys):
    assert main(["pretrain", "--cfg", "job", "env=empty", "objective.beta=0.25"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    assert config["objective"]["beta"] == 0.25 and config["env"]["name"] == "nav-empty"
    assert main(["finetune", "--algo", "sapg", "--cfg", "job", "-m", "seed=1,2"]) == 0
    out = capsys.readouterr().out
    assert out.count("# seed=") == 2 and "name: sapg" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["pretrain", "seed=0,1"], "--multirun"),
        (["pretrain", "-m", "seed=0,1", "objective.beta=x,1"], "objective.beta"),
        (["pretrain", "-m", "env=glob(*)"], "glob sweeps are not supported"),
        (["pretrain", "-m", "--resume", "runs/x"], "--resume continues one run"),
        (["sweep", "summarize", "nowhere"], "no sweep.json in nowhere"),
        (["pretrain", "--jobs", "2", "seed=1"], "add -m"),
        (["pretrain", "-m", "--jobs", "0", "seed=1,2"], "--jobs must be >= 1"),
    ],
)
def test_bad_input_is_one_line(tmp_path, monkeypatch, capsys, argv, message):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "runs").exists()  # nothing ran


def test_help_lists_config_groups(capsys):
    with pytest.raises(SystemExit):
        main(["pretrain", "--help"])
    out = capsys.readouterr().out
    assert "objective: knn_reward, mepol" in out and "--cfg job" in out
    assert "algo:" not in out  # a finetuning group


def test_resume_finishes_an_interrupted_sweep(tmp_path, capsys):
    """A sweep stopped in its second run (its state ``running``, a checkpoint of iteration 1,
    no summary) and before its third: ``sweep resume`` continues the second from its checkpoint,
    starts the third, and leaves the finished first run alone."""
    sweep = tmp_path / "sweep"
    argv = ["pretrain", "-m", "seed=0,1,2", *TINY, "checkpoint_every=1", "keep_checkpoints=null"]
    assert main([*argv, "--run-dir", str(sweep)]) == 0
    state = json.loads((sweep / "sweep.json").read_text())
    first, second, third = (sweep / r["name"] for r in state["runs"])
    kept = (first / "summary.json").read_bytes()
    # The interruption, as a killed process leaves it.
    (second / "summary.json").unlink()
    (second / "checkpoints" / "iter_000002.pt").unlink()
    import shutil

    shutil.rmtree(third)
    checkpoint = (second / "checkpoints" / "iter_000001.pt").stat()
    state["runs"][1]["state"], state["runs"][2]["state"] = "running", "pending"
    (sweep / "sweep.json").write_text(json.dumps(state))
    capsys.readouterr()

    assert main(["sweep", "resume", str(sweep)]) == 0
    out = capsys.readouterr().out
    assert "1 of 3 runs done" in out and "sweep run 1/3" not in out
    state = json.loads((sweep / "sweep.json").read_text())
    assert [r["state"] for r in state["runs"]] == ["done"] * 3
    assert (first / "summary.json").read_bytes() == kept
    # Continued from its checkpoint, which is still the same file (not a fresh start).
    again = (second / "checkpoints" / "iter_000001.pt").stat()
    assert (again.st_ino, again.st_mtime_ns) == (checkpoint.st_ino, checkpoint.st_mtime_ns)
    for run in (second, third):
        summary = json.loads((run / "summary.json").read_text())
        assert summary["iterations"] == 2
    assert yaml.safe_load((third / "config.yaml").read_text())["seed"] == 2
