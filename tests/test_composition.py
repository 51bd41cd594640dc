"""The stages receive their collaborators from the command layer: what runs a torchrun rank, the
factory of envs on workers. Nothing below the distributed package loads it, even by name."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import TINY_FINETUNE, TINY_PRETRAIN

from myriad.envs import EnvConfigError, VecEnv, make, make_from_config
from myriad.finetune import finetune
from myriad.pretrain import pretrain
from myriad.utils.config import ConfigError
from myriad.utils.launch import RunRequest

ROOT = Path(__file__).resolve().parent.parent


def test_a_pretraining_from_python_never_loads_the_distributed_package(tmp_path):
    """The stage, its runner and its env builder run without importing ``myriad.distributed``
    (no importlib back door from below)."""
    code = (
        "import sys\n"
        "from myriad.pretrain import pretrain\n"
        f"pretrain({[*TINY_PRETRAIN, 'iterations=1', 'plots=false']!r}, "
        f"run_dir={str(tmp_path / 'run')!r}, quiet=True)\n"
        "loaded = sorted(m for m in sys.modules if m.startswith('myriad.distributed'))\n"
        "assert not loaded, loaded\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "run" / "summary.json").is_file()


def test_a_distributed_env_config_without_a_remote_factory_is_refused():
    with pytest.raises(EnvConfigError, match=r"remote_envs=myriad\.distributed\.make_distributed"):
        make_from_config({"name": "nav-empty"}, 4, "cpu", distributed="local")


def test_the_remote_factory_given_builds_the_envs_of_a_distributed_config():
    """Any :class:`~myriad.envs.registry.RemoteEnvFactory` serves (here one that builds the
    envs in this process): it receives the env, its options and the ``distributed`` entry."""
    calls: list[tuple[Any, ...]] = []

    def in_process(
        name: str,
        num_envs: int,
        distributed: dict[str, Any] | str,
        device: torch.device | str,
        options: dict[str, Any],
    ) -> VecEnv:
        calls.append((name, num_envs, distributed, options))
        return make(name, num_envs, device, **options)

    env = make_from_config(
        {"name": "nav-empty", "options": {"max_episode_steps": 7}},
        4,
        "cpu",
        distributed={"workers": {"num_workers": 2}},
        remote=in_process,
    )
    assert calls == [("nav-empty", 4, {"workers": {"num_workers": 2}}, {"max_episode_steps": 7})]
    assert env.name == "nav-empty" and env.num_envs == 4 and env.max_episode_steps == 7


def test_on_a_torchrun_rank_the_stages_hand_the_call_to_the_ranks_runner(monkeypatch, tmp_path):
    monkeypatch.setenv("WORLD_SIZE", "2")
    got: list[RunRequest] = []

    def on_ranks(request: RunRequest) -> dict[str, Any]:
        got.append(request)
        return {"ran": "on ranks"}

    assert pretrain(["seed=3"], run_dir=tmp_path, ranks=on_ranks) == {"ran": "on ranks"}
    assert finetune("cpo", ["seed=4"], init=tmp_path, ranks=on_ranks) == {"ran": "on ranks"}
    assert got == [
        RunRequest(["seed=3"], None, tmp_path),
        RunRequest(["seed=4"], None, None, algo="cpo", init=tmp_path),
    ]


def test_on_a_torchrun_rank_a_stage_without_a_ranks_runner_says_how_to_launch(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigError, match=r"torchrun \.\.\. -m myriad pretrain"):
        pretrain(["seed=3"])
    with pytest.raises(ConfigError, match="finetune_on_ranks"):
        finetune("cpo")


class MemorySink:
    """A dataset sink that keeps every rollout's rows in memory."""

    path = None

    def __init__(self) -> None:
        self.rollouts: list[dict[str, torch.Tensor]] = []
        self.finished_at: int | None = None

    def record(self, steps):
        self.rollouts.append({k: v.clone() for k, v in steps.items()})

    def finish(self, iteration):
        self.finished_at = iteration
        return None

    def cut_episodes(self):
        return 0

    def close(self):
        pass

    def state_dict(self):
        return {"rollouts": len(self.rollouts)}

    def load_state_dict(self, state, iteration):
        del self.rollouts[state["rollouts"] :]


