"""The --init rule: ranking pretrained members on the task, mapping them, refusing mismatches."""

from __future__ import annotations

import re

import pytest
import torch

from myriad.envs import make
from myriad.finetune.api import resolve_config
from myriad.finetune.init import (
    InitError,
    build_population,
    init_config,
    initialise,
    member_mapping,
    rank_members,
)
from myriad.utils.checkpoint import save_checkpoint
from myriad.utils.migrations import LEGACY_POPULATION_KEYS, migrate_population

POPULATION = {
    "size": 3,
    "parameterization": "shared_trunk",
    "actor_hidden": [16],
    "critic_hidden": [16],
    "activation": "elu",
    "init_log_std": -1.0,
    "normalize_obs": True,
}
# The same population as configs saved by earlier versions wrote it.
LEGACY_POPULATION = {
    "size": 3,
    "kind": "shared_trunk",
    "hidden": [16],
    "activation": "elu",
    "init_log_std": -1.0,
    "obs_norm": True,
}
# What --init puts in the finetuning config for either: every field but the size, the fields
# the pretrained config leaves out at their defaults.
ARCHITECTURE = {
    "parameterization": "shared_trunk",
    "actor_hidden": [16],
    "critic_hidden": [16],
    "activation": "elu",
    "embedding_dim": 32,
    "init_log_std": -1.0,
    "log_std_bounds": [-5.0, 2.0],
    "normalize_obs": True,
    "obs_clip": 10.0,
    "normalize_value": True,
}
# nav-empty without start noise: the start is (6.5, 6.5) and the goal (10.5, 1.5), so the
# constant action (0.8, -1) (velocity 0.4, -0.5 cells per step) lands on the goal at step 10.
EMPTY = {"name": "nav-empty", "options": {"start_noise": 0.0, "max_episode_steps": 30}}
ACTIONS = [[0.0, 0.0], [-1.0, 1.0], [0.8, -1.0]]  # stay, walk away, reach the goal


def pretrained_run(tmp_path, env_cfg=EMPTY, population=POPULATION):
    """A run folder holding a checkpoint laid out like a pretraining run's."""
    env = make(env_cfg["name"], 1, "cpu", **env_cfg["options"])
    torch.manual_seed(0)
    model = build_population(migrate_population(population), env.obs_dim, env.action_dim)
    with torch.no_grad():
        model.actor.head.weight.zero_()
        model.actor.head.bias.copy_(torch.tensor(ACTIONS[: population["size"]]))
        model.obs_norm.mean.fill_(0.25)
    run = tmp_path / "pretrain"
    legacy = bool(set(population) & set(LEGACY_POPULATION_KEYS))
    # A current run saves every field (value_stats among them); an older one its own keys.
    saved = population if legacy else migrate_population(population)
    payload = {
        "config": {"env": env_cfg, "population": saved},
        "state": {"model": model.state_dict()},
    }
    path = run / "checkpoints" / "iter_000002.pt"
    if legacy:
        # Written by a version whose population keys were not yet the field names: format 1.
        path.parent.mkdir(parents=True)
        torch.save({**payload, "format": 1}, path)
    else:
        save_checkpoint(path, payload)
    return run, model


def test_rank_and_cycle():
    success = torch.tensor([0.5, 0.5, 0.9, 0.0])
    returns = torch.tensor([1.0, 2.0, 0.0, 5.0])
    assert rank_members(success, returns) == [2, 1, 0, 3]
    assert rank_members(torch.zeros(3), torch.zeros(3)) == [0, 1, 2]  # ties: by index
    assert member_mapping([2, 0, 1], 8) == [2, 0, 1, 2, 0, 1, 2, 0]
    assert member_mapping([2, 0, 1], 2) == [2, 0]


def test_initialise_ranks_on_task_and_maps_best_to_leader(tmp_path):
    run, source = pretrained_run(tmp_path)
    env = make("nav-empty", 1, "cpu", task="dense", **EMPTY["options"])
    torch.manual_seed(5)
    target = build_population({**POPULATION, "size": 4}, env.obs_dim, env.action_dim)
    critic_before = {k: v.clone() for k, v in target.critic.state_dict().items()}

    def make_env(n):
        return make("nav-empty", n, "cpu", task="dense", **EMPTY["options"])

    finetune_env = {"name": "nav-empty", "options": {**EMPTY["options"], "task": "dense"}}
    finetune_env["options"]["max_speed"] = 0.9
    report = initialise(
        target, run, make_env, episodes=4, deterministic=True, seed=0, env=finetune_env
    )
    assert report.env_differences == ["max_speed: None (pretrained) vs 0.9 (finetune)"]
    assert report.success == [0.0, 0.0, 1.0]
    # Staying put beats walking away on the dense return.
    assert report.returns[0] > report.returns[1]
    assert report.ranking == [2, 0, 1]
    assert report.mapping == [2, 0, 1, 2]
    assert report.source.endswith("iter_000002.pt")
    for i, j in enumerate(report.mapping):
        torch.testing.assert_close(target.actor.head.bias[i], source.actor.head.bias[j])
        torch.testing.assert_close(target.log_std[i], source.log_std[j])
    torch.testing.assert_close(target.actor.trunk[0].weight, source.actor.trunk[0].weight)
    torch.testing.assert_close(target.obs_norm.mean, source.obs_norm.mean)
    for k, v in target.critic.state_dict().items():  # fresh critic by default
        torch.testing.assert_close(v, critic_before[k])


def test_space_mismatch_lists_what_differs(tmp_path):
    multigoal = {"name": "nav-maze", "options": {"task": "multigoal"}}
    run, _ = pretrained_run(tmp_path, multigoal)
    cfg = resolve_config("cpo", ["num_envs=16", "population.size=2"])
    with pytest.raises(InitError) as err:
        init_config(cfg, run)
    text = str(err.value)
    assert "pretrained population (nav-maze (task=multigoal))" in text
    assert "does not fit this task (nav-maze (" in text and "task=sparse))" in text
    assert "observation space shape: (6,) (pretrained) vs (4,) (finetune)" in text
    assert "obs_dim: 6 (source) vs 4 (target)" in text
    assert "action space" not in text  # both act in [-1, 1]^2


@pytest.mark.parametrize("population", [POPULATION, LEGACY_POPULATION], ids=["fields", "legacy"])
def test_init_takes_the_architecture_and_refuses_overriding_it(tmp_path, population):
    run, _ = pretrained_run(tmp_path, {"name": "nav-maze", "options": {}}, population)
    cfg = resolve_config("sapg", ["num_envs=16", "population.size=2"], init=run)
    # The value statistics' scope is the finetuning run's own (not architecture).
    assert cfg["population"] == {"size": 2, "value_stats": "member", **ARCHITECTURE}
    shared = resolve_config("sapg", ["population.value_stats=shared"], init=run)
    assert shared["population"]["value_stats"] == "shared"
    assert cfg["init"]["source"].endswith("iter_000002.pt")
    with pytest.raises(InitError, match=re.escape("drop population.parameterization=independent")):
        resolve_config("pbt", ["population.parameterization=independent"], init=run)
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        resolve_config("cpo", [], init=tmp_path / "nothing")
