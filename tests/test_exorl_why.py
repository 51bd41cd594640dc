"""benchmarks/exorl_why.py's measures (member overlap, start-cell exits, still transitions, member
cells) against brute-force loops, and benchmarks/exorl.py's whole-run source against the rows of
the run it draws from."""

from __future__ import annotations

import importlib.util
import itertools
import math
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _module(name: str):
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def why():
    return _module("exorl_why")


@pytest.mark.parametrize("members", [1, 2, 5])
def test_overlap_matches_set_arithmetic(why, members: int) -> None:
    rng = np.random.default_rng(members)
    cells = {m: rng.random(40) < rng.uniform(0.1, 0.7) for m in range(members)}
    sets = {m: set(np.nonzero(c)[0].tolist()) for m, c in cells.items()}
    got = why.overlap(cells)
    pairs = list(itertools.combinations(sets, 2))
    jac = [len(sets[a] & sets[b]) / max(len(sets[a] | sets[b]), 1) for a, b in pairs]
    covered = set().union(*sets.values())
    counts = {c: sum(c in s for s in sets.values()) for c in covered}
    if pairs:
        assert got["mean_pairwise_jaccard"] == pytest.approx(sum(jac) / len(jac))
    else:
        assert got["mean_pairwise_jaccard"] is None
    assert got["single_member_share"] == pytest.approx(
        sum(n == 1 for n in counts.values()) / len(covered)
    )
    assert got["members_per_cell"] == pytest.approx(sum(counts.values()) / len(covered))


def test_start_exits_match_a_row_by_row_count(why) -> None:
    rng = np.random.default_rng(0)
    n, start = 5000, (1, 4)
    # States around the start cell, steps of up to one cell: every direction, and staying.
    pos = np.array(start, float) + rng.uniform(-0.5, 1.5, (n, 2))
    next_pos = pos + rng.uniform(-0.9, 0.9, (n, 2))
    member = rng.integers(0, 3, n)
    got = why.start_exits(pos, next_pos, member, start)
    names = {(0, 1): "north", (1, 0): "east", (0, -1): "south", (-1, 0): "west"}
    inside = right = 0
    exits = dict.fromkeys(names.values(), 0)
    exits_right = dict.fromkeys(names.values(), 0)
    north_members = dict.fromkeys(range(3), 0)
    for (x, y), (x2, y2), m in zip(pos, next_pos, member):
        if (math.floor(x), math.floor(y)) != start:
            continue
        inside += 1
        is_right = x >= start[0] + 0.5
        right += is_right
        step = (math.floor(x2) - start[0], math.floor(y2) - start[1])
        if step in names:
            exits[names[step]] += 1
            exits_right[names[step]] += is_right
            north_members[int(m)] += names[step] == "north"
    assert got["in_start_cell"] == inside > 0
    assert got["exits"] == exits and min(exits.values()) > 0
    assert got["north_share"] == pytest.approx(exits["north"] / sum(exits.values()))
    assert got["right_half"] == {
        "in_start_cell": right,
        "exits": exits_right,
        "north_share": pytest.approx(exits_right["north"] / sum(exits_right.values())),
    }
    assert got["north_exits_per_member"] == north_members


def test_still_share_and_member_cells_match_loops(why) -> None:
    rng = np.random.default_rng(1)
    n = 3000
    pos = rng.uniform(0, 3, (n, 2))
    next_pos = pos + rng.normal(0, 0.05, (n, 2))
    still = sum(math.hypot(*(b - a)) < 0.05 for a, b in zip(pos, next_pos)) / n
    assert why.still_share(pos, next_pos) == pytest.approx(still)

    # Features inside and outside a 21 x 9 grid of unit cells, some cells unreachable.
    features = rng.uniform(-1, 22, (n, 2)).astype(np.float32)
    features[:, 1] = rng.uniform(-1, 10, n)
    member = rng.integers(0, 4, n)
    reachable = rng.random((21, 9)) < 0.8
    grid = SimpleNamespace(low=(0.0, 0.0), high=(21.0, 9.0), cells=(21, 9), reachable=reachable)
    got = why.member_cells(features, member, grid)
    for m in range(4):
        expect = np.zeros(21 * 9, bool)
        for (x, y), mm in zip(features, member):
            if mm == m and 0 <= x < 21 and 0 <= y < 9 and reachable[int(x), int(y)]:
                expect[int(x) * 9 + int(y)] = True
        assert np.array_equal(got[m], expect)