def test_a_pretraining_runner_takes_another_dataset_sink_and_measurement(tmp_path):
    """Rows sent to an in-memory sink and a measurement without coverage: the run learns the
    same weights as with the defaults (neither feeds the update), the sink receives every
    rollout, and nothing is written where the dataset would be."""
    from myriad.pretrain.api import resolve_config
    from myriad.pretrain.collaborators import PopulationMeasurement, knn_measurement
    from myriad.pretrain.runner import PretrainRunner

    cfg = resolve_config([*TINY_PRETRAIN, "iterations=2", "plots=false", "checkpoint_every=0"])
    default = PretrainRunner(cfg, tmp_path / "default")
    default.learn(2)
    default_summary = default.finish()
    default.close()

    sink = MemorySink()

    def entropy_only(run) -> PopulationMeasurement:
        return PopulationMeasurement(knn_measurement(run).entropy, coverage=None)

    runner = PretrainRunner(
        cfg, tmp_path / "memory", dataset_sink=lambda run: sink, measurement=entropy_only
    )
    runner.learn(2)
    summary = runner.finish()
    runner.close()

    for key, value in default.model.state_dict().items():
        assert torch.equal(value, runner.model.state_dict()[key]), key
    assert len(sink.rollouts) == 2 and sink.finished_at == 2
    obs = sink.rollouts[0]["observations"]
    assert obs.shape == (16, 64, runner.env.obs_dim)
    assert set(sink.rollouts[0]) >= {"actions", "member", "features", "terminals", "timeouts"}
    assert summary["dataset"] is None and not (tmp_path / "memory" / "dataset").exists()
    assert default_summary["dataset"] is not None
    assert "coverage/cumulative_union" in default_summary
    assert not any(k.startswith(("coverage/", "eval_coverage")) for k in summary)
    assert summary["entropy/collective"] == default_summary["entropy/collective"]


class RecordingBackend:
    """A caller's own tracker: it records what the run sends it."""

    def __init__(self) -> None:
        self.configs: list[dict[str, Any]] = []
        self.scalars: list[tuple[int, int, dict[str, float]]] = []
        self.closed = False

    def log_config(self, config: Any) -> None:
        self.configs.append(dict(config))

    def log_scalars(self, scalars: Any, env_steps: int, iteration: int) -> None:
        self.scalars.append((env_steps, iteration, dict(scalars)))

    def log_video(self, tag: str, path: Path, env_steps: int, iteration: int) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


@pytest.mark.parametrize("stage", ["pretrain", "finetune"])
def test_a_callers_log_backend_gets_the_config_and_every_iterations_scalars(tmp_path, stage):
    """``log_backends=`` hands the run a tracker of the caller's own: it gets the config once,
    the scalars of every iteration (the same values the run's history holds), and is closed
    when the run ends."""
    from myriad.utils.checkpoint import resolve_checkpoint

    backend = RecordingBackend()
    if stage == "pretrain":
        pretrain(
            [*TINY_PRETRAIN, "plots=false"],
            run_dir=tmp_path / "run",
            quiet=True,
            log_backends=[backend],
        )
    else:
        finetune(
            "cpo",
            [*TINY_FINETUNE, "num_envs=16", "population.size=4", "iterations=4", "plots=false"],
            run_dir=tmp_path / "run",
            quiet=True,
            log_backends=[backend],
        )
    assert len(backend.configs) == 1 and backend.configs[0]["seed"] is not None
    iterations = [it for _, it, _ in backend.scalars]
    assert iterations == sorted(iterations) and iterations[-1] >= 2
    saved = torch.load(resolve_checkpoint(tmp_path / "run"), weights_only=True)
    history = saved["logger"]["history"]
    steps, iteration, last = backend.scalars[-1]
    assert steps > 0
    for key, value in last.items():
        assert dict(history[key])[iteration] == pytest.approx(value), key
    assert backend.closed
