"""Older checkpoints and configs are brought to the current layout in one place
(myriad.utils.migrations), keyed on the checkpoint's format version."""

from __future__ import annotations

import math

import torch

from myriad.utils.checkpoint import FORMAT_VERSION
from myriad.utils.migrations import CHECKPOINT_STEPS, migrate_checkpoint, migrate_config


def format_1() -> dict:
    """A checkpoint in the layout of format 1: a torchrun launch of two ranks (one in the
    finetuning collector's wrapped layout), a KL set point without its repulsion and damping
    terms, a dataset entry without base_rows, legacy population keys."""
    sums3 = torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])  # return, length, count
    wrapped = {
        "env": {"tensors": {"pos": torch.zeros(2)}, "episode": {"returns": torch.ones(2)}},
        "sums": torch.tensor([[1.0, 2.0], [7.0, 8.0], [5.0, 6.0]]),  # return, success, count
        "has_success": True,
    }
    plain = {
        "tensors": {
            "pos": torch.zeros(2),
            "episode_return": torch.tensor([0.5, 1.5]),
            "episode_length": torch.tensor([3, 4]),
        }
    }
    return {
        "format": 1,
        "config": {"population": {"kind": "embedding", "hidden": [8, 8], "size": 2}},
        "state": {
            "collector": {
                "world_size": 2,
                "ranks": [
                    {"collector": {"env": {"state_dict": wrapped}, "episodes": {"sums": sums3}}},
                    {"collector": {"env": plain, "episodes": {"sums": sums3.clone()}}},
                ],
            },
            "algorithm": {"kl_setpoint": {"log_kl_coef": torch.tensor([-1.0, -2.0])}},
            "dataset": {"rows": None},
        },
    }


def test_a_format_1_checkpoint_gets_the_current_layout():
    payload = migrate_checkpoint(format_1())
    assert payload["format"] == FORMAT_VERSION == CHECKPOINT_STEPS[-1][0]
    first, second = (r["collector"] for r in payload["state"]["collector"]["ranks"])
    # The task-statistics wrapper: unwrapped, its success row joins the tracker's sums.
    assert set(first["env"]) == {"tensors", "episode"}
    assert torch.equal(first["episodes"]["sums"][2], torch.tensor([7.0, 8.0]))
    assert torch.equal(first["episodes"]["sums"][3], torch.tensor([5.0, 6.0]))
    assert first["episodes"]["has_success"] is True
    # Episode statistics out of the env's tensors; a success row of zeros.
    assert set(second["env"]["tensors"]) == {"pos"}
    assert torch.equal(second["env"]["episode"]["lengths"], torch.tensor([3, 4]))
    assert torch.equal(second["episodes"]["sums"][2], torch.zeros(2))
    assert second["episodes"]["has_success"] is False
    setpoint = payload["state"]["algorithm"]["kl_setpoint"]
    assert torch.equal(setpoint["repulsion"], torch.zeros(2))
    assert all(math.isnan(e) for e in setpoint["last_error"].tolist())
    assert payload["state"]["dataset"]["base_rows"] is None
    assert payload["config"]["population"] == {
        "parameterization": "embedding",
        "actor_hidden": [8, 8],
        "critic_hidden": [8, 8],
        "size": 2,
        "value_stats": "shared",
    }


def test_a_current_checkpoint_is_left_as_it_is():
    current = format_1()
    migrate_checkpoint(current)
    again = migrate_checkpoint(current)
    assert again["state"]["dataset"]["base_rows"] is None
    current["state"]["dataset"]["base_rows"] = 7
    # Steps run only above the saved format: a format-2 checkpoint keeps what it holds.
    current["state"]["algorithm"]["kl_setpoint"].pop("repulsion")
    kept = migrate_checkpoint(current)
    assert kept["state"]["dataset"]["base_rows"] == 7
    assert "repulsion" not in kept["state"]["algorithm"]["kl_setpoint"]


def test_config_steps_only_touch_keys_current_configs_never_hold():
    cfg = {"population": {"size": 4, "value_stats": "member", "actor_hidden": [64, 64]}}
    assert migrate_config({**cfg, "population": dict(cfg["population"])}) == cfg
    assert migrate_config({"env": {"name": "nav-maze"}}) == {"env": {"name": "nav-maze"}}
