"""The finetuning runner: run folder, exact resume, command line and its errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
import torch
from conftest import TINY_FINETUNE
from omegaconf import OmegaConf

from myriad.cli import main
from myriad.finetune.algorithms import ALGORITHMS, build_algorithm
from myriad.finetune.api import resolve_config
from myriad.finetune.base import FinetuneAlgorithm
from myriad.finetune.init import InitReport
from myriad.finetune.runner import FinetuneRunner
from myriad.nn.population import build_population
from myriad.utils.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from myriad.utils.config import ConfigError
from myriad.utils.migrations import migrate_checkpoint
from myriad.utils.seeding import STREAMS, derive_seed, stream_seed

TINY = [*TINY_FINETUNE, "num_envs=16"]
ALGO_TINY = {
    "cpo": ["population.size=2", "algo.discriminator.hidden=[8]"],
    "sapg": ["population.size=4"],
    "pbt": ["population.size=4", "algo.interval=1"],
    "ppo": [],
}


def runner(tmp_path, algo: str, name: str, *extra: str) -> FinetuneRunner:
    return FinetuneRunner(resolve_config(algo, [*TINY, *ALGO_TINY[algo], *extra]), tmp_path / name)


@pytest.mark.parametrize("algo", ["cpo", "pbt"])
def test_resume_is_exact(tmp_path, algo):
    # Plots are written whenever `learn` returns; three runs' worth would dominate the test.
    straight = runner(tmp_path, algo, "straight", "plots=false")
    straight.learn(4)
    first = runner(tmp_path, algo, "split", "plots=false")
    first.learn(2)
    first.close()
    second = runner(tmp_path, algo, "split", "plots=false")
    with torch.no_grad():  # everything must come from the checkpoint
        for p in second.model.parameters():
            p.add_(1.0)
    assert second.resume(tmp_path / "split").name == "iter_000002.pt"
    second.learn(4)

    a, b = straight.model.state_dict(), second.model.state_dict()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    sa, sb = straight.algorithm.state_dict(), second.algorithm.state_dict()
    if algo == "cpo":
        for key, value in sa["discriminator"]["net"].items():
            assert torch.equal(value, sb["discriminator"]["net"][key]), key
    else:
        assert torch.equal(sa["hyperparameters"], sb["hyperparameters"])
        assert sa["rounds"] == sb["rounds"] >= 2
    hist_a, hist_b = straight.logger.history, second.logger.history
    assert "eval/leader_success" in hist_a
    for key in hist_a:
        if not key.startswith("perf/"):
            assert hist_a[key] == hist_b[key], key


def test_checkpoint_naming_the_former_sharded_runner_resumes(tmp_path):
    """torchrun runs named their checkpoints ShardedFinetuneRunner before ranks became a role of
    FinetuneRunner: such a checkpoint resumes; one of another runner is refused."""
    first = runner(tmp_path, "ppo", "run", "plots=false")
    first.learn(1)
    first.close()
    path = tmp_path / "run" / "checkpoints" / "iter_000001.pt"
    payload = load_checkpoint(path)
    assert payload["runner"] == "FinetuneRunner"
    for name, resumes in (("ShardedFinetuneRunner", True), ("PretrainRunner", False)):
        payload["runner"] = name
        save_checkpoint(path, {k: v for k, v in payload.items() if k != "digest"})
        again = runner(tmp_path, "ppo", "run", "plots=false")
        if resumes:
            assert again.resume(path) == path and again.iteration_count == 1
        else:
            with pytest.raises(CheckpointError, match="written by PretrainRunner"):
                again.resume(path)
        again.close()


# The leader's success is known from geometry whatever the policy. nav-empty starts within 0.4
# cells (per axis) of (6.5, 6.5) and moves at most 0.5 cells per axis per step. A goal at the
# start with radius 1.5 is reached on the first step (0.4 + 0.5 < 1.5 / sqrt(2)); the default
# goal (10.5, 1.5) is 5 - 0.4 - 0.5 = 4.1 cells away in y, more than 6 steps can cover.
GOAL_AT_START = ["+env.options.goal=[6.5,6.5]", "+env.options.goal_radius=1.5"]


@pytest.mark.parametrize(
    ("algo", "goal", "success"), [("sapg", GOAL_AT_START, 1.0), ("ppo", [], 0.0)]
)
def test_run_folder_and_diagnostics(tmp_path, algo, goal, success):
    r = runner(tmp_path, algo, "run", f"plots={algo == 'sapg'}", "eval.sampled=true", *goal)
    r.learn(2)
    summary = r.finish()
    r.close()
    folder = tmp_path / "run"
    written = json.loads((folder / "summary.json").read_text())
    assert written["algo"] == algo
    assert written["final_eval"] == summary["final_eval"]
    assert written["final_eval"]["eval/leader_success"] == success
    # eval.sampled: the same evaluation with sampled actions (a goal at the start, or out of
    # reach, gives the same success either way).
    assert written["final_eval"]["eval/leader_success_sampled"] == success
    assert "eval/population_success_sampled" in written["final_eval"]
    assert summary["scalars"]["episode/success"] == success
    assert (folder / "config.yaml").is_file()
    assert (folder / "checkpoints" / "iter_000002.pt").is_file()
    assert list(folder.glob("events.out.tfevents.*"))
    scalars = summary["scalars"]
    if algo == "sapg":
        assert (folder / "plots" / "pairwise_kl.png").is_file()
        assert (folder / "plots" / "finetune_overview.png").is_file()
        assert 0.0 < scalars["train/leader_ess"] <= 1.0
        for i in (1, 2, 3):
            # Members start from different weights, so no follower equals the leader.
            assert scalars[f"kl_to_leader/on_leader_states/member_{i}"] > 0.0
            assert scalars[f"kl_to_leader/on_own_states/member_{i}"] > 0.0
        assert torch.allclose(r.diagnostics.last_matrix.diagonal(), torch.zeros(4))
        # Each member's policy width, as the model holds it after the last update.
        spread = r.model.member_log_std().detach().mean(dim=1)
        for i in range(4):
            assert scalars[f"policy/log_std/member_{i}"] == pytest.approx(float(spread[i]))
    assert scalars["policy/log_std_mean"] == pytest.approx(
        float(r.model.member_log_std().detach().mean())
    )
    assert "episode/success" in scalars


def test_cli_runs_and_reports_bad_input(tmp_path, capsys):
    assert main(["finetune", "--algo", "dqn"]) == 2
    err = capsys.readouterr().err  # the algorithms, then the presets of configs/algo
    assert "unknown algorithm 'dqn'; known: cpo, sapg, ppo, pbt (presets: cpo_paper, " in err
    assert main(["finetune", "--init", "a", "--resume", "b"]) == 2
    assert "give one of them" in capsys.readouterr().err
    args = ["finetune", "--algo", "cpo", "--run-dir", str(tmp_path / "cli"), "plots=false"]
    assert main([*args, *TINY, *ALGO_TINY["cpo"], "iterations=1", "algo.kl_preset=huge"]) == 2
    assert "light (0.1), balanced (0.2), high (0.3)" in capsys.readouterr().err
    assert main([*args, *TINY, *ALGO_TINY["cpo"], "iterations=1"]) == 0
    assert "finetuning (cpo) finished" in capsys.readouterr().out
    assert main(["finetune", "--resume", str(tmp_path / "cli"), "iterations=2"]) == 0
    summary = json.loads((tmp_path / "cli" / "summary.json").read_text())
    assert summary["iterations"] == 2
    assert main(["finetune", "--algo", "ppo", "--resume", str(tmp_path / "cli")]) == 2
    assert "is a run of algo=cpo, not ppo" in capsys.readouterr().err
    bad_layout = ["num_envs=15", "population.size=2", "--run-dir", str(tmp_path / "bad")]
    assert main(["finetune", "--algo", "cpo", *bad_layout]) == 2
    assert "num_envs=15 does not split into population.size=2" in capsys.readouterr().err
    assert not (tmp_path / "bad").exists()  # refused before anything is written


@pytest.mark.parametrize("algo", ["cpo", "ppo"])
def test_critic_only_update_leaves_actors_and_lr(tmp_path, algo):
    r = runner(tmp_path, algo, "run", "plots=false", "tensorboard=false")
    r.collector.collect(r.storage)
    actor = {k: v.clone() for k, v in r.model.actor.state_dict().items()}
    critic = {k: v.clone() for k, v in r.model.critic.state_dict().items()}
    log_std, lr = r.model.log_std.detach().clone(), r.algorithm.lr
    stats = r.algorithm.update(r.storage, critic_only=True)
    for k, v in r.model.actor.state_dict().items():
        assert torch.equal(v, actor[k]), k
    assert torch.equal(r.model.log_std, log_std)
    assert any(not torch.equal(v, critic[k]) for k, v in r.model.critic.state_dict().items())
    assert r.algorithm.lr == lr and stats["value_loss"] > 0.0
    r.close()


def test_critic_warmup_only_after_init_with_fresh_critics(tmp_path):
    r = runner(tmp_path, "cpo", "run", "plots=false", "init.critic_warmup=2")
    assert r.critic_warmup == 0  # no --init: nothing to warm up against
    r.init_report = InitReport("pretrained.pt", [1.0], [1.0], [0], [0, 0], "fresh")
    assert r.critic_warmup == 2
    r.learn(3)
    assert [v for _, v in r.logger.history["train/critic_only"]] == [1.0, 1.0, 0.0]
    r.init_report.critic = "pretrained"
    assert r.critic_warmup == 0
    r.close()


def _legacy(population: dict) -> dict:
    """A population config as versions before the keys were the field names wrote it."""
    return {
        "size": population["size"],
        "kind": population["parameterization"],
        "hidden": population["actor_hidden"],
        "activation": population["activation"],
        "init_log_std": population["init_log_std"],
        "obs_norm": population["normalize_obs"],
    }


def test_run_saved_with_legacy_population_keys_resumes(tmp_path):
    first = runner(tmp_path, "ppo", "old", "plots=false", "tensorboard=false")
    first.learn(2)
    first.close()
    folder = tmp_path / "old"
    config = OmegaConf.to_container(OmegaConf.load(folder / "config.yaml"))
    config["population"] = _legacy(config["population"])
    (folder / "config.yaml").write_text(OmegaConf.to_yaml(config))
    checkpoint = folder / "checkpoints" / "iter_000002.pt"
    payload = load_checkpoint(checkpoint)
    payload["config"]["population"] = _legacy(payload["config"]["population"])
    # As those versions wrote it: format 1, no digest.
    torch.save({**payload, "format": 1}, checkpoint)

    assert main(["finetune", "--resume", str(folder), "iterations=3", "plots=false"]) == 0
    assert json.loads((folder / "summary.json").read_text())["iterations"] == 3
    resumed = load_checkpoint(folder / "checkpoints" / "iter_000003.pt")
    # Written in the current layout (myriad.utils.migrations).
    population = resumed["config"]["population"]
    assert population["parameterization"] == "shared_trunk" and "kind" not in population
    assert population["value_stats"] == "shared"  # what configs without the key meant
    for key, value in payload["state"]["model"].items():
        assert value.shape == resumed["state"]["model"][key].shape, key


@pytest.mark.parametrize(
    ("algo", "extra", "match"),
    [
        ("sapg", {"entropy": 0.1}, "algo=sapg has no setting(s) ['entropy']; its settings:"),
        ("cpo", {"awac_coef": "high"}, "algo.awac_coef='high' must be a number"),
        ("pbt", ["population.size=1"], "algo=pbt needs population.size >= 2, got 1"),
        ("cpo", ["population.size=1"], "algo=cpo needs a leader and followers"),
        ("ppo", ["population.size=2"], "algo=ppo trains one policy over all envs"),
    ],
)
def test_algorithm_settings_are_checked_in_one_line(algo, extra, match):
    """Also for configs built in code, which the checks of composed configs do not see."""
    cfg = resolve_config(algo, [*TINY, *(extra if isinstance(extra, list) else [])])
    if isinstance(extra, dict):
        cfg["algo"].update(extra)
    with pytest.raises(ConfigError, match=re.escape(match)) as info:
        build_algorithm(cfg, build_population(cfg["population"], 4, 2), 0)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_registry_builds_every_algorithm_with_the_protocol(algo):
    cfg = resolve_config(algo, [*TINY, *ALGO_TINY[algo]])
    model = build_population(cfg["population"], 4, 2)
    algorithm = build_algorithm(cfg, model, 0)
    assert isinstance(algorithm, FinetuneAlgorithm)
    assert algorithm.needs_transitions == (algo in ("sapg", "cpo"))
    assert algorithm.leader == 0  # PBT: the best member, 0 before any round
    scalars = algorithm.end_iteration(np.zeros(model.num_members), np.ones(model.num_members))
    assert bool(scalars) == (algo == "pbt")  # PBT logs its hyperparameters; PPO has nothing
    # Its random streams derive from the run's seed by name, not by offsets (seed + 1 is the
    # next run's seed).
    assert algorithm.generator.initial_seed() == stream_seed(0, "minibatches")
    if algo == "pbt":
        assert algorithm.pbt_generator.initial_seed() == stream_seed(0, "pbt")


def test_stream_seeds_are_distinct_and_stable():
    assert len(set(STREAMS.values())) == len(STREAMS)
    seeds = {stream_seed(run, name) for run in range(4) for name in STREAMS}
    assert len(seeds) == 4 * len(STREAMS) and not seeds & set(range(100))
    # SeedSequence is specified by NumPy: the same numbers on every machine and version.
    assert derive_seed(0, 2) == 8597659618385908031


def test_checkpoint_with_the_earlier_task_stats_layout_loads(tmp_path):
    """Checkpoints written when a wrapper env kept the success sums still resume: its sums move
    into the collector's episode tracker and the wrapped env's state into the env."""
    first = runner(tmp_path, "pbt", "new", "plots=false", "tensorboard=false")
    for _ in range(2):
        first.collector.collect(first.storage)
    state = first.state_objects()["collector"].state_dict()
    sums = state["episodes"]["sums"]  # return, length, success, count
    assert sums[3].sum() > 0
    legacy = {
        **state,
        "env": {
            "state_dict": {
                "env": state["env"],
                "sums": torch.stack([sums[0], sums[2], sums[3]]),
                "has_success": True,
            }
        },
        "episodes": {"sums": torch.stack([sums[0], sums[1], sums[3]])},
    }
    second = runner(tmp_path, "pbt", "old", "plots=false", "tensorboard=false")
    migrated = migrate_checkpoint({"format": 1, "state": {"collector": legacy}})
    second.state_objects()["collector"].load_state_dict(migrated["state"]["collector"])
    assert torch.equal(second.collector.episodes.sums, sums)
    assert second.collector.episodes.has_success
    assert torch.equal(second.env.pos, first.env.pos) and torch.equal(
        second.collector.obs, first.collector.obs
    )
    first.close()
    second.close()
