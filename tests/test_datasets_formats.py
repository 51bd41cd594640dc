"""Every dataset format: bit-exact round trips, refusal of incomplete data, write errors that
lose nothing, and bounded memory when exporting."""

import itertools
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from myriad.datasets import (
    D4RLWriter,
    DatasetSpec,
    DatasetWriter,
    IncompleteDatasetError,
    load,
    open_reader,
    open_writer,
    validate,
)
from myriad.datasets.schema import ROW_KEYS, concat_rows
from myriad.utils.optional import available

HAS_MINARI = available("minari")
FORMATS = [
    "hdf5",
    "zarr",
    pytest.param(
        "minari",
        marks=pytest.mark.skipif(
            not HAS_MINARI, reason="minari not installed (pip install 'myriad-rl[offline]')"
        ),
    ),
]
_ids = itertools.count()


def make_rows(
    lengths: list[int],
    obs_dim: int = 3,
    act_dim: int = 2,
    p: int = 2,
    seed: int = 0,
    raw_bits: bool = True,
) -> dict[str, np.ndarray]:
    """Episode-contiguous rows: ``next_observations`` continue into the next row inside each
    episode; each episode ends with a terminal or a timeout (or both). With ``raw_bits`` the
    floats are arbitrary bit patterns (NaN payloads, infinities, -0.0, subnormals)."""
    rng = np.random.default_rng(seed)
    n = sum(lengths)

    def floats(*shape: int) -> np.ndarray:
        if raw_bits:
            return rng.integers(0, 2**32, size=shape, dtype=np.uint32).view(np.float32)
        return rng.standard_normal(shape).astype(np.float32)

    obs = floats(n, obs_dim)
    nxt = np.empty_like(obs)
    terminals = np.zeros(n, bool)
    timeouts = np.zeros(n, bool)
    member = np.empty(n, np.int32)
    start = 0
    for k, length in enumerate(lengths):
        end = start + length
        nxt[start : end - 1] = obs[start + 1 : end]
        nxt[end - 1] = floats(obs_dim)
        kind = rng.integers(0, 3)
        terminals[end - 1] = kind in (0, 2)
        timeouts[end - 1] = kind in (1, 2)
        member[start:end] = k % 3
        start = end
    return {
        "observations": obs,
        "actions": floats(n, act_dim),
        "rewards": floats(n),
        "next_observations": nxt,
        "terminals": terminals,
        "timeouts": timeouts,
        "member": member,
        "features": floats(n, p),
    }


def spec_of(rows: dict[str, np.ndarray]) -> DatasetSpec:
    p = rows["features"].shape[1]
    return DatasetSpec(
        rows["observations"].shape[1],
        rows["actions"].shape[1],
        tuple(f"f{i}" for i in range(p)),
        {"env": "unit-test", "seed": 7, "population_size": 3, "options": {"a": [1, 2]}},
    )


def writer_for(fmt: str, root: Path, spec: DatasetSpec, chunk_rows: int = 64) -> DatasetWriter:
    target = {"hdf5": root / "d.hdf5", "zarr": root / "d.zarr", "minari": root / "minari"}[fmt]
    return open_writer(
        fmt, target, spec, dataset_id=f"test/d{next(_ids)}-v0", chunk_rows=chunk_rows
    )


def assert_bits_equal(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    for key in ROW_KEYS:
        assert a[key].dtype == b[key].dtype, key
        assert a[key].shape == b[key].shape, key
        assert a[key].tobytes() == b[key].tobytes(), key


def read_all(path: Path, chunk_rows: int) -> tuple[dict[str, np.ndarray], DatasetSpec]:
    reader = open_reader(path)
    try:
        rows = concat_rows(list(reader.iter_chunks(chunk_rows)), reader.spec)
        return rows, reader.spec
    finally:
        reader.close()


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(1, 40), min_size=1, max_size=8),
    dims=st.tuples(st.integers(1, 5), st.integers(1, 3), st.integers(0, 3)),
    cuts=st.lists(st.integers(0, 400), max_size=4),
    chunk_rows=st.integers(1, 100),
    seed=st.integers(0, 2**16),
)
def test_round_trip_is_bit_exact(fmt, lengths, dims, cuts, chunk_rows, seed):
    rows = make_rows(lengths, *dims, seed=seed)
    n = len(rows["rewards"])
    spec = spec_of(rows)
    with tempfile.TemporaryDirectory() as tmp:
        writer = writer_for(fmt, Path(tmp), spec, chunk_rows=max(chunk_rows, 8))
        bounds = sorted({0, n, *(c % (n + 1) for c in cuts)})
        for a, b in itertools.pairwise(bounds):  # appends that cut episodes anywhere
            writer.append({k: v[a:b] for k, v in rows.items()})
        assert writer.rows == n
        path = writer.close()
        back, back_spec = read_all(path, chunk_rows)
        assert_bits_equal(rows, back)
        assert back_spec.feature_names == spec.feature_names
        assert back_spec.metadata["seed"] == 7
        assert back_spec.metadata["options"] == {"a": [1, 2]}
        data = load(path)
        for key in ROW_KEYS:
            assert getattr(data, key).tobytes() == rows[key].tobytes(), key


