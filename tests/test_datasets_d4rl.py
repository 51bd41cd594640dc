"""Episode assembly and the D4RL-layout HDF5 writer."""

import h5py
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from myriad.datasets import D4RLWriter, EpisodeAssembler, read_d4rl
from myriad.datasets.hdf5 import partial_path


def _reference_episodes(
    t_total: int, num_envs: int, done: np.ndarray
) -> list[list[tuple[int, int]]]:
    """Brute force: walk each env in time and cut at done; returns (t, env) per episode, in the
    order the assembler emits them (by end step, then env)."""
    episodes, current = [], [[] for _ in range(num_envs)]
    for t in range(t_total):
        for e in range(num_envs):
            current[e].append((t, e))
            if done[t, e]:
                episodes.append(current[e])
                current[e] = []
    return episodes, current


@settings(max_examples=50, deadline=None)
@given(
    num_envs=st.integers(1, 5),
    rollouts=st.integers(1, 4),
    steps=st.integers(1, 6),
    seed=st.integers(0, 1000),
)
def test_assembler_matches_brute_force(num_envs, rollouts, steps, seed):
    rng = np.random.default_rng(seed)
    t_total = rollouts * steps
    done = rng.random((t_total, num_envs)) < 0.3
    done[:, :][np.arange(t_total) % 7 == 6] = True  # keep episodes within max_len
    asm = EpisodeAssembler(num_envs, 7, {"t": ((), np.int64), "e": ((), np.int64)})
    got_t, got_e = [], []
    for r in range(rollouts):
        sl = slice(r * steps, (r + 1) * steps)
        t = np.arange(t_total)[sl, None].repeat(num_envs, 1)
        e = np.arange(num_envs)[None].repeat(steps, 0)
        rows = asm.add({"t": t, "e": e}, done[sl])
        got_t += rows["t"].tolist()
        got_e += rows["e"].tolist()
    episodes, unfinished = _reference_episodes(t_total, num_envs, done)
    expected = [p for ep in episodes for p in ep]
    assert list(zip(got_t, got_e)) == expected
    rows, last = asm.flush()
    tail = [p for ep in unfinished for p in ep]
    assert list(zip(rows["t"].tolist(), rows["e"].tolist())) == tail
    assert last.sum() == sum(1 for ep in unfinished if ep)


def test_assembler_state_round_trip():
    fields = {"x": ((2,), np.float32)}
    a = EpisodeAssembler(3, 10, fields)
    a.add({"x": np.ones((4, 3, 2), np.float32)}, np.zeros((4, 3), bool))
    b = EpisodeAssembler(3, 10, fields)
    b.load_state_dict(a.state_dict())
    done = np.zeros((1, 3), bool)
    done[0, 1] = True
    step = {"x": np.full((1, 3, 2), 2.0, np.float32)}
    np.testing.assert_array_equal(a.add(step, done)["x"], b.add(step, done)["x"])


def _rows(n: int, start: float = 0.0) -> dict[str, np.ndarray]:
    obs = np.arange(n * 3, dtype=np.float32).reshape(n, 3) + start
    return {
        "observations": obs,
        "next_observations": obs + 1,
        "actions": np.ones((n, 2), np.float32),
        "rewards": np.arange(n, dtype=np.float32),
        "terminals": np.arange(n) % 5 == 4,
        "timeouts": np.zeros(n, bool),
        "member": (np.arange(n) % 2).astype(np.int32),
        "features": obs[:, :2],
    }


def test_writer_round_trip_and_layout(tmp_path):
    path = tmp_path / "d.hdf5"
    w = D4RLWriter(path, 3, 2, ("x", "y"), metadata={"env": "nav-maze", "seed": 3})
    w.append(_rows(10))
    w.append(_rows(7, start=100))
    assert not path.exists() and partial_path(path).exists()
    w.close()
    data = read_d4rl(path)
    assert data["observations"].shape == (17, 3)
    np.testing.assert_array_equal(data["observations"][10:], _rows(7, 100)["observations"])
    np.testing.assert_array_equal(data["infos"]["member"][:4], [0, 1, 0, 1])
    np.testing.assert_array_equal(data["infos"]["y"][:10], _rows(10)["observations"][:, 1])
    assert data["metadata"]["env"] == "nav-maze" and data["metadata"]["seed"] == 3


def test_incomplete_file_is_refused(tmp_path):
    path = tmp_path / "d.hdf5"
    w = D4RLWriter(path, 3, 2, ("x", "y"))
    w.append(_rows(4))
    w.file.close()  # a crash: never closed by the writer
    with pytest.raises(ValueError, match="not completed"):
        read_d4rl(path)


def test_resume_truncates_to_checkpoint_rows(tmp_path):
    path = tmp_path / "d.hdf5"
    w = D4RLWriter(path, 3, 2, ("x", "y"))
    w.append(_rows(10))
    checkpoint_rows = w.rows
    w.append(_rows(6, start=50))  # written after the checkpoint, then the run died
    w.file.close()
    w = D4RLWriter(path, 3, 2, ("x", "y"), resume_rows=checkpoint_rows)
    w.append(_rows(6, start=50))
    w.close()
    data = read_d4rl(path)
    assert len(data["observations"]) == 16
    with h5py.File(path) as f:
        assert {len(f[k]) for k in ("observations", "rewards", "infos/member", "infos/x")} == {16}


def test_resume_with_foreign_file_is_refused(tmp_path):
    path = tmp_path / "d.hdf5"
    w = D4RLWriter(path, 3, 2, ("x", "y"))
    w.append(_rows(3))
    w.file.close()
    with pytest.raises(ValueError, match="does not belong to this checkpoint"):
        D4RLWriter(path, 3, 2, ("x", "y"), resume_rows=10)
