"""The torch navigation suite: solid walls at any speed, tasks, seeding, bad input."""

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from myriad.envs import ActionError, make
from myriad.envs.layout import Layout
from myriad.envs.nav import PointNavEnv, spread_goal_cells, sweep


def _cells(pos: torch.Tensor) -> torch.Tensor:
    return pos.floor().long()


@st.composite
def layouts(draw: st.DrawFn) -> Layout:
    """Random maps, walls anywhere (possibly disconnected regions), one start cell."""
    h = draw(st.integers(3, 9))
    w = draw(st.integers(3, 9))
    walls = draw(st.lists(st.booleans(), min_size=h * w, max_size=h * w))
    grid = np.array(walls, dtype=bool).reshape(h, w)
    r, c = draw(st.integers(0, h - 1)), draw(st.integers(0, w - 1))
    grid[r, c] = False
    rows = ["".join("#" if grid[i, j] else "." for j in range(w)) for i in range(h)]
    rows[r] = rows[r][:c] + "S" + rows[r][c + 1 :]
    return Layout.from_text("\n".join(rows))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    layout=layouts(),
    speed=st.floats(0.05, 5.0),
    control=st.sampled_from(["velocity", "force"]),
    seed=st.integers(0, 2**16),
)
def test_walls_are_solid_at_any_speed(layout: Layout, speed: float, control: str, seed: int):
    """No position is ever inside a wall, and no agent leaves the region it started in: a wall
    crossed in one step would put it in another connected component."""
    env = PointNavEnv(16, layout=layout.text(), max_speed=speed, control=control, accel=speed)
    env.reset(seed=seed)
    walls = env.walls
    reachable = torch.as_tensor(env.layout.reachable_xy())
    gen = torch.Generator().manual_seed(seed)
    for _ in range(40):
        # Extreme actions (saturated, sign flips) are the likeliest to tunnel.
        actions = torch.sign(torch.randn(16, 2, generator=gen)) * torch.rand(16, 1, generator=gen)
        env.step(actions)
        cell = _cells(env.pos)
        assert not walls[cell[:, 0], cell[:, 1]].any()
        assert reachable[cell[:, 0], cell[:, 1]].all()


@settings(max_examples=200, deadline=None)
@given(
    layout=layouts(),
    data=st.data(),
)
def test_sweep_segment_never_touches_a_wall(layout: Layout, data: st.DataObject):
    """The straight chord from old to new position stays in free cells (sampled densely)."""
    walls_xy = torch.as_tensor(layout.walls_xy())
    free = np.argwhere(~layout.walls_xy())
    ix, iy = free[data.draw(st.integers(0, len(free) - 1))]
    frac = data.draw(st.tuples(st.floats(0.0, 0.999), st.floats(0.0, 0.999)))
    delta = data.draw(st.tuples(st.floats(-0.9, 0.9), st.floats(-0.9, 0.9)))
    pos = torch.tensor([[ix + frac[0], iy + frac[1]]], dtype=torch.float32)
    new, _ = sweep(pos, torch.tensor([delta], dtype=torch.float32), walls_xy)
    t = torch.linspace(0, 1, 257).unsqueeze(1)
    chord = pos + t * (new - pos)
    cells = chord.floor().long()
    assert not walls_xy[cells[:, 0], cells[:, 1]].any(), (pos, delta, new)


def test_sweep_stops_at_wall_and_slides():
    walls = torch.zeros(4, 4, dtype=torch.bool)
    walls[2, :] = True  # a vertical wall at x in [2, 3]
    pos = torch.tensor([[1.5, 1.5]])
    new, blocked = sweep(pos, torch.tensor([[0.8, 0.3]]), walls)
    assert blocked.tolist() == [[True, False]]
    assert new[0, 0] == pytest.approx(2.0 - 1e-4, abs=1e-6)
    assert new[0, 1] == pytest.approx(1.8)


def test_corner_is_not_a_gap():
    """Two walls touching only at a corner block a diagonal move through that corner."""
    walls = torch.zeros(4, 4, dtype=torch.bool)
    walls[2, 1] = walls[1, 2] = True
    new, _ = sweep(torch.tensor([[1.5, 1.5]]), torch.tensor([[0.8, 0.8]]), walls)
    assert _cells(new).tolist() == [[1, 1]]


def test_seeded_runs_are_bit_identical(device: str):
    def run() -> list[torch.Tensor]:
        env = make("nav-four-rooms", 64, device, control="force")
        out = [env.reset(seed=3)]
        gen = torch.Generator().manual_seed(0)
        for _ in range(250):
            out.append(env.step((torch.rand(64, 2, generator=gen) * 2 - 1).to(device))[0])
        return out

    for a, b in zip(run(), run()):
        assert torch.equal(a, b)