def test_whole_run_rows_are_whole_episodes_of_the_run(tmp_path: Path) -> None:
    exorl = _module("exorl")
    from myriad.datasets import D4RLWriter, load, random_policy_rows
    from myriad.envs import make

    env = make("nav-three-routes", 16, "cpu", max_episode_steps=30)
    run = tmp_path / "run"
    (run / "dataset").mkdir(parents=True)
    writer = D4RLWriter(
        run / "dataset" / "transitions.hdf5",
        env.obs_dim,
        env.action_dim,
        env.features.names,
        metadata={"env": "nav-three-routes", "env_options": {"max_episode_steps": 30}},
    )
    member = torch.arange(16, dtype=torch.int32) % 4
    for rows in random_policy_rows(env, 200, seed=0, member=member):
        writer.append(rows)
    writer.close()
    env.close()
    source = load(run / "dataset" / "transitions.hdf5")
    spec, rows = exorl.whole_run_rows(run, 1000, seed=3)
    out = tmp_path / "out.hdf5"
    w = D4RLWriter(out, spec.obs_dim, spec.action_dim, spec.feature_names, metadata=spec.metadata)
    for batch in rows:
        w.append(batch)
    w.close()
    got = load(out)
    assert len(got) == 1000
    assert got.metadata["selection"]["rule"] == "uniform_episodes"
    # Every episode of the selection is an episode of the run, in the run's order, whole but
    # for the last one drawn, which is cut to fit and ends in a timeout.
    starts = np.concatenate([[0], source.episode_ends()[:-1]])
    by_obs = {
        source.observations[s].tobytes(): (s, e) for s, e in zip(starts, source.episode_ends())
    }
    begin, firsts, cut = 0, [], 0
    for end in got.episode_ends():
        s, e = by_obs[got.observations[begin].tobytes()]
        n = end - begin
        assert np.array_equal(got.actions[begin:end], source.actions[s : s + n])
        cut += n < e - s
        if n < e - s:
            assert got.timeouts[end - 1]
        firsts.append(s)
        begin = end
    assert firsts == sorted(firsts) and cut <= 1
    assert len(set(firsts)) == len(firsts) > 20


def test_report_refuses_to_drop_the_measures_of_datasets_that_are_gone(tmp_path):
    """A report where the runs' datasets are absent would replace their measures with nothing."""
    import argparse
    import json

    report = _module("exorl_report").report
    runs = tmp_path / "runs"
    runs.mkdir()
    record = _run_record(tmp_path / "gone.hdf5", 0)
    (runs / "maze-kmyriad-td3-n100000-s0.json").write_text(json.dumps(record))
    with pytest.raises(SystemExit, match="1 of 1 runs' datasets are not on this machine"):
        report(argparse.Namespace(out=str(tmp_path)))


def _run_record(dataset: Path, seed: int, **measures) -> dict:
    """A finished exorl.py run of the maze's population data with TD3 (two goals)."""
    curve = [{"step": 100, "success_per_goal": [1.0, 0.0], "progress_per_goal": [1.0, 0.5]}]
    return {
        **dict(env="maze", learner="td3", size=100_000, source="kmyriad", seed=seed),
        **dict(run=f"maze-kmyriad-td3-n100000-s{seed}", transitions=100_000),
        **dict(dataset=str(dataset), goals=[[1.0, 1.0], [5.0, 5.0]], steps=100, curve=curve),
        **dict(success=0.5, success_per_goal=[1.0, 0.0], progress=0.75, progress_per_goal=[1, 0.5]),
        **dict(closest_cells_per_goal=[0, 3], goal_distances_from_start=[5, 50]),
        **dict(goal_reaching_transitions=[10, 0], train_s=60.0, train_cpu_s=60.0),
        "settings": {"size": 100_000},
        **measures,
    }


