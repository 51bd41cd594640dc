"""The settings dataclasses are the schema of every run config: the packaged YAML holds exactly
their defaults, the Python API and the CLI build the same objects, and config errors come from
the schema (key, type, range)."""

from __future__ import annotations

from typing import Any

import pytest
from omegaconf import OmegaConf

from myriad.cli import main
from myriad.finetune.algorithms import ALGORITHMS, build_algorithm
from myriad.finetune.cpo import CPO, CPOConfig
from myriad.finetune.sapg import SAPGConfig
from myriad.finetune.settings import (
    FinetuneSettings,
    algo_defaults,
    check_finetune_config,
    describe_finetune,
)
from myriad.nn.population import ENV_SIZE_FIELDS, PopulationConfig, build_population
from myriad.pretrain.settings import (
    OBJECTIVES,
    POPULATION_DEFAULTS,
    PretrainSettings,
    check_pretrain_config,
    describe_pretrain,
)
from myriad.rl.ppo import PPOConfig
from myriad.utils.config import ConfigError, compose, config_dir
from myriad.utils.settings import defaults


def packaged(path: str) -> dict[str, Any]:
    """A packaged YAML file as a plain dict, without Hydra's defaults list."""
    loaded = OmegaConf.to_container(OmegaConf.load(config_dir() / path), resolve=True)
    assert isinstance(loaded, dict)
    loaded.pop("defaults", None)
    return loaded