def test_sparse_goal_terminates_with_reward():
    env = make("nav-empty", 2, task="sparse")
    env.reset(seed=0)
    goal = env.goal_set[0]
    env.pos = torch.stack([goal - torch.tensor([0.3, 0.0]), goal - torch.tensor([3.0, 0.0])])
    obs, reward, terminated, truncated, info = env.step(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
    assert reward.tolist() == [1.0, 0.0]
    assert terminated.tolist() == [True, False]
    assert info["success"].tolist() == [True, False]
    final_pos = goal + torch.tensor([0.2, 0.0])  # started 0.3 short, moved max_speed = 0.5
    assert torch.allclose(info["final_obs"][0, :2], final_pos / env.size * 2 - 1, atol=1e-5)
    assert not torch.equal(obs[0], info["final_obs"][0])  # env 0 was reset


def test_dense_reward_follows_geodesic_distance():
    """In the maze, a point on the far side of a wall from the goal is worse than one along the
    corridor, even when closer in straight line."""
    env = make("nav-maze", 1, task="dense")
    env.reset(seed=0)
    lay = env.layout
    goal_cell = lay.goals[0]
    dist = lay.distances_from(goal_cell)
    rewards = {}
    for cell in [(15, 13), (13, 15)]:
        x, y = lay.cell_center(*cell)
        env.pos = torch.tensor([[x, y]])
        _, r, *_ = env.step(torch.zeros(1, 2))
        rewards[cell] = r.item()
        assert r.item() == pytest.approx(-dist[cell] / env.distance_scale)
    assert (rewards[(15, 13)] > rewards[(13, 15)]) == (dist[15, 13] < dist[13, 15])


def test_geodesic_to_goal_is_the_layouts_shortest_path_at_every_reachable_cell():
    """Points anywhere inside each reachable cell of the maze, against a breadth-first search of
    the layout from the goal's cell (row, column indexing, rows counted from the top)."""
    env = make("nav-maze", 1, task="sparse", goal=(3.5, 12.5))
    lay = env.layout
    goal_row, goal_col = lay.height - 1 - 12, 3
    reference = lay.distances_from((goal_row, goal_col))
    rows, cols = np.nonzero(lay.reachable)
    gen = torch.Generator().manual_seed(0)
    offset = torch.rand(len(rows), 2, generator=gen) * 0.98 + 0.01  # inside the cell
    pos = torch.tensor(np.stack([cols, lay.height - 1 - rows], 1), dtype=torch.float32) + offset
    got = env.geodesic_to_goal(pos, torch.zeros(len(rows), dtype=torch.long))
    np.testing.assert_array_equal(got.numpy(), reference[rows, cols].astype(np.float32))
    assert got.min() == 0 and got.max() > 30  # the goal's own cell, and cells far around walls


def test_multigoal_observes_goal_and_spreads_goals():
    env = make("nav-maze", 32, task="multigoal", num_goals=6)
    obs = env.reset(seed=0)
    assert obs.shape == (32, 6)
    assert len(torch.unique(env.goal_set, dim=0)) == 6
    cells = spread_goal_cells(env.layout, 6)
    d = env.layout.distances_from(cells[0])
    assert all(d[c] > 0 for c in cells[1:])
    assert torch.allclose(obs[:, 4:], env.goal_set[env.goal_index] / env.size * 2 - 1)


def test_features_and_reachable_grid():
    env = make("nav-maze", 8)
    env.reset(seed=0)
    spec = env.features
    assert spec.names == ("x", "y")
    assert spec.reachable.shape == spec.cells == (17, 17)
    # The maze is a spanning tree of 8 x 8 cells: 64 rooms + 63 passages.
    assert int(spec.reachable.sum()) == 127
    feats = env.current_features()
    cell = _cells(feats)
    assert torch.as_tensor(spec.reachable)[cell[:, 0], cell[:, 1]].all()


def test_velocity_control_moves_at_max_speed():
    env = make("nav-empty", 1, max_speed=0.25)
    env.reset(seed=0)
    start = env.pos.clone()
    env.step(torch.tensor([[1.0, -1.0]]))
    assert torch.allclose(env.pos - start, torch.tensor([[0.25, -0.25]]))


def test_out_of_range_actions_are_clipped_not_rejected():
    env = make("nav-empty", 1, max_speed=0.25)
    env.reset(seed=0)
    start = env.pos.clone()
    env.step(torch.tensor([[7.0, 0.0]]))
    assert env.pos[0, 0] - start[0, 0] == pytest.approx(0.25)


@pytest.mark.parametrize(
    ("actions", "match"),
    [
        (torch.zeros(4, 3), r"shape \[4, 2\]"),
        (torch.zeros(2), r"shape \[4, 2\]"),
        (torch.full((4, 2), math.nan), "NaN"),
        (torch.zeros(4, 2, dtype=torch.long), "floating point"),
        (np.zeros((4, 2)), "torch.Tensor"),
    ],
)
def test_bad_actions_raise(actions, match: str):
    env = make("nav-empty", 4)
    env.reset(seed=0)
    with pytest.raises(ActionError, match=match):
        env.step(actions)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_wrong_device_names_the_device():
    env = make("nav-empty", 4, "cuda")
    env.reset(seed=0)
    with pytest.raises(ActionError, match="cuda"):
        env.step(torch.zeros(4, 2))


def test_bad_options_raise():
    with pytest.raises(ValueError, match="unknown task"):
        make("nav-empty", 1, task="nope")
    with pytest.raises(ValueError, match="unknown control"):
        make("nav-empty", 1, control="teleport")
    with pytest.raises(ValueError, match="not in a reachable floor cell"):
        make("nav-maze", 1, task="sparse", goal=(2.5, 14.5))
