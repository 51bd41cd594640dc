"""Grid coverage against a brute-force set-based reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from myriad.entropy import CoverageTracker, cell_index, coverage
from myriad.envs.base import FeatureSpec


def reference_visited(
    points: torch.Tensor,
    group: torch.Tensor,
    m: int,
    low: list[float],
    high: list[float],
    cells: list[int],
) -> list[set[tuple[int, ...]]]:
    """Python sets of the cell tuples each group visited inside the bounds, one point at a time."""
    visited: list[set[tuple[int, ...]]] = [set() for _ in range(m)]
    for x, g in zip(points.tolist(), group.tolist()):
        if not all(lo <= v <= hi for v, lo, hi in zip(x, low, high)):
            continue
        cell = tuple(
            min(c - 1, math.floor((v - lo) / (hi - lo) * c))
            for v, lo, hi, c in zip(x, low, high, cells)
        )
        visited[g].add(cell)
    return visited


def reference_coverage(
    visited: list[set[tuple[int, ...]]], cells: list[int], reachable: torch.Tensor | None
) -> tuple[float, list[float]]:
    """Union and per-group fractions of the reachable cells among ``visited`` cell sets."""
    if reachable is not None:
        visited = [{c for c in v if bool(reachable[c])} for v in visited]
    total = math.prod(cells) if reachable is None else int(reachable.sum())
    union = set().union(*visited)
    return len(union) / total, [len(v) / total for v in visited]


@pytest.mark.parametrize("use_mask", [False, True])
@pytest.mark.parametrize("dim", [1, 2, 3])
def test_matches_set_reference(dim: int, use_mask: bool) -> None:
    g = torch.Generator().manual_seed(dim)
    m = 5
    low, high = [-1.0, 0.0, 2.0][:dim], [1.0, 3.0, 2.5][:dim]
    cells = [7, 4, 5][:dim]
    lo, hi = torch.tensor(low), torch.tensor(high)
    # Some points fall outside the bounds, some exactly on them.
    points = lo + (hi - lo) * (torch.rand(400, dim, generator=g) * 1.2 - 0.1)
    points[:5] = hi
    points[5:10] = lo
    group = torch.randint(0, m, (400,), generator=g)
    group[:m] = torch.arange(m)  # no empty group
    reachable = torch.rand(*cells, generator=g) > 0.3 if use_mask else None
    cov = coverage(points, low, high, cells, group, reachable=reachable)
    visited = reference_visited(points, group, m, low, high, cells)
    union, per_group = reference_coverage(visited, cells, reachable)
    assert cov.union == pytest.approx(union)
    torch.testing.assert_close(cov.per_group, torch.tensor(per_group, dtype=torch.float64))
    assert cov.reachable_cells == (math.prod(cells) if reachable is None else int(reachable.sum()))
    assert cov.union_cells == round(union * cov.reachable_cells)


def test_equal_blocks_single_group_and_full_cover() -> None:
    # A point at every cell centre of a 4 x 3 grid, split into 2 blocks of 6.
    ii, jj = torch.meshgrid(torch.arange(4), torch.arange(3), indexing="ij")
    centres = torch.stack([(ii.flatten() + 0.5) / 4, (jj.flatten() + 0.5) / 3], dim=1)
    cov = coverage(centres, [0, 0], [1, 1], [4, 3], num_groups=2)
    assert cov.union == 1.0
    torch.testing.assert_close(cov.per_group, torch.tensor([0.5, 0.5], dtype=torch.float64))
    single = coverage(centres[:3], [0, 0], [1, 1], [4, 3])
    assert single.per_group.shape == (1,)
    assert single.union == pytest.approx(3 / 12)


def test_cell_index_row_major_and_edges() -> None:
    pts = torch.tensor([[0.0, 0.0], [1.0, 1.0], [0.99, 0.0], [0.0, 0.5], [1.5, 0.2]])
    flat, inside = cell_index(pts, [0, 0], [1, 1], [4, 2])
    reachable = torch.zeros(4, 2, dtype=torch.bool)
    assert flat[:4].tolist() == [0, 7, 6, 1]  # (0,0), (3,1) on the upper edge, (3,0), (0,1)
    assert inside.tolist() == [True, True, True, True, False]
    reachable.view(-1)[[0, 7, 6, 1, 3]] = True  # the four visited cells and (1, 1)
    cov = coverage(pts, [0, 0], [1, 1], [4, 2], reachable=reachable)
    assert cov.union == pytest.approx(4 / 5) and cov.reachable_cells == 5


def test_unreachable_visits_do_not_count() -> None:
    reachable = torch.tensor([[True, False], [True, True]])
    pts = torch.tensor([[0.1, 0.9], [0.9, 0.9]])  # cells (0,1) unreachable and (1,1)
    cov = coverage(pts, [0, 0], [1, 1], 2, reachable=reachable)
    assert cov.union_cells == 1 and cov.union == pytest.approx(1 / 3)


def test_bad_input() -> None:
    pts = torch.rand(10, 2)
    with pytest.raises(ValueError, match="have no points"):
        coverage(pts, [0, 0], [1, 1], 4, torch.tensor([0] * 5 + [2] * 5))
    with pytest.raises(ValueError, match="NaN or inf"):
        coverage(torch.tensor([[0.1, float("nan")]]), [0, 0], [1, 1], 4)
    with pytest.raises(ValueError, match="high must exceed low"):
        coverage(pts, [0, 1], [1, 1], 4)
    with pytest.raises(ValueError, match=r"shape \[2\]"):
        coverage(pts, [0], [1, 1], 4)
    with pytest.raises(ValueError, match="cells"):
        coverage(pts, [0, 0], [1, 1], [4, 0])
    with pytest.raises(ValueError, match="expected"):
        coverage(pts, [0, 0], [1, 1], 4, reachable=torch.ones(3, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match="no cell as reachable"):
        coverage(pts, [0, 0], [1, 1], 2, reachable=torch.zeros(2, 2, dtype=torch.bool))
    with pytest.raises(ValueError, match="move both to one device"):
        coverage(pts, torch.zeros(2, device="meta"), [1, 1], 4)


def test_feature_spec_coverage_uses_its_grid_and_reachable_cells() -> None:
    reachable = np.array([[True, False], [True, True]])
    spec = FeatureSpec(("x", "y"), (0.0, 0.0), (1.0, 1.0), (2, 2), reachable=reachable)
    pts = torch.tensor([[0.1, 0.9], [0.9, 0.9], [0.9, 0.1]])  # (0,1) unreachable, (1,1), (1,0)
    cov = spec.coverage(pts)
    assert cov.union_cells == 2 and cov.union == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="no coverage grid"):
        FeatureSpec(("x",), (0.0,), (1.0,)).coverage(pts[:, :1])


# ----------------------------------------------------------------------------- tracker


def rollouts(spec: FeatureSpec, count: int, t: int, e: int, seed: int) -> list[torch.Tensor]:
    """``count`` rollouts ``[T, E, p]`` over the spec's bounds, some points outside them."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = torch.tensor(spec.low), torch.tensor(spec.high)
    return [
        lo + (hi - lo) * (torch.rand(t, e, spec.dim, generator=g) * 1.2 - 0.1) for _ in range(count)
    ]