def nest(dotted: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in dotted.items():
        *parents, leaf = key.split(".")
        node = out
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def test_finetune_yaml_holds_exactly_the_schema_defaults() -> None:
    assert packaged("finetune.yaml") == defaults(FinetuneSettings)


def test_pretrain_yaml_holds_exactly_the_schema_defaults() -> None:
    yaml = packaged("pretrain.yaml")
    assert yaml.pop("population") == POPULATION_DEFAULTS
    assert yaml == defaults(PretrainSettings)


def test_population_yaml_holds_exactly_the_population_defaults() -> None:
    assert packaged("population/default.yaml") == defaults(PopulationConfig, skip=ENV_SIZE_FIELDS)


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_each_algorithm_file_holds_its_defaults_and_presets(name: str) -> None:
    yaml = packaged(f"algo/{name}.yaml")
    assert yaml.pop("algo") == algo_defaults(name)
    assert yaml == nest(dict(ALGORITHMS[name].presets))


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_each_objective_file_holds_its_defaults(name: str) -> None:
    assert packaged(f"objective/{name}.yaml") == defaults(OBJECTIVES[name])


@pytest.mark.parametrize("path", sorted(p.stem for p in (config_dir() / "algo").glob("*.yaml")))
def test_every_algorithm_preset_passes_the_schema(path: str) -> None:
    check_finetune_config(compose("finetune", [f"algo={path}"]))


def test_python_defaults_and_the_cli_build_the_same_cpo() -> None:
    """``CPO(model, PPOConfig(), SAPGConfig(), CPOConfig())`` is ``myriad finetune --algo cpo``."""
    cfg = compose("finetune", ["algo=cpo"])
    model = build_population(cfg["population"], 4, 2)
    from_cli = build_algorithm(cfg, model, seed=0)
    assert isinstance(from_cli, CPO)
    assert from_cli.config == PPOConfig()
    assert from_cli.sapg == SAPGConfig()
    assert from_cli.cpo == CPOConfig()
    assert CPOConfig().set_point and CPOConfig().kl_target == 0.3
    assert model.config == PopulationConfig(4, 2, size=4)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["ppo.epochs=0"], "ppo.epochs=0 is out of range: it must be >= 1"),
        (["algo.kl_target=-1"], "algo.kl_target=-1 is out of range: it must be > 0"),
        (["algo.weighting=both"], "algo.weighting='both' is not known: it must be one of"),
        (["algo.setpoint.low=2"], "algo.setpoint.low=2 is out of range: it must be in (0, 1)"),
        (["+algo.kl_targ=0.2"], "algo=cpo has no setting(s) ['kl_targ']"),
        (["+ppo.epoch=3"], "ppo has no key 'epoch'"),
        (["eval.perturb=wall"], "eval.perturb='wall' is not known"),
        (["population.activation=swish"], "population.activation='swish' is not known"),
        (["+colour=red"], "the config has no key 'colour'"),
    ],
)
def test_config_errors_come_from_the_schema(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_finetune_config(compose("finetune", ["algo=cpo", *overrides]))
    assert message in str(info.value)


def test_pretrain_config_errors_come_from_the_schema() -> None:
    with pytest.raises(ConfigError, match=r"objective.k=0 is out of range"):
        check_pretrain_config(compose("pretrain", ["objective.k=0"]))
    with pytest.raises(ConfigError, match=r"objective has no key 'c'"):
        check_pretrain_config(compose("pretrain", ["objective=mepol", "+objective.c=2"]))
    with pytest.raises(ConfigError, match=r"dataset.enabled='yes' must be true or false"):
        check_pretrain_config(compose("pretrain", ["dataset.enabled=yes"]))


def test_naming_a_coefficient_keeps_the_set_point_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A key means the same whatever else is typed: ``algo.kl_preset=high`` starts the set point
    from lambda 0.3; fixed coefficients are asked for explicitly with ``algo.kl_target=null``."""
    from myriad.finetune.api import resolve_config

    cfg = resolve_config("cpo", ["algo.kl_preset=high"])
    assert cfg["algo"]["kl_target"] == 0.3
    assert "add algo.kl_target=null for fixed coefficients" in capsys.readouterr().err
    fixed = resolve_config("cpo", ["algo.kl_preset=high", "algo.kl_target=null"])
    assert fixed["algo"]["kl_target"] is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("kind", ["pretrain", "finetune"])
def test_myriad_config_prints_every_key(kind: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", kind]) == 0
    printed = capsys.readouterr().out.splitlines()
    rows = describe_pretrain() if kind == "pretrain" else describe_finetune("cpo")
    assert [line.split()[0] for line in printed] == [r.key for r in rows]
    composed = compose(kind, [])
    from myriad.utils.checkpoint import flatten_config

    flat = flatten_config(composed)
    # Every key a run of the command has (but the env's, and the task's) is in the schema with
    # the same default.
    listed = {r.key: r.default for r in rows}
    for key, value in flat.items():
        if key.split(".")[0] in ("env", "task") or key.startswith("init.rank_options"):
            continue
        assert key in listed, key
        assert listed[key] == (list(value) if isinstance(value, tuple) else value), key


def test_config_docs_page_is_current() -> None:
    """docs/config.md is the schema as ``python -m myriad.tools.config_schema`` writes it."""
    from pathlib import Path

    from myriad.tools.config_schema import page

    path = Path(__file__).resolve().parent.parent / "docs" / "config.md"
    assert path.read_text() == page(), (
        "regenerate it: python -m myriad.tools.config_schema > docs/config.md"
    )


def test_env_options_are_typed_by_the_env_class(capsys: pytest.CaptureFixture[str]) -> None:
    """The env section's schema is its class's keyword parameters: wrong types are one line,
    and ``myriad config --env`` lists them with the registered defaults."""
    assert main(["pretrain", "+env.options.goal_radius=far", "iterations=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["myriad: error: env 'nav-maze' option goal_radius='far' must be a number"]
    assert main(["config", "pretrain", "--env", "nav-maze"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert lines["env.options.layout"].split()[1] == "maze"  # the registered default
    assert "(a number)" in lines["env.options.max_speed"]
    assert "time limit" in lines["env.options.max_episode_steps"]
    assert main(["config", "pretrain", "--env", "nav-mazee"]) == 2
    assert "Did you mean nav-maze" in capsys.readouterr().err
