"""The SLURM batch scripts of docs/distributed.md, run through a real single-node SLURM.

``scripts/slurm-local.sh start`` installs Debian's munge, slurmctld and slurmd when they are
absent (apt-get, as root) and starts them; the test then submits, with ``sbatch --wait``:

- ``docs/examples/slurm_pretrain.sh``: one torchrun with two ranks (gloo on CPU), the tiny
  pretraining of the suite; the run's checkpoint must say two ranks trained it;
- ``docs/examples/slurm_ray.sh``: a Ray cluster started over the allocation by job steps, then
  pretraining with ``distributed=cluster`` (two env workers on that cluster).

Skipped, with the script's one line, only where the packages cannot be installed. The daemons
are stopped at the end when this test started them.
"""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from conftest import TINY_PRETRAIN, rank_env

ROOT = Path(__file__).resolve().parents[1]
SLURM_LOCAL = ROOT / "scripts" / "slurm-local.sh"
EXAMPLES = ROOT / "docs" / "examples"
#: Two iterations of the suite's tiny pretraining, a checkpoint at the end only.
TINY = (*TINY_PRETRAIN, "iterations=2", "checkpoint_every=0", "plots=false", "device=cpu")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def slurm():
    """A running single-node SLURM; stopped afterwards if this fixture started it."""
    if shutil.which("bash") is None or not sys.platform.startswith("linux"):
        pytest.skip("SLURM from Debian's packages needs Linux with bash")
    done = subprocess.run(
        ["bash", str(SLURM_LOCAL), "start"], capture_output=True, text=True, timeout=900
    )
    if done.returncode == 3:
        pytest.skip(done.stderr.strip().splitlines()[-1])
    assert done.returncode == 0, done.stderr[-3000:]
    started = done.stdout.strip().splitlines()[-1] == "started"
    yield
    if started:
        subprocess.run(["bash", str(SLURM_LOCAL), "stop"], capture_output=True, timeout=120)


def _sbatch(script: Path, folder: Path, options: list[str], args: list[str], env: dict) -> str:
    """Submit ``script`` and wait for it; returns the job's output (asserting it succeeded).
    Removes the job's Ray folder (``/tmp/ray-myriad-JOBID``, docs/examples/slurm_ray.sh)."""
    output = folder / "job.out"
    command = [
        "sbatch",
        "--wait",
        "--nodes=1",
        "--cpus-per-task=2",
        "--time=00:05:00",
        f"--chdir={folder}",
        f"--output={output}",
        *options,
        str(script),
        *args,
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=400)
    log = output.read_text() if output.exists() else ""
    job = re.search(r"Submitted batch job (\d+)", done.stdout)
    if job:
        shutil.rmtree(f"/tmp/ray-myriad-{job.group(1)}", ignore_errors=True)
    assert done.returncode == 0, f"{done.stderr}\n{log[-4000:]}"
    return log


def test_sbatch_scripts_run_torchrun_pretraining_and_a_ray_cluster(slurm, tmp_path):
    venv = Path(sys.prefix)
    if not (venv / "bin" / "activate").exists():
        pytest.skip("the batch scripts activate a virtual environment; this Python is not in one")
    env = {**rank_env(), "MYRIAD_VENV": str(venv)}

    # torchrun under SLURM: one node, two ranks (GPUS_PER_NODE is the ranks per node).
    folder = tmp_path / "torchrun"
    folder.mkdir()
    torchrun_env = {**env, "GPUS_PER_NODE": "2", "RDZV_PORT": str(_free_port())}
    log = _sbatch(
        EXAMPLES / "slurm_pretrain.sh", folder, ["--gpus-per-node=0"], list(TINY), torchrun_env
    )
    runs = list((folder / "runs" / "pretrain").glob("slurm-*"))
    assert len(runs) == 1, log[-3000:]
    checkpoint = torch.load(runs[0] / "checkpoints" / "iter_000002.pt", weights_only=False)
    assert checkpoint["world_size"] == 2

    # A Ray cluster on the allocation, pretraining with distributed=cluster.
    folder = tmp_path / "ray"
    folder.mkdir()
    run = folder / "run"
    args = [
        "--run-dir",
        str(run),
        "distributed.workers.num_workers=2",
        "distributed.workers.cpus_per_worker=1",
        *TINY,
    ]
    log = _sbatch(
        EXAMPLES / "slurm_ray.sh", folder, [], args, {**env, "RAY_PORT": str(_free_port())}
    )
    # The learner joined the cluster the job started (an embedded Ray would start its own).
    assert "Connecting to existing Ray cluster" in log, log[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["env_steps"] == 2 * 16 * 64
    config = yaml.safe_load((run / "config.yaml").read_text())["distributed"]
    assert config["ray"]["address"] == "auto" and config["workers"]["num_workers"] == 2