@pytest.mark.parametrize("use_mask", [False, True])
def test_tracker_matches_set_reference_over_rollouts(use_mask: bool) -> None:
    low, high, cells = [-1.0, 0.0], [1.0, 3.0], [12, 10]
    g = torch.Generator().manual_seed(7)
    reachable = torch.rand(*cells, generator=g) > 0.3 if use_mask else None
    spec = FeatureSpec(
        ("x", "y"),
        tuple(low),
        tuple(high),
        tuple(cells),
        reachable=None if reachable is None else reachable.numpy(),
    )
    m, t, e = 3, 4, 6
    member = torch.arange(e) // (e // m)  # equal env blocks, as in a population
    tracker = CoverageTracker(spec, m)
    total = math.prod(cells) if reachable is None else int(reachable.sum())
    seen: list[set[tuple[int, ...]]] = [set() for _ in range(m)]
    for features in rollouts(spec, 5, t, e, seed=1):
        out = tracker.update(features, member)
        points, rows = features.reshape(-1, 2), member.expand(t, -1).reshape(-1)
        visited = reference_visited(points, rows, m, low, high, cells)
        union, per_member = reference_coverage(visited, cells, reachable)
        for i, cells_i in enumerate(visited):
            seen[i] |= cells_i
        ever = set().union(*seen)
        if reachable is not None:
            ever = {c for c in ever if bool(reachable[c])}
        expected = {f"coverage/member_{i}": f for i, f in enumerate(per_member)}
        expected["coverage/union"] = union
        expected["coverage/member_mean"] = sum(per_member) / m
        expected["coverage/cumulative_union"] = len(ever) / total
        assert list(out) == list(expected)
        # Without a mask the cumulative fraction is a float32 mean, as pretraining logs it.
        assert out == pytest.approx(expected, rel=1e-7, abs=1e-12)
    assert 0 < out["coverage/union"] < out["coverage/cumulative_union"] < 1
    # The state: visited[i, c] for every in-bounds cell member i reached (reachable or not),
    # c the row-major flat index.
    state = tracker.state_dict()["visited"]
    assert state.dtype == torch.bool and state.shape == (m, math.prod(cells))
    assert state.device.type == "cpu"
    for i in range(m):
        assert {int(c) for c in torch.nonzero(state[i]).flatten()} == {
            a * cells[1] + b for a, b in seen[i]
        }


def test_tracker_state_resumes_exactly() -> None:
    spec = FeatureSpec(("x", "y"), (0.0, 0.0), (1.0, 1.0), (8, 8))
    member = torch.arange(8) // 4
    data = rollouts(spec, 4, 3, 8, seed=2)
    straight = CoverageTracker(spec, 2)
    first = CoverageTracker(spec, 2)
    for features in data[:2]:
        straight.update(features, member)
        first.update(features, member)
    resumed = CoverageTracker(spec, 2)
    resumed.load_state_dict(first.state_dict())
    for features in data[2:]:
        assert resumed.update(features, member) == straight.update(features, member)
    with pytest.raises(ValueError, match=r"same env and population\.size"):
        CoverageTracker(spec, 3).load_state_dict(first.state_dict())


def test_tracker_without_grid_reports_nothing() -> None:
    spec = FeatureSpec(("x",), (0.0,), (1.0,))
    tracker = CoverageTracker(spec, 2)
    assert tracker.update(torch.rand(3, 4, 1), torch.tensor([0, 0, 1, 1])) == {}
    assert tracker.state_dict()["visited"].shape == (2, 1)
    with pytest.raises(ValueError, match="no coverage grid"):
        tracker.coverage(torch.rand(4, 1), torch.tensor([0, 0, 1, 1]))
