"""Layouts as data: parsing, reachability, and errors that name the cell."""

import pytest

from myriad.envs.layout import Layout, LayoutError, builtin_layouts


def test_builtin_layouts_parse():
    assert {"empty", "two_rooms", "four_rooms", "maze", "u_maze"} <= set(builtin_layouts())
    for name in builtin_layouts():
        lay = Layout.load(name)
        assert lay.reachable[lay.starts[0]]
        assert all(lay.reachable[g] for g in lay.goals)


def test_maze_is_at_least_8_by_8_cells_and_goal_is_far():
    lay = Layout.load("maze")
    assert lay.height >= 17 and lay.width >= 17
    dist = lay.distances_from(lay.starts[0])
    assert dist[lay.goals[0]] >= 0.5 * dist.max()


def test_border_is_added_when_missing():
    lay = Layout.from_text("S..\n...")
    assert lay.walls.shape == (4, 5)
    assert lay.walls[0].all() and lay.walls[:, 0].all()
    assert lay.starts == ((1, 1),)


def test_layout_from_file(tmp_path):
    path = tmp_path / "corridor.txt"
    path.write_text("#####\n#S.G#\n#####\n")
    lay = Layout.load(str(path))
    assert lay.name == "corridor" and lay.goals == ((1, 3),)


def test_no_start_cell_is_an_error():
    with pytest.raises(LayoutError, match="no start cell"):
        Layout.from_text("#####\n#..G#\n#####")


def test_unreachable_goal_names_the_cell():
    with pytest.raises(LayoutError, match="goal cell at row 1, col 4"):
        Layout.from_text("######\n#S.#G#\n######")


def test_bad_character_and_ragged_rows():
    with pytest.raises(LayoutError, match="unknown character 'x' at row 1, col 2"):
        Layout.from_text("####\n#Sx#\n####")
    with pytest.raises(LayoutError, match="row 1 has 3 cells"):
        Layout.from_text("####\n#S.\n####")


def test_unknown_layout_lists_builtins():
    with pytest.raises(LayoutError, match="maze"):
        Layout.load("no_such_layout")


def test_big_maze_route_is_168_cells_by_an_independent_search():
    from collections import deque

    lay = Layout.load("big_maze")
    start, goal = lay.starts[0], lay.goals[0]
    # Breadth-first search over the map's floor cells, written here.
    seen, queue = {start: 0}, deque([start])
    while queue:
        r, c = queue.popleft()
        for nr, nc in ((r + 1, c), (r - 1, c), (r, c + 1), (r, c - 1)):
            if lay.reachable[nr, nc] and (nr, nc) not in seen:
                seen[(nr, nc)] = seen[(r, c)] + 1
                queue.append((nr, nc))
    assert seen[goal] == 168 and len(seen) == 287
    assert lay.distances_from(start)[goal] == 168
