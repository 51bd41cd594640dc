"""Kill a pretraining run at each named write point (``MYRIAD_KILL_AT``, a SIGKILL the process
sends itself there: no sleeps, no races), resume it, and check the dataset row for row against an
uninterrupted run. Every guarantee in docs/guarantees.md points at a test here or in
tests/test_bad_inputs.py."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from conftest import run_myriad

from myriad.datasets import read_d4rl
from myriad.pretrain.api import pretrain

TINY = [
    "progress=false",
    "iterations=4",
    "num_envs=32",
    "num_steps=16",
    "population.size=2",
    "checkpoint_every=1",
    "keep_checkpoints=null",
    "eval.episodes=1",
    "plots=false",
]
ROWS = 4 * 16 * 32
DATASET = Path("dataset") / "transitions.hdf5"


def assert_same_rows(expected: Path, actual: Path) -> None:
    a, b = read_d4rl(expected), read_d4rl(actual)
    assert len(a["observations"]) == len(b["observations"])
    for key in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    assert a["infos"].keys() == b["infos"].keys()
    for key in a["infos"]:
        np.testing.assert_array_equal(a["infos"][key], b["infos"][key], err_msg=key)


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """An uninterrupted run, and the same run extended to 6 iterations (``extended``)."""
    root = tmp_path_factory.mktemp("reference")
    pretrain(TINY, run_dir=root / "run", quiet=True)
    shutil.copytree(root / "run", root / "extended")
    pretrain(["iterations=6"], resume=root / "extended", quiet=True)
    return root


@pytest.mark.parametrize(
    "point",
    [
        "dataset.segment_written:3",  # rows of iteration 3 staged, its checkpoint not written
        "checkpoint.saved:2",
        "dataset.final_written",  # the finished file built, not yet published
        "dataset.published",  # published, staging not yet removed (the old corruption window)
        "dataset.segment_removed:2",  # staging half removed
        "run.dataset_finished",  # published and cleaned, final checkpoint not yet written
        "checkpoint.saved:5",  # the final checkpoint written, summary not yet
    ],
)
def test_killed_at_any_point_resumes_to_the_same_rows(reference, tmp_path, point):
    run = tmp_path / "run"
    run_myriad(["pretrain", *TINY, "--run-dir", str(run)], tmp_path, point)
    published = run / DATASET
    if published.exists():  # a published file is always whole
        assert len(read_d4rl(published)["rewards"]) == ROWS
    summary = pretrain([], resume=run, quiet=True)
    assert summary["dataset"] == str(published)
    assert_same_rows(reference / "run" / DATASET, published)
    assert not (run / "dataset" / "transitions.hdf5.partial").exists()


def test_kill_during_an_extension_keeps_the_old_rows(reference, tmp_path):
    """A finished run extended with ``--resume RUN iterations=6``, killed while publishing the
    longer file, and resumed: the dataset grows to the uninterrupted extension's rows, and the
    first rows are the finished run's."""
    run = tmp_path / "run"
    shutil.copytree(reference / "run", run)
    args = ["pretrain", "--resume", str(run), "iterations=6"]
    run_myriad(args, tmp_path, "dataset.final_written")
    assert_same_rows(reference / "run" / DATASET, run / DATASET)  # untouched so far
    pretrain(["iterations=6"], resume=run, quiet=True)
    assert_same_rows(reference / "extended" / DATASET, run / DATASET)
    before = read_d4rl(reference / "run" / DATASET)
    after = read_d4rl(run / DATASET)
    np.testing.assert_array_equal(before["observations"], after["observations"][:ROWS])


def test_corrupt_newest_checkpoint_falls_back_with_a_warning(reference, tmp_path, capsys):
    run = tmp_path / "run"
    run_myriad(["pretrain", *TINY, "--run-dir", str(run)], tmp_path, "checkpoint.saved:3")
    newest = run / "checkpoints" / "iter_000003.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # a torn copy
    pretrain([], resume=run, quiet=True)
    err = capsys.readouterr().err
    assert "warning: skipped 1 unreadable checkpoint" in err and "iter_000002.pt" in err
    assert_same_rows(reference / "run" / DATASET, run / DATASET)


def test_resuming_a_finished_run_unchanged_changes_no_row(reference, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(reference / "run", run)
    summary = pretrain([], resume=run, quiet=True)
    assert summary["dataset"] == str(run / DATASET)
    assert_same_rows(reference / "run" / DATASET, run / DATASET)


def test_finished_file_published_after_the_chosen_checkpoint_is_kept(reference, tmp_path):
    """Resuming from an older checkpoint than the one the dataset was published at (the newer
    ones lost): the published rows stay, and the continued run rebuilds the same file."""
    run = tmp_path / "run"
    shutil.copytree(reference / "run", run)
    for name in ("iter_000004.pt", "iter_000003.pt"):
        (run / "checkpoints" / name).unlink()
    pretrain([], resume=run, quiet=True)
    assert_same_rows(reference / "run" / DATASET, run / DATASET)


def test_half_written_checkpoint_files_are_removed(reference, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(reference / "run", run)
    stale = run / "checkpoints" / ".iter_000005.pt.abc123.tmp"
    stale.write_bytes(b"torn")
    pretrain(["iterations=5"], resume=run, quiet=True)
    assert not stale.exists()
    with h5py.File(run / DATASET, "r") as f:
        assert f.attrs["run_iteration"] == 5 and f["rewards"].shape[0] == 5 * 16 * 32


def test_run_files_are_readable_like_any_new_file(reference):
    """Atomic writes go through a private temporary file; the result must not stay private."""
    mask = os.umask(0)
    os.umask(mask)
    for path in ("config.yaml", "summary.json", "checkpoints/iter_000004.pt"):
        mode = (reference / "run" / path).stat().st_mode & 0o777
        assert mode == 0o666 & ~mask, (path, oct(mode))