def _sha256(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def _measures(coverage: float) -> dict:
    """Dataset measures in the form of ``exorl_report.dataset_measures``."""
    values = {"coverage": coverage, "sa_coverage": coverage / 2, "entropy": 1.0}
    return {"union": values, "member_mean": values, "members": 1, "overlap": 1.0}


def test_recorded_measures_free_the_report_from_the_datasets(tiny_pretrain, tmp_path, capsys):
    """A run made before runs recorded their dataset measures gets them from --store-measures
    where its datasets are; then, as for a run that recorded them, the report reads them from
    the run and needs no dataset."""
    import argparse
    import json
    import shutil

    from myriad.datasets import dataset_info

    reporting = _module("exorl_report")
    dataset = tmp_path / "work" / "maze" / "seed0" / "data" / "kmyriad-n100000.hdf5"
    whole = reporting.pretraining_dataset(str(dataset), "kmyriad")
    for path in (dataset, whole):
        path.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(tiny_pretrain.path / "dataset" / "transitions.hdf5", path)
    recorded = _measures(0.5)
    runs = tmp_path / "exorl" / "runs"
    runs.mkdir(parents=True)
    for seed, record in enumerate(
        [
            _run_record(dataset, 0, dataset_sha256=_sha256(dataset)),
            _run_record(
                tmp_path / "gone.hdf5",
                1,
                dataset_measures=recorded,
                pretraining_dataset_measures=None,
            ),
        ]
    ):
        (runs / f"maze-kmyriad-td3-n100000-s{seed}.json").write_text(json.dumps(record))
    assert reporting.store_measures(runs) == 1
    assert reporting.store_measures(runs) == 0  # recorded once
    stored = json.loads((runs / "maze-kmyriad-td3-n100000-s0.json").read_text())
    info = dataset_info(str(dataset))
    assert stored["dataset_measures"]["union"]["coverage"] == info["union"]["coverage"]
    assert stored["pretraining_dataset_measures"] == stored["dataset_measures"]  # same file
    shutil.rmtree(tmp_path / "work")
    result = reporting.report(argparse.Namespace(out=str(tmp_path / "exorl")))
    cell = result["table"]["maze/td3/n100000"]["kmyriad"]
    assert cell["dataset_measures_mean"]["union"]["coverage"] == pytest.approx(
        (info["union"]["coverage"] + 0.5) / 2
    )
    capsys.readouterr()


def test_measures_are_read_only_from_the_runs_own_dataset(tiny_pretrain, tmp_path, capsys):
    """A file at a run's dataset path may be another dataset (rebuilt for the same seed): its
    measures are recorded only where it is the run's own, by the SHA-256 the run recorded, or for
    a run older than that by its transitions and goal-reaching transitions (counted here from
    the next observations); otherwise one line on stderr says why."""
    import json
    import shutil

    import h5py

    from myriad.envs.layout import Layout

    store_measures = _module("exorl_report").store_measures
    source = tiny_pretrain.path / "dataset" / "transitions.hdf5"
    dataset = tmp_path / "work" / "maze" / "seed0" / "data" / "kmyriad-n100000.hdf5"
    dataset.parent.mkdir(parents=True)
    shutil.copy(source, dataset)
    layout = Layout.load("four_rooms")
    with h5py.File(source) as f:
        scaled = f["next_observations"][:, :2]
    positions = (scaled + 1) / 2 * np.array([layout.width, layout.height])
    goals = [positions[10].tolist(), positions[-1].tolist()]
    reaching = [int((np.linalg.norm(positions - g, axis=1) <= 0.75).sum()) for g in goals]
    assert min(reaching) > 0
    record = _run_record(dataset, 0)
    record.update(goals=goals, transitions=len(positions), goal_reaching_transitions=reaching)
    record["settings"]["goal_radius"] = 0.75
    runs = tmp_path / "exorl" / "runs"
    runs.mkdir(parents=True)
    path = runs / "maze-kmyriad-td3-n100000-s0.json"

    def stored(run: dict) -> tuple[int, dict, str]:
        path.write_text(json.dumps(run))
        done = store_measures(runs)
        return done, json.loads(path.read_text()), capsys.readouterr().err

    done, after, err = stored(
        {**record, "goal_reaching_transitions": [reaching[0], 1 + reaching[1]]}
    )
    assert (done, err.count("\n")) == (0, 1) and "dataset_measures" not in after
    assert "is not this run's dataset" in err and str(reaching) in err
    done, after, err = stored(record)
    assert (done, err) == (1, "") and after["dataset_measures"]["members"] == 4
    digest = _sha256(source)
    done, after, err = stored({**record, "dataset_sha256": digest[::-1]})
    assert (done, err.count("\n")) == (0, 1) and "SHA-256" in err
    done, after, err = stored(
        {**record, "goal_reaching_transitions": [0, 0], "dataset_sha256": digest}
    )
    assert (done, err) == (1, "") and "dataset_measures" in after


def test_a_report_keeps_the_measures_of_cells_whose_seeds_it_already_reported(tmp_path, capsys):
    """Runs without recorded measures whose datasets are gone: a cell reported before with the
    same seeds keeps its measures; one seed more and the report refuses."""
    import argparse
    import json

    report = _module("exorl_report").report
    runs = tmp_path / "exorl" / "runs"
    runs.mkdir(parents=True)
    (runs / "maze-kmyriad-td3-n100000-s0.json").write_text(
        json.dumps(_run_record(tmp_path / "gone.hdf5", 0))
    )
    measures = _measures(0.7)
    before = {"seeds": [0], "dataset_measures_mean": measures}
    before["pretraining_dataset_measures_mean"] = None
    (tmp_path / "exorl.json").write_text(
        json.dumps({"table": {"maze/td3/n100000": {"kmyriad": before}}})
    )
    result = report(argparse.Namespace(out=str(tmp_path / "exorl")))
    assert result["table"]["maze/td3/n100000"]["kmyriad"]["dataset_measures_mean"] == measures
    (runs / "maze-kmyriad-td3-n100000-s1.json").write_text(
        json.dumps(_run_record(tmp_path / "gone.hdf5", 1))
    )
    with pytest.raises(SystemExit, match="2 of 2 runs' datasets are not on this machine"):
        report(argparse.Namespace(out=str(tmp_path / "exorl")))
    capsys.readouterr()


def test_store_measures_takes_a_gone_datasets_measures_from_its_seeds_own_cell(tmp_path):
    """A run whose dataset is gone gets its measures from the last report only where its cell
    held that seed alone (the cell's mean is then that dataset's measures)."""
    import json

    store_measures = _module("exorl_report").store_measures
    runs = tmp_path / "exorl" / "runs"
    runs.mkdir(parents=True)
    for seed in (0, 1):
        (runs / f"maze-kmyriad-td3-n100000-s{seed}.json").write_text(
            json.dumps(_run_record(tmp_path / "gone.hdf5", seed))
        )
    alone = {"seeds": [0], "dataset_measures_mean": _measures(0.7)}
    alone["pretraining_dataset_measures_mean"] = _measures(0.9)
    (tmp_path / "exorl.json").write_text(
        json.dumps({"table": {"maze/td3/n100000": {"kmyriad": alone}}})
    )
    assert store_measures(runs) == 1
    s0 = json.loads((runs / "maze-kmyriad-td3-n100000-s0.json").read_text())
    assert s0["dataset_measures"] == _measures(0.7)
    assert s0["pretraining_dataset_measures"] == _measures(0.9)
    assert "dataset_measures" not in json.loads(
        (runs / "maze-kmyriad-td3-n100000-s1.json").read_text()
    )
    # A cell of two seeds holds their mean, no run's own measures.
    alone["seeds"] = [0, 1]
    (tmp_path / "exorl.json").write_text(
        json.dumps({"table": {"maze/td3/n100000": {"kmyriad": alone}}})
    )
    assert store_measures(runs) == 0


def test_remedies_are_paired_by_seed_with_the_populations_runs(capsys):
    """Each remedy with two seeds or more, against K-Myriad's run of the same env, learner, size
    and seed: differences, counts and the sign test written out by hand."""
    remedies = _module("exorl_report").remedies

    def run(source: str, seed: int, success: float) -> dict:
        return dict(
            env="maze", learner="td3", size=100_000, source=source, seed=seed, success=success
        )

    population = [run("kmyriad", s, v) for s, v in enumerate([0.5, 0.6, 0.7, 0.8])]
    others = [run("single", s, 1.0) for s in range(4)]  # not K-Myriad: never paired
    remedy = [run("kmyriad_beta0.5", s, v) for s, v in [(0, 0.9), (1, 0.9), (3, 0.8), (5, 0.1)]]
    lone = [run("kmyriad_m16", 0, 1.0)]  # one seed: left out
    out = remedies(population + others + remedy + lone, population + others)
    cell = out["maze/td3/n100000"]
    assert list(cell) == ["kmyriad_beta0.5"]
    r = cell["kmyriad_beta0.5"]
    assert r["seeds"] == [0, 1, 3, 5] and r["values"] == [0.9, 0.9, 0.8, 0.1]
    assert r["kmyriad_same_seeds"] == [0.5, 0.6, 0.8]  # seed 5 has no population run
    assert r["difference_to_kmyriad"] == pytest.approx([0.4, 0.3, 0.0])
    assert (r["higher_than_kmyriad"], r["lower_than_kmyriad"]) == (2, 0)
    assert r["sign_test_p"] == pytest.approx(2 * 0.5**2)  # two of two, two-sided
    assert r["mean"] == pytest.approx(np.mean([0.9, 0.9, 0.8, 0.1]))
    capsys.readouterr()


def test_plan_runs_the_size_sweep_for_every_seed_once() -> None:
    """Every seed gets the dataset-size sweep (TD3, maze) once, each run once in the plan."""
    exorl = _module("exorl")
    args = exorl.parse_args(["--seeds", "5", "--sizes", "25000", "400000"])
    jobs = exorl.plan(args)
    ids = [exorl.run_id(**job) for job in jobs]
    assert len(ids) == len(set(ids))
    swept = {(j["seed"], j["size"], j["source"]) for j in jobs if j["size"] != args.size}
    assert swept == {
        (seed, size, source)
        for seed in range(5)
        for size in (25000, 400000)
        for source in args.sources
    }
    assert all(j["learner"] == "td3" and j["env"] == "maze" for j in jobs if j["size"] != args.size)
