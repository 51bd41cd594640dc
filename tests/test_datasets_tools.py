"""``myriad export`` and ``myriad dataset info|validate`` on a pretraining run's dataset, and a
resumed run after its writer was killed."""

import json
import shutil
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from myriad.cli import main
from myriad.datasets import load, read_d4rl
from myriad.datasets.schema import ROW_KEYS
from myriad.utils.optional import available


@pytest.fixture
def run(tiny_pretrain):
    return tiny_pretrain.path


def _same(a, b) -> None:
    for key in ROW_KEYS:
        np.testing.assert_array_equal(getattr(a, key), getattr(b, key), err_msg=key)


def test_export_zarr_and_hdf5_with_member_filter(run, tmp_path, capsys):
    source = load(run)
    assert main(["export", str(run), "--format", "zarr", "--out", str(tmp_path / "d.zarr")]) == 0
    assert "exported" in capsys.readouterr().out
    _same(source, load(tmp_path / "d.zarr"))
    out = tmp_path / "m.hdf5"
    assert (
        main(["export", str(run), "--format", "hdf5", "--members", "1,3", "--out", str(out)]) == 0
    )
    _same(source.members([1, 3]), load(out))
    assert main(["export", str(run), "--format", "hdf5", "--members", "7", "--out", str(out)]) == 2
    assert "not in the dataset" in capsys.readouterr().err


@pytest.mark.skipif(not available("minari"), reason="minari not installed (offline extra)")
def test_export_minari_opens_with_minari(run, tmp_path, monkeypatch):
    import minari

    root = tmp_path / "minari"
    args = ["export", str(run), "--format", "minari", "--out", str(root)]
    assert main([*args, "--dataset-id", "myriad/four-rooms/tiny-v0"]) == 0
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(root))
    assert "myriad/four-rooms/tiny-v0" in minari.list_local_datasets()
    ds = minari.load_dataset("myriad/four-rooms/tiny-v0")
    source = load(run)
    assert ds.total_steps == len(source)
    assert ds.total_episodes == len(source.episode_ends())
    assert ds.observation_space.shape == (4,) and ds.action_space.shape == (2,)
    episode = next(ds.iterate_episodes())
    n = len(episode)
    np.testing.assert_array_equal(episode.observations[:n], source.observations[:n])
    np.testing.assert_array_equal(episode.observations[n], source.next_observations[n - 1])
    meta = json.loads((root / "myriad/four-rooms/tiny-v0/data/metadata.json").read_text())
    assert meta["myriad"]["env"] == "nav-four-rooms" and meta["myriad"]["population_size"] == 4
    _same(source, load(root / "myriad/four-rooms/tiny-v0"))
    # The env comes back through Minari, as a Gymnasium env that acts as the run's did.
    env = ds.recover_environment()
    assert env.spec.id == "myriad/nav-four-rooms-v0"
    assert env.spec.max_episode_steps == meta["myriad"]["env_options"]["max_episode_steps"]
    assert env.observation_space == ds.observation_space
    assert env.action_space == ds.action_space
    from myriad.envs import make

    reference = make("nav-four-rooms", 1, **meta["myriad"]["env_options"])
    obs, _ = env.reset(seed=3)
    np.testing.assert_array_equal(obs, reference.reset(seed=3)[0].numpy())
    action = episode.actions[0]
    stepped = env.step(action)[0]
    np.testing.assert_array_equal(stepped, reference.step(torch.as_tensor(action)[None])[0][0])
    # Contiguous episode arrays: a few KB of HDF5 objects per episode, not Minari's ~23 KB of
    # chunk indexes (benchmarks/minari_size.py measures the whole files).
    with h5py.File(root / "myriad/four-rooms/tiny-v0/data/main_data.hdf5") as f:
        stored = []
        f.visititems(
            lambda _, o: (
                stored.append(o.id.get_storage_size()) if isinstance(o, h5py.Dataset) else None
            )
        )
    data = root / "myriad/four-rooms/tiny-v0/data/main_data.hdf5"
    overhead = data.stat().st_size - sum(stored)
    assert overhead < 4096 * ds.total_episodes + 65536, overhead / ds.total_episodes


def test_export_relabels_task_rewards(run, tmp_path):
    out = tmp_path / "sparse.zarr"
    argv = ["export", str(run), "--format", "zarr", "--task", "sparse", "--out", str(out)]
    assert main([*argv, "--goal", "2.5,2.5"]) == 0
    got = load(out)
    want = load(run, task="sparse", goal=(2.5, 2.5))
    _same(want, got)
    assert got.metadata["reward"].startswith("task reward 'sparse'")


