"""Choosing the data (``myriad export --final-population | --iterations | --budget``): the greedy
coverage rule against a plain re-implementation, the exported rows against the source's, and the
per-iteration row counts a pretraining run records."""

import numpy as np
import pytest

from myriad.cli import main
from myriad.datasets import load, validate
from myriad.datasets.selection import episode_stream, greedy_coverage


def reference_greedy(lengths, cells, budget):
    """The documented rule, without laziness: every step recomputes every gain."""
    chosen, left, remaining, last = [], budget, list(range(len(lengths))), 0
    while left > 0 and remaining:
        covered, picked = set(), False
        while left > 0:
            gains = [(len(set(cells[i].tolist()) - covered), -i) for i in remaining]
            if not gains:
                break
            gain, neg_i = max(gains)
            if gain == 0:
                break
            i = -neg_i
            chosen.append(i)
            remaining.remove(i)
            covered |= set(cells[i].tolist())
            last = min(lengths[i], left)
            left -= last
            picked = True
        if not picked:
            for i in sorted(remaining):
                if left <= 0:
                    break
                chosen.append(i)
                last = min(lengths[i], left)
                left -= last
            break
    return chosen, last


@pytest.mark.parametrize("seed", range(6))
def test_greedy_coverage_matches_plain_greedy(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(1, 30))
    lengths = rng.integers(1, 50, k)
    cells = [np.unique(rng.integers(0, 40, rng.integers(0, 12))) for _ in range(k)]
    budget = int(rng.integers(1, lengths.sum() + 20))
    chosen, last = greedy_coverage(lengths, cells, budget)
    ref, ref_last = reference_greedy(lengths, cells, budget)
    assert chosen.tolist() == ref and last == ref_last
    assert sum(lengths[chosen[:-1]]) + last == min(budget, lengths.sum())


def test_episode_stream_keeps_chosen_episodes_in_order_and_cuts_the_last():
    lengths = [3, 5, 2, 4]
    ends = np.cumsum(lengths)
    n = ends[-1]
    timeouts = np.zeros(n, bool)
    timeouts[ends - 1] = True
    rows = {
        "rewards": np.arange(n, dtype=np.float32),
        "terminals": np.zeros(n, bool),
        "timeouts": timeouts,
    }
    chunks = [{k: v[a:b] for k, v in rows.items()} for a, b in [(0, 4), (4, 9), (9, 14)]]
    out = list(episode_stream(iter(chunks), np.array([3, 1]), last=1, last_rows=2))
    got = {k: np.concatenate([c[k] for c in out]) for k in rows}
    # Episode 1 (rows 3..7) cut to its first 2 rows, then episode 3 (rows 10..13), in order.
    assert got["rewards"].tolist() == [3, 4, 10, 11, 12, 13]
    assert got["timeouts"].tolist() == [False, True, False, False, False, True]


def test_pretraining_records_rows_per_iteration(tiny_pretrain):
    data = load(tiny_pretrain.path)
    counts = data.metadata["iteration_rows"]
    assert len(counts) == 4  # iterations=4
    assert counts == sorted(counts) and counts[-1] == len(data)
    # Rows up to each count are whole episodes (each count falls on an episode end).
    ends = set(data.episode_ends().tolist())
    assert all(c in ends for c in counts)


def test_export_iterations_and_budget(tiny_pretrain, tmp_path, capsys):
    full = load(tiny_pretrain.path)
    counts = full.metadata["iteration_rows"]
    out = tmp_path / "last2.hdf5"
    assert (
        main(
            [
                "export",
                str(tiny_pretrain.path),
                "--format",
                "hdf5",
                "--iterations=-2:",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    part = load(out)
    np.testing.assert_array_equal(part.observations, full.observations[counts[1] : counts[3]])
    assert "iteration_rows" not in part.metadata
    assert part.metadata["selection"] == {"rule": "iterations", "iterations": [-2, None]}

    budget = 1000
    out = tmp_path / "budget.hdf5"
    assert (
        main(
            [
                "export",
                str(tiny_pretrain.path),
                "--format",
                "hdf5",
                "--budget",
                str(budget),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    chosen = load(out, measures=True)
    assert len(chosen) == budget and validate(out).ok
    # Greedy coverage beats the same number of rows taken from the start of the run.
    first = load(tiny_pretrain.path, measures=True)
    head = first.select(slice(0, budget))
    from myriad.datasets.measures import measure_rows

    head_cov = measure_rows(head.rows(), head.spec)["union"]["coverage"]
    assert chosen.metadata["measures"]["union"]["coverage"] > head_cov
    # Every exported episode is an episode of the source, in the source's order.
    src_eps = {tuple(full.observations[a]) for a in np.r_[0, full.episode_ends()[:-1]]}
    starts = np.r_[0, chosen.episode_ends()[:-1]]
    assert all(tuple(chosen.observations[a]) in src_eps for a in starts)


def test_export_final_population(tiny_pretrain, tmp_path):
    out = tmp_path / "final.hdf5"
    args = ["export", str(tiny_pretrain.path), "--format", "hdf5", "--final-population", "2000"]
    assert main([*args, "--out", str(out)]) == 0
    data = load(out)
    assert len(data) == 2000 and validate(out).ok
    assert np.abs(data.actions).max() <= 1.0
    assert data.metadata["selection"]["rule"] == "final_population"
    # The members take turns env by env: equal shares of the episodes.
    counts = np.bincount(data.member[data.episode_ends() - 1], minlength=4)
    assert counts.max() - counts.min() <= 1
    again = tmp_path / "again.hdf5"
    assert main([*args, "--out", str(again)]) == 0
    np.testing.assert_array_equal(load(again).observations, data.observations)
    other = tmp_path / "other.hdf5"
    assert main([*args, "--seed", "1", "--out", str(other)]) == 0
    assert not np.array_equal(load(other).actions, data.actions)


def test_export_selection_errors_are_one_line(tiny_pretrain, tmp_path, capsys):
    run = str(tiny_pretrain.path)
    bad = [
        (["--final-population", "10", "--budget", "10"], "does not combine"),
        (["--iterations", "7:9"], "select no iteration"),
        (["--iterations", "a:b"], "--iterations takes START:STOP"),
    ]
    for extra, message in bad:
        code = main(["export", run, "--format", "hdf5", "--out", str(tmp_path / "x.hdf5"), *extra])
        err = capsys.readouterr().err.strip().splitlines()
        assert code != 0 and len(err) == 1 and message in err[0], (extra, err)
    # A dataset without per-iteration counts (an export of a selection) says so.
    sub = tmp_path / "sub.hdf5"
    assert main(["export", run, "--format", "hdf5", "--members", "0", "--out", str(sub)]) == 0
    capsys.readouterr()
    code = main(
        [
            "export",
            str(sub),
            "--format",
            "hdf5",
            "--iterations",
            "0:1",
            "--out",
            str(tmp_path / "y.hdf5"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and len(err) == 1 and "iteration_rows" in err[0]