@pytest.mark.parametrize("fmt", FORMATS)
def test_load_filters_members_and_gives_torch(tmp_path, fmt):
    rows = make_rows([5, 7, 3, 9, 4], raw_bits=False)
    writer = writer_for(fmt, tmp_path, spec_of(rows))
    writer.append(rows)
    path = writer.close()
    data = load(path, members=[0, 2], framework="torch")
    keep = np.isin(rows["member"], [0, 2])
    assert data.observations.dtype.is_floating_point and len(data) == keep.sum()
    np.testing.assert_array_equal(data.observations.numpy(), rows["observations"][keep])
    np.testing.assert_array_equal(data.member.numpy(), rows["member"][keep])
    assert validate(path).ok


@pytest.mark.parametrize("fmt", FORMATS)
def test_incomplete_dataset_is_refused(tmp_path, fmt):
    rows = make_rows([4, 6], raw_bits=False)
    writer = writer_for(fmt, tmp_path, spec_of(rows))
    writer.append(rows)
    target = writer.path
    writer.close(complete=False)  # what a crash leaves behind
    assert not Path(target).exists()
    with pytest.raises(IncompleteDatasetError, match="not completed"):
        load(target)
    report = validate(target)
    assert not report.ok and "complete" in report.text()


def test_zarr_store_not_marked_complete_is_refused(tmp_path):
    import zarr

    rows = make_rows([4], raw_bits=False)
    writer = writer_for("zarr", tmp_path, spec_of(rows))
    writer.append(rows)
    path = writer.close()
    zarr.open_group(path, mode="r+").attrs["complete"] = False
    with pytest.raises(IncompleteDatasetError, match="not marked complete"):
        load(path)


@pytest.mark.parametrize("fmt", ["zarr", pytest.param("minari", marks=FORMATS[2].marks)])
def test_rows_ending_inside_an_episode_cannot_complete(tmp_path, fmt):
    rows = make_rows([6], raw_bits=False)
    writer = writer_for(fmt, tmp_path, spec_of(rows))
    writer.append({k: v[:4] for k, v in rows.items()})
    with pytest.raises(ValueError, match="inside an episode"):
        writer.close()


# A child process whose files may not grow past a limit: a full disk for that process only.
_FULL_DISK = textwrap.dedent(
    """
    import pickle, resource, signal, sys
    import numpy as np
    from myriad.datasets import DatasetWriteError, open_writer
    fmt, root, spec, rows, limit = pickle.load(open(sys.argv[1], "rb"))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a failed write, not a killed process
    target = {"hdf5": root + "/d.hdf5", "zarr": root + "/d.zarr", "minari": root + "/m"}[fmt]
    w = open_writer(fmt, target, spec, dataset_id="test/full-v0", chunk_rows=256)
    n1 = 40
    w.append({k: v[:n1] for k, v in rows.items()})
    hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        w.append({k: v[n1:] for k, v in rows.items()})
    except DatasetWriteError as exc:
        print("write error:", exc)
    else:
        sys.exit("the write did not fail")
    resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # space freed
    w.append({k: v[n1:] for k, v in rows.items()})
    print(w.close())
    """
)


@pytest.mark.parametrize(
    ("fmt", "limit"),
    [("hdf5", 8000), ("zarr", 3000), pytest.param("minari", 8000, marks=FORMATS[2].marks)],
)
def test_write_error_loses_no_rows(tmp_path, fmt, limit):
    import pickle

    lengths = [10, 30] + [50] * 30  # the first 40 rows are two whole episodes
    rows = make_rows(lengths, obs_dim=8, raw_bits=False)
    args = tmp_path / "args.pkl"
    args.write_bytes(pickle.dumps((fmt, str(tmp_path), spec_of(rows), rows, limit)))
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK, str(args)], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "write error:" in out.stdout and "intact" in out.stdout
    path = Path(out.stdout.strip().splitlines()[-1])
    back, _ = read_all(path, 1000)
    assert_bits_equal(rows, back)  # the first 40 rows survived, the retried rest follows


def test_export_memory_is_bounded_by_chunks(tmp_path):
    """300k rows (17 MB) exported in chunks of 4096 rows: peak allocations stay a few chunks."""
    n_ep, length = 1500, 200
    rows = make_rows([length] * n_ep, obs_dim=4, raw_bits=False)
    full_bytes = sum(v.nbytes for v in rows.values())
    spec = DatasetSpec(4, 2, ("f0", "f1"), {"env": "unit-test"})
    writer = D4RLWriter(tmp_path / "src.hdf5", 4, 2, ("f0", "f1"), metadata=spec.metadata)
    for start in range(0, len(rows["rewards"]), 50_000):
        writer.append({k: v[start : start + 50_000] for k, v in rows.items()})
    writer.close()
    del rows
    # A fresh interpreter: tracemalloc counts every thread's allocations, and threads left by
    # earlier tests in this process (writers, Ray clients) would add to the peak.
    script = textwrap.dedent(
        f"""
        import tracemalloc
        from myriad.datasets import export
        tracemalloc.start()
        result = export({str(tmp_path / "src.hdf5")!r}, "zarr", {str(tmp_path / "out.zarr")!r},
                        chunk_rows=4096)
        print(result.rows, result.max_chunk_rows, tracemalloc.get_traced_memory()[1])
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    n_rows, max_chunk_rows, peak = (int(v) for v in out.split()[-3:])
    assert n_rows == n_ep * length
    assert max_chunk_rows <= 4096
    chunk_bytes = 4096 * full_bytes / (n_ep * length)
    assert peak < 12 * chunk_bytes < full_bytes / 4, (peak, chunk_bytes, full_bytes)