def test_info_reports_counts_and_coverage(run, capsys):
    assert main(["dataset", "info", str(run), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["steps"] == 4 * 16 * 64
    assert sorted(info["members"]) == ["0", "1", "2", "3"]
    assert 0 < info["coverage_union"] <= 1
    assert all(0 < m["coverage"] <= info["coverage_union"] for m in info["members"].values())
    assert info["size_bytes"] > 0 and set(info["feature_ranges"]) == {"x", "y"}
    assert main(["dataset", "info", str(run)]) == 0
    assert "union " in capsys.readouterr().out


def test_validate_accepts_good_and_rejects_broken(run, tmp_path, capsys):
    path = run / "dataset" / "transitions.hdf5"
    assert main(["dataset", "validate", str(path)]) == 0
    broken = tmp_path / "broken.hdf5"
    shutil.copy(path, broken)
    with h5py.File(broken, "r+") as f:
        ends = f["terminals"][:] | f["timeouts"][:]
        inside = int(np.flatnonzero(~ends)[3])
        f["next_observations"][inside] = f["next_observations"][inside] + 1.0
        f["rewards"][5] = np.nan
        f["timeouts"][-1] = False
    capsys.readouterr()
    assert main(["dataset", "validate", str(broken)]) == 1
    out = capsys.readouterr().out
    assert "INVALID" in out and f"row {inside} " in out
    assert "NaN" in out and "ends inside an episode" in out
    with h5py.File(broken, "r+") as f:
        f["rewards"].resize((10,))
    assert main(["dataset", "validate", str(broken)]) == 1
    assert "rewards has 10 rows" in capsys.readouterr().out
    assert main(["dataset", "validate", str(tmp_path / "missing.hdf5")]) == 1


# The child wraps RowSegments.append, the one call that puts dataset rows on disk, and kills
# itself with SIGKILL right after the first rows written once the iteration-2 checkpoint exists:
# rows past the checkpoint are on disk, which the resumed run must cut back.
_CHILD = """
import os, signal, sys
from pathlib import Path
from myriad.datasets.segments import RowSegments
from myriad.pretrain import pretrain

run, checkpoint = Path(sys.argv[1]), Path(sys.argv[2])
append = RowSegments.append

def append_then_die(self, rows):
    written = append(self, rows)
    if checkpoint.exists():
        os.kill(os.getpid(), signal.SIGKILL)
    return written

RowSegments.append = append_then_die
pretrain(sys.argv[3:], run_dir=run, quiet=True)
"""


@pytest.mark.slow
def test_killed_run_resumes_without_lost_or_duplicated_rows(tiny_pretrain, tmp_path):
    """SIGKILL a pretraining process in iteration 3, after rows past its iteration-2 checkpoint
    were written, resume it, and compare the dataset with the uninterrupted run's, row for row."""
    from myriad.pretrain import pretrain

    killed = tmp_path / "killed"
    checkpoint = killed / "checkpoints" / "iter_000002.pt"
    argv = [sys.executable, "-c", _CHILD, str(killed), str(checkpoint), *tiny_pretrain.overrides]
    child = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert child.returncode == -signal.SIGKILL, child.stderr
    assert checkpoint.exists() and not (killed / "checkpoints" / "iter_000004.pt").exists()
    partial = killed / "dataset" / "transitions.hdf5.partial"
    assert partial.is_dir() and not (killed / "dataset" / "transitions.hdf5").exists()
    with pytest.raises(ValueError, match="not completed"):
        read_d4rl(killed / "dataset" / "transitions.hdf5")
    pretrain(["iterations=4"], resume=killed, quiet=True)
    a = read_d4rl(tiny_pretrain.path / "dataset" / "transitions.hdf5")
    b = read_d4rl(killed / "dataset" / "transitions.hdf5")
    assert len(a["observations"]) == 4 * 16 * 64
    for key in ("observations", "actions", "rewards", "next_observations", "terminals", "timeouts"):
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    for key in a["infos"]:
        np.testing.assert_array_equal(a["infos"][key], b["infos"][key], err_msg=key)
    # The per-iteration row counts (selection by --iterations) survive the kill as well.
    counts = load(killed).metadata["iteration_rows"]
    assert counts == load(tiny_pretrain.path).metadata["iteration_rows"] and len(counts) == 4


def test_goal_conditioned_copies_relabel_each_goal_and_append_it(tiny_pretrain):
    from myriad.datasets import relabel
    from myriad.datasets.data import goal_conditioned

    data = load(tiny_pretrain.path)
    # Two visited positions: goals in reachable cells of the run's layout.
    goals = [tuple(float(v) for v in data.features[i]) for i in (0, len(data) // 2)]
    out = goal_conditioned(data, goals, (17.0, 17.0), clip_actions=True)
    n = len(data)
    assert len(out) == 2 * n and out.observations.shape[1] == data.observations.shape[1] + 2
    for k, goal in enumerate(goals):
        part = slice(k * n, (k + 1) * n)
        expected = relabel(data, "sparse", goal)
        np.testing.assert_array_equal(out.rewards[part], expected.rewards)
        np.testing.assert_array_equal(out.terminals[part], expected.terminals)
        np.testing.assert_array_equal(out.observations[part, :-2], data.observations)
        tag = np.array(goal, np.float32) / 17.0 * 2 - 1
        np.testing.assert_allclose(out.observations[part, -2:], np.broadcast_to(tag, (n, 2)))
        np.testing.assert_allclose(out.next_observations[part, -2:], np.broadcast_to(tag, (n, 2)))
    assert np.abs(out.actions).max() <= 1.0
    raw = goal_conditioned(data, goals[:1], (17.0, 17.0))
    np.testing.assert_array_equal(raw.actions, data.actions)
