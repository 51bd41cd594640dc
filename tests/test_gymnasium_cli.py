"""Any Gymnasium env, and envs of the user's own package, from the command line (env=gymnasium,
env=custom, env.module=...): time limits from the env's spec, declared entropy features,
coverage only where the features are bounded, one-line errors."""

import json
import textwrap
from pathlib import Path

import pytest

from myriad.cli import main
from myriad.utils.optional import available

TINY = ["num_envs=4", "num_steps=8", "iterations=2", "population.size=2", "progress=false"]
TINY += ["tensorboard=false", "eval.episodes=1"]


def _pretrain(tmp_path: Path, name: str, *overrides: str) -> Path:
    run = tmp_path / name
    assert main(["pretrain", *TINY, *overrides, "--run-dir", str(run)]) == 0
    return run


@pytest.fixture(scope="module")
def pendulum(tmp_path_factory) -> Path:
    """A tiny pretraining run on Pendulum-v1 with the features cos, sin of the angle."""
    root = tmp_path_factory.mktemp("gym")
    return _pretrain(root, "pendulum", "env=gymnasium", "env.id=Pendulum-v1", "env.features=[0,1]")


def test_pretrain_any_gymnasium_env_uses_its_spec(pendulum, capsys):
    """The time limit is Pendulum's 200 (not the maze's 400): evaluation episodes last 200
    steps; the two declared features are bounded, so coverage is measured and reported."""
    summary = json.loads((pendulum / "summary.json").read_text())
    assert 0 < summary["eval_coverage_union"] <= 1
    assert "coverage/cumulative_union" in summary
    assert main(["eval", str(pendulum), "--episodes", "1"]) == 0
    result = json.loads((pendulum / "eval.json").read_text())
    lengths = [m["length"]["mean"] for m in result["members"]]
    assert lengths == [200.0, 200.0]
    from myriad.utils.config import load_run_config

    env = load_run_config(pendulum)["env"]
    assert env["options"]["env_id"] == "Pendulum-v1" and env["options"]["feature_indices"] == [0, 1]


def test_finetune_on_a_gymnasium_env(pendulum, tmp_path, capsys):
    run = tmp_path / "fine"
    args = ["finetune", "--algo", "cpo", "--init", str(pendulum), "env=gymnasium", "task=native"]
    args += ["env.features=[0,1]", "num_envs=4", "num_steps=8", "iterations=2"]
    args += ["progress=false", "tensorboard=false", "plots=false", "--run-dir", str(run)]
    assert main(args) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] == 2 * 4 * 8
    # Pendulum reports no success: no success rates, and its routes are behaviours.
    assert "eval/leader_success" not in summary["final_eval"]
    report = capsys.readouterr().out
    assert "success" not in report
    assert "distinct behaviours (population)" in report and "of the episodes" in report


@pytest.mark.skipif(not available("mujoco"), reason="mujoco not installed")
def test_unbounded_features_report_no_coverage(tmp_path, capsys):
    """Hopper's observation box is unbounded: the run trains on all 11 entries, reports no
    coverage (rather than 0%), and still writes its plots (scaled by the data's range)."""
    run = _pretrain(tmp_path, "hopper", "env=gymnasium", "env.id=Hopper-v5")
    out = capsys.readouterr().out
    assert "coverage" not in out and "collective entropy" in out
    summary = json.loads((run / "summary.json").read_text())
    assert "eval_coverage_union" not in summary and "coverage/cumulative_union" not in summary
    assert (run / "plots" / "behaviour_features.png").is_file()
    assert (run / "plots" / "entropy_coverage.png").is_file()
    from myriad.envs import make

    with make("gymnasium", 1, env_id="Hopper-v5") as env:
        assert env.max_episode_steps == 1000 and env.features.dim == 11
        assert not env.features.cells


