"""Pretraining with its envs on Ray workers (``distributed=local``), killed after its first
checkpoint (``MYRIAD_KILL_AT``: a SIGKILL at a named point, no sleeps) and resumed with
``--resume RUN``: the run finishes and its dataset holds every transition, verified and valid.

Each run starts its own two-CPU Ray inside the ``myriad`` process (a SIGKILL of the process
takes its Ray with it); quarter-CPU workers, and the 180 s worker timeout of
tests/test_distributed_ray.py for a loaded machine.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from conftest import run_myriad

from myriad.cli import main
from myriad.datasets import read_d4rl

pytest.importorskip("ray")

ITERATIONS, STEPS, ENVS = 2, 8, 16
RUN = [
    "distributed=local",
    "distributed.workers.cpus_per_worker=0.25",
    "distributed.workers.timeout_s=180",
    "distributed.ray.num_cpus=2",
    "distributed.ray.log_to_driver=false",
    "progress=false",
    "plots=false",
    "tensorboard=false",
    f"iterations={ITERATIONS}",
    f"num_envs={ENVS}",
    f"num_steps={STEPS}",
    "population.size=2",
    "checkpoint_every=1",
    "eval.episodes=1",
    # Episodes outlive the first iteration: the checkpoint holds unfinished ones.
    "env.options.max_episode_steps=12",
]
NOTE = "myriad: note: the envs cannot be restored exactly"


def killed_and_resumed(tmp_path: Path, overrides: list[str]) -> tuple[dict, str]:
    """Kill a run when its first checkpoint is saved, resume it; returns the dataset and the
    resume's stderr, after checking that the run finished and its dataset verifies and
    validates."""
    run_myriad(["pretrain", *RUN, *overrides, "--run-dir", "run"], tmp_path, "checkpoint.saved:1")
    assert (tmp_path / "run" / "checkpoints" / "iter_000001.pt").is_file()
    stderr = run_myriad(["pretrain", "--resume", "run"], tmp_path)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["iterations"] == ITERATIONS
    path = tmp_path / "run" / "dataset" / "transitions.hdf5"
    assert main(["dataset", "verify", str(path)]) == 0
    assert main(["dataset", "validate", str(path)]) == 0
    data = read_d4rl(path)
    # Every transition of both iterations, once: none lost, none recorded twice.
    assert len(data["observations"]) == ITERATIONS * STEPS * ENVS
    return data, stderr


@pytest.mark.slow
def test_killed_ray_run_resumes_its_workers_exactly(tmp_path):
    """Torch envs: the workers' env state is checkpointed and restored, so the staged partial
    episodes continue where they were cut, with no note: the rows are an uninterrupted run's."""
    data, stderr = killed_and_resumed(tmp_path, ["env=maze"])
    assert NOTE not in stderr
    run_myriad(["pretrain", *RUN, "env=maze", "--run-dir", "whole"], tmp_path)
    whole = read_d4rl(tmp_path / "whole" / "dataset" / "transitions.hdf5")
    for key in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
        np.testing.assert_array_equal(data[key], whole[key], err_msg=key)


@pytest.mark.slow
def test_killed_ray_run_of_physics_envs_resets_and_cuts_the_staged_episodes(tmp_path):
    """MuJoCo keeps its state outside tensors: the resume says so on one line, resets the
    envs and ends the staged episodes as truncated, so no episode joins two trajectories."""
    pytest.importorskip("mujoco")
    data, stderr = killed_and_resumed(tmp_path, ["env=halfcheetah"])
    notes = [line for line in stderr.splitlines() if line.startswith(NOTE)]
    assert len(notes) == 1 and "16 unfinished episodes" in notes[0], stderr[-2000:]
    # Cut at the checkpoint (8 steps in, every env), then 8 steps from the reset to the end.
    ends = np.flatnonzero(data["timeouts"] | data["terminals"])
    lengths = np.diff(np.concatenate([[-1], ends]))
    assert len(ends) == 2 * ENVS and (lengths == STEPS).all()


@pytest.mark.slow
def test_a_resume_killed_after_cutting_episodes_loses_no_row(tmp_path):
    """Killed at the first checkpoint, resumed (the staged episodes are cut), killed again at
    the second checkpoint of that process (the run's last), resumed to the end: every
    transition of the three iterations is in the dataset once, and no episode joins two
    trajectories (each row's next observation is the next row's observation)."""
    pytest.importorskip("mujoco")
    run = [*RUN, "env=halfcheetah", "iterations=3"]
    run_myriad(["pretrain", *run, "--run-dir", "run"], tmp_path, "checkpoint.saved:1")
    run_myriad(["pretrain", "--resume", "run"], tmp_path, "checkpoint.saved:2")
    stderr = run_myriad(["pretrain", "--resume", "run"], tmp_path)
    assert sum(line.startswith(NOTE) for line in stderr.splitlines()) == 1
    path = tmp_path / "run" / "dataset" / "transitions.hdf5"
    assert main(["dataset", "verify", str(path)]) == 0
    assert main(["dataset", "validate", str(path)]) == 0
    data = read_d4rl(path)
    assert len(data["observations"]) == 3 * STEPS * ENVS
    ends = np.flatnonzero(data["timeouts"] | data["terminals"])
    starts = np.concatenate([[0], ends[:-1] + 1])
    for start, end in zip(starts, ends):
        np.testing.assert_allclose(
            data["next_observations"][start:end], data["observations"][start + 1 : end + 1]
        )
    # Per env: cut at the first resume (8 steps), the time limit (12), the run's end (4).
    lengths = ends - starts + 1
    assert sorted(set(lengths.tolist())) == [4, 8, 12] and len(lengths) == 3 * ENVS
