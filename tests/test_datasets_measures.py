"""Dataset measures (``myriad dataset info``, ``load(measures=True)``) against independent
computations: coverage and state-action coverage by brute force over the rows, the k-NN entropy
with scipy's k-d tree and the closed-form Kozachenko-Leonenko formula, goal-reaching transitions
with NumPy distances."""

import json
import math

import numpy as np
import pytest
import torch
from scipy.spatial import cKDTree
from scipy.special import digamma, gammaln

from myriad.cli import main
from myriad.datasets import D4RLWriter, DatasetSpec, TransitionData, dataset_info, load
from myriad.datasets.episodes import random_policy_rows
from myriad.envs import make

NAV_OPTIONS = {"max_episode_steps": 40, "max_speed": 0.85}
GOAL = (3.5, 13.5)  # near the maze's start, so random actions reach it


@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """Random actions in nav-maze, two members, written as a D4RL file."""
    env = make("nav-maze", 12, "cpu", **NAV_OPTIONS)
    member = torch.arange(12, dtype=torch.int32) % 2
    parts = list(random_policy_rows(env, 120, seed=3, member=member))
    grid = env.features
    env.close()
    rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    spec = DatasetSpec(4, 2, ("x", "y"), {"env": "nav-maze", "env_options": NAV_OPTIONS})
    path = tmp_path_factory.mktemp("measures") / "d.hdf5"
    w = D4RLWriter(path, 4, 2, ("x", "y"), metadata=spec.metadata)
    w.append(rows)
    w.close()
    return path, TransitionData.from_rows(rows, spec), grid


def brute_cells(features, grid):
    """Row-major flat cell of each point inside the bounds (None outside), one at a time."""
    out = []
    for point in features:
        ijk = []
        for d, v in enumerate(point):
            lo, hi, n = grid.low[d], grid.high[d], grid.cells[d]
            if not lo <= v <= hi:
                ijk = None
                break
            ijk.append(min(max(math.floor((v - lo) / (hi - lo) * n), 0), n - 1))
        out.append(None if ijk is None else ijk[0] * grid.cells[1] + ijk[1])
    return out


def reference(data, grid, goal, bins=4, k=10):
    """Every measure computed row by row, per member and union (k-NN distances floored at
    1e-3, the measure's resolution)."""
    reach = grid.reachable.reshape(-1)
    cells = brute_cells(data.features.astype(np.float64), grid)
    size = np.array([17.0, 17.0])  # the maze's width and height
    result = {}
    for name, sel in [(0, data.member == 0), (1, data.member == 1), ("union", slice(None))]:
        idx = np.arange(len(data))[sel]
        visited, pairs = set(), set()
        for i in idx:
            c = cells[i]
            if c is None or not reach[c]:
                continue
            visited.add(c)
            a = np.clip(data.actions[i], -1, 1)
            pairs.add((c, tuple(min(int((x + 1) / 2 * bins), bins - 1) for x in a)))
        x = data.features[idx].astype(np.float64)
        r = cKDTree(x).query(x, k=k + 1)[0][:, k]  # column 0 is the point itself
        n, p = len(x), x.shape[1]
        log_cp = p / 2 * math.log(math.pi) - gammaln(p / 2 + 1)
        entropy = math.log(n) - digamma(k) + log_cp + p * np.mean(np.log(np.maximum(r, 1e-3)))
        nxt = (data.next_observations[idx, :2].astype(np.float64) + 1) / 2 * size
        goal_hits = int((np.linalg.norm(nxt - np.asarray(goal), axis=1) <= 0.5).sum())
        result[name] = {
            "coverage": len(visited) / reach.sum(),
            "sa_coverage": len(pairs) / (reach.sum() * bins**2),
            "sa_pairs": len(pairs),
            "entropy": entropy,
            "goal_transitions": goal_hits,
        }
    return result


def test_info_measures_match_independent_computation(dataset):
    path, data, grid = dataset
    info = dataset_info(path, chunk_rows=37, goal=GOAL, knn_samples=len(data) + 1)
    ref = reference(data, grid, GOAL)
    assert ref["union"]["goal_transitions"] > 0  # the check is not vacuous
    got = {0: info["members"][0], 1: info["members"][1], "union": info["union"]}
    for name in ref:
        for key in ("coverage", "sa_coverage", "entropy"):
            assert got[name][key] == pytest.approx(ref[name][key], rel=1e-6), (name, key)
        assert got[name]["sa_pairs"] == ref[name]["sa_pairs"]
        assert got[name]["goal_transitions"] == ref[name]["goal_transitions"]
    assert info["coverage_union"] == info["union"]["coverage"]


def test_entropy_sample_is_uniform_subset_and_chunking_free(dataset):
    path, data, _ = dataset
    a = dataset_info(path, chunk_rows=50, knn_samples=500)
    b = dataset_info(path, chunk_rows=1000, knn_samples=500)
    assert a["union"] == b["union"] and a["members"] == b["members"]
    assert a["union"]["entropy_samples"] == 500
    # The sample is the 500 rows of smallest key; its entropy is the scipy one of those rows.
    from myriad.datasets.measures import splitmix64

    keys = splitmix64(np.arange(len(data), dtype=np.uint64))
    rows = np.argsort(keys)[:500]
    x = data.features[rows].astype(np.float64)
    r = cKDTree(x).query(x, k=11)[0][:, 10]
    ref = math.log(500) - digamma(10) + math.log(math.pi) + 2 * np.mean(np.log(np.maximum(r, 1e-3)))
    assert a["union"]["entropy"] == pytest.approx(ref, rel=1e-6)


def test_load_reports_the_same_measures(dataset):
    path, _, _ = dataset
    data = load(path, measures=True, goal=GOAL)
    info = dataset_info(path, goal=GOAL)
    measures = data.metadata["measures"]
    assert measures["union"] == info["union"]
    assert measures["members"][1] == {
        k: v for k, v in info["members"][1].items() if k not in ("steps", "episodes")
    }


def test_info_cli_goal(dataset, capsys):
    path, data, grid = dataset
    assert main(["dataset", "info", str(path), "--goal", "3.5,13.5", "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert (
        info["union"]["goal_transitions"]
        == reference(data, grid, GOAL)["union"]["goal_transitions"]
    )
    assert main(["dataset", "info", str(path), "--goal", "3.5,13.5"]) == 0
    text = capsys.readouterr().out
    assert "state-action" in text and "goal" in text and "entropy" in text
    assert main(["dataset", "info", str(path), "--goal", "3.5"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--goal takes X,Y" in err[0]