def test_custom_env_module_from_the_command_line(tmp_path, monkeypatch, capsys):
    """env.module imports the user's module first: it registers one env with myriad's
    registry (env=custom) and one with Gymnasium's (env=gymnasium); both train, and later
    commands on the run (eval, envs check) find them again."""
    package = tmp_path / "src" / "my_envs_pkg"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "envs.py").write_text(
        textwrap.dedent(
            """
            import gymnasium as gym
            from myriad.envs import register
            from myriad.envs.nav import PointNavEnv

            register("my-corridor", PointNavEnv, layout="#######\\n#S...G#\\n#######",
                     max_episode_steps=12)
            gym.register("MyPendulum-v0", max_episode_steps=30,
                         entry_point="gymnasium.envs.classic_control:PendulumEnv")
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    mine = _pretrain(
        tmp_path, "mine", "env=custom", "env.name=my-corridor", "env.module=my_envs_pkg.envs"
    )
    assert main(["eval", str(mine), "--episodes", "1"]) == 0
    lengths = [m["length"]["mean"] for m in json.loads((mine / "eval.json").read_text())["members"]]
    assert lengths == [12.0, 12.0]
    theirs = _pretrain(
        tmp_path, "theirs", "env=gymnasium", "env.id=MyPendulum-v0", "env.module=my_envs_pkg.envs"
    )
    assert main(["eval", str(theirs), "--episodes", "1"]) == 0
    lengths = [
        m["length"]["mean"] for m in json.loads((theirs / "eval.json").read_text())["members"]
    ]
    assert lengths == [30.0, 30.0]
    capsys.readouterr()
    assert main(["envs", "check", "my-corridor", "--module", "my_envs_pkg.envs"]) == 0
    assert "my-corridor: ok" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["env.id=Pendulm-v1"], "unknown Gymnasium env id 'Pendulm-v1'"),
        (["env.features=[0,7]"], "indices [7] are not observation indices"),
        (["env.module=no_such_package.envs"], "env.module='no_such_package.envs' does not import"),
        (["env.options.coverage_cells=[4]"], "coverage_cells of 'Pendulum-v1' must be"),
    ],
)
def test_bad_env_settings_are_one_line_errors(tmp_path, capsys, overrides, expected):
    run = tmp_path / "bad"
    code = main(["pretrain", "env=gymnasium", *overrides, *TINY, "--run-dir", str(run)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and expected in err, err
    assert not run.exists()  # a refused start leaves no folder


def test_custom_env_needs_its_name_and_module(tmp_path, capsys):
    run = tmp_path / "bad"
    assert main(["pretrain", "env=custom", *TINY, "--run-dir", str(run)]) == 2
    err = capsys.readouterr().err
    assert "env=custom needs env.name=NAME" in err and err.count("\n") == 1


@pytest.mark.skipif(not available("minari"), reason="minari not installed (offline extra)")
def test_minari_export_recovers_the_gymnasium_env(pendulum, tmp_path, monkeypatch):
    """The export's env spec is Pendulum-v1's own, seen as myriad sees it: actions in [-1, 1]
    rescaled onto its box, float32 observations; the same seed and action give the same step."""
    import minari
    import numpy as np
    import torch

    from myriad.envs import make

    root = tmp_path / "minari"
    args = ["export", str(pendulum), "--format", "minari", "--out", str(root)]
    assert main([*args, "--dataset-id", "test/pendulum-v0"]) == 0
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    ds = minari.load_dataset("test/pendulum-v0")
    env = ds.recover_environment()
    assert env.spec.id == "Pendulum-v1" and env.spec.max_episode_steps == 200
    assert env.action_space == ds.action_space and env.observation_space == ds.observation_space
    reference = make("gymnasium", 1, env_id="Pendulum-v1")
    obs, _ = env.reset(seed=4)
    np.testing.assert_allclose(obs, reference.reset(seed=4)[0].numpy())
    action = np.array([0.5], np.float32)
    stepped, reward, *_ = env.step(action)
    ref_obs, ref_reward, *_ = reference.step(torch.as_tensor(action)[None])
    np.testing.assert_allclose(stepped, ref_obs[0].numpy(), rtol=1e-6, atol=1e-6)
    assert reward == pytest.approx(float(ref_reward[0]), rel=1e-6)
