"""A corpus of bad inputs, each run through the CLI: one line on stderr that says what was wrong
(and no traceback), a non-zero exit, and not one byte changed on disk."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from myriad.cli import main
from myriad.pretrain.api import pretrain

TINY = [
    "progress=false",
    "iterations=2",
    "num_envs=32",
    "num_steps=16",
    "population.size=2",
    "eval.episodes=1",
    "plots=false",
]


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the hash of its bytes."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    """A finished pretraining run, a finetuning-shaped foreign file and broken copies."""
    root = tmp_path_factory.mktemp("world")
    pretrain(TINY, run_dir=root / "run", quiet=True)
    dataset = root / "run" / "dataset" / "transitions.hdf5"
    (root / "truncated.hdf5").write_bytes(dataset.read_bytes()[: dataset.stat().st_size // 2])
    checkpoint = root / "run" / "checkpoints" / "iter_000002.pt"
    (root / "truncated.pt").write_bytes(checkpoint.read_bytes()[:1000])
    (root / "notes.txt").write_text("not a checkpoint\n")
    torch.save({"weights": torch.zeros(3)}, root / "foreign.pt")
    # A pickle of a Python object: the safe loader refuses it.
    torch.save({"config": {}, "state": {}, "opaque": Path("x")}, root / "pickled.pt")
    torn = root / "torn_run"
    shutil.copytree(root / "run", torn)
    for ckpt in (torn / "checkpoints").glob("*.pt"):
        ckpt.write_bytes(ckpt.read_bytes()[:1000])
    garbage = root / "garbage_run"
    shutil.copytree(root / "run", garbage)
    (garbage / "config.yaml").write_text("env: [unclosed\n  : :\n")
    return root


def run_cli(args: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(args)
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    return code, capsys.readouterr().err


def assert_one_line_error(code: int, err: str) -> None:
    assert code != 0
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("myriad: error: "), err
    assert "Traceback" not in err and "weights_only=False" not in err


PRETRAIN_OVERRIDES = [
    (["num_envs=abc"], "num_envs='abc' must be an integer"),
    (["seed=abc"], "seed='abc' must be an integer"),
    (["seed=1.5"], "seed=1.5 must be an integer"),
    (["objective.k=0"], "objective.k=0 is out of range"),
    (["objective.beta=2"], "objective.beta=2 is out of range"),
    (["ppo.lr=-1"], "ppo.lr=-1 is out of range"),
    (["ppo.gamma=1.5"], "ppo.gamma=1.5 is out of range"),
    (["iterations=0"], "iterations=0 is out of range"),
    (["iterations=-3"], "iterations=-3 is out of range"),
    (["checkpoint_every=-1"], "checkpoint_every=-1 is out of range"),
    (["population.size=0"], "population.size=0 is out of range"),
    (["progress=maybe"], "progress='maybe' must be true or false"),
    (["device=cuda:7"], "device=cuda:7"),
    (["device=tpu"], "device='tpu'"),
    (["env=bogus"], "env"),
    (["no_such_key=1"], "no_such_key"),
    (["dataset.path=/tmp/elsewhere.hdf5"], "inside the run folder"),
    (["dataset.path=../../escape.hdf5"], "inside the run folder"),
    (["num_envs=33"], "does not split into population.size=2 equal blocks"),
    (["+env.options.goal=[1,2,3]"], "option goal=[1, 2, 3] must be a list of 2 numbers or null"),
]


@pytest.mark.parametrize(("overrides", "message"), PRETRAIN_OVERRIDES)
def test_bad_pretrain_overrides(world, tmp_path, capsys, overrides, message):
    before = snapshot(world)
    run = tmp_path / "new"
    code, err = run_cli(["pretrain", *TINY, *overrides, "--run-dir", str(run)], capsys)
    assert_one_line_error(code, err)
    assert message in err
    assert not run.exists(), "a refused config must leave no run folder"
    assert snapshot(world) == before


def test_bad_files_and_commands(world, tmp_path, capsys, monkeypatch):
    """Truncated, foreign and garbage files, reused folders, runs of the other kind."""
    monkeypatch.chdir(tmp_path)  # where default run folders would appear
    run = world / "run"
    cases = [
        (["pretrain", *TINY, "--run-dir", str(run)], "--overwrite"),
        (["pretrain", "--resume", str(world / "truncated.pt")], "no config.yaml found"),
        (["pretrain", "--resume", str(world / "torn_run")], "no readable checkpoint"),
        (["pretrain", "--resume", str(world / "garbage_run")], "config.yaml is not a readable"),
        (["pretrain", "--resume", str(tmp_path / "missing")], "missing"),
        (["pretrain", "--resume", str(run), "iterations=abc"], "iterations='abc' must be"),
        (["finetune", "--resume", str(run)], "a run of myriad pretrain, not finetune"),
        (["finetune", "--algo", "bogus"], "bogus"),
        (["finetune", "--init", str(world / "notes.txt")], "not a readable checkpoint"),
        (["finetune", "--init", str(world / "foreign.pt")], "not a myriad checkpoint"),
        (["finetune", "--init", str(world / "pickled.pt")], "not a myriad checkpoint"),
        (["finetune", "--init", str(world / "truncated.pt")], "not a readable checkpoint"),
        (["finetune", "--init", str(run), "init.episodes=0"], "init.episodes=0 is out of range"),
        (["dataset", "info", str(world / "truncated.hdf5")], "not a readable HDF5 file"),
        (["export", str(world / "truncated.hdf5"), "--format", "zarr"], "not a readable HDF5"),
        (["export", str(run), "--format", "zarr", "--chunk-rows", "-5"], "positive integer"),
        (["export", str(run), "--format", "zarr", "--chunk-rows", "0"], "positive integer"),
        (["export", str(run), "--format", "zarr", "--members", "x"], "--members"),
        (["export", str(run), "--format", "hdf5", "--members", "7"], "members [7]"),
    ]
    for args, message in cases:
        before = snapshot(world)
        code, err = run_cli(args, capsys)
        assert_one_line_error(code, err)
        assert message in err, (args, err)
        assert snapshot(world) == before, args
        assert not (tmp_path / "runs").exists(), args


def test_a_run_folder_that_cannot_be_created_is_one_line(capsys):
    code, err = run_cli(["pretrain", *TINY, "--run-dir", "/proc/no/such/folder"], capsys)
    assert_one_line_error(code, err)
    assert "cannot create the run folder /proc/no/such/folder" in err


def test_argparse_errors_are_one_line(capsys):
    code, err = run_cli(["export"], capsys)
    assert_one_line_error(code, err)
    assert "--format" in err and "--help" in err


def test_overwrite_replaces_only_run_folders(world, tmp_path, capsys):
    other = tmp_path / "not_a_run"
    other.mkdir()
    (other / "thesis.tex").write_text("precious")
    code, err = run_cli(["pretrain", *TINY, "--run-dir", str(other), "--overwrite"], capsys)
    assert_one_line_error(code, err)
    assert "no config.yaml" in err and (other / "thesis.tex").read_text() == "precious"
    run = tmp_path / "run"
    shutil.copytree(world / "run", run)
    args = ["pretrain", *TINY, "iterations=1", "--run-dir", str(run), "--overwrite"]
    code, _ = run_cli(args, capsys)
    assert code == 0
    assert not (run / "checkpoints" / "iter_000002.pt").exists()  # the old run is gone
    with h5py.File(run / "dataset" / "transitions.hdf5", "r") as f:
        assert f["rewards"].shape[0] == 16 * 32


def test_foreign_d4rl_file_validates(tmp_path, capsys):
    """A D4RL-layout file written by another tool (no completion attribute, no infos/)."""
    path = tmp_path / "foreign.hdf5"
    n = 10
    with h5py.File(path, "w") as f:
        f["observations"] = np.zeros((n, 3), np.float32)
        f["next_observations"] = np.ones((n, 3), np.float32)
        f["actions"] = np.zeros((n, 2), np.float32)
        f["rewards"] = np.zeros(n, np.float32)
        f["terminals"] = np.zeros(n, bool)
        timeouts = np.zeros(n, bool)
        timeouts[-1] = True
        f["timeouts"] = timeouts
    code = main(["dataset", "validate", str(path)])
    out = capsys.readouterr().out
    assert "complete" in out and "not marked complete" not in out
    assert code in (0, 1)  # next_observations do not chain here; the layout is accepted
    from myriad.datasets import open_reader

    with open_reader(path) as reader:
        rows = next(iter(reader.iter_chunks()))
    assert rows["member"].tolist() == [0] * n and rows["features"].shape == (n, 0)


def test_closed_pipe_ends_quietly(world):
    """``myriad dataset validate RUN | head -1``: the reader goes away; no traceback."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe now fails with EPIPE
    child = subprocess.run(
        [sys.executable, "-m", "myriad.cli", "dataset", "validate", str(world / "run")],
        stdout=write_end,
        stderr=subprocess.PIPE,
        text=True,
        timeout=300,
    )
    os.close(write_end)
    assert child.returncode == 141, child.stderr
    assert "Traceback" not in child.stderr and "BrokenPipe" not in child.stderr


def test_full_disk_names_the_cause(tmp_path):
    """A write limit (RLIMIT_FSIZE, what a full disk looks like to the writer) hit while the
    run writes: one line naming the failed write, not a plotting error; rows kept."""
    import resource
    import signal

    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (60_000, 60_000))

    run = tmp_path / "run"
    child = subprocess.run(
        [sys.executable, "-m", "myriad.cli", "pretrain", *TINY, "--run-dir", str(run)],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=limit,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert child.returncode != 0
    lines = child.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("myriad: error: "), child.stderr
    assert "File too large" in lines[0] or "space" in lines[0], lines[0]
    assert f"then run: myriad pretrain --resume {run}" in lines[0], lines[0]
